"""The revisions of a stored model that no longer serve: kept after ``models update`` until
``models prune``, so ``models rollback`` is a record swap, nothing downloaded.

A model's current record stays ``<models>/records/<name>.json``; the records it replaced are
``<models>/revisions/<name>.json`` (newest first, written whole). Files shared by revisions are
stored once; prune deletes only the files no current record names.
"""

from __future__ import annotations

import json
from pathlib import Path

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.models.records import (
    ModelRecord,
    StoreError,
    files_dir,
    find_model,
    forget_states,
    list_models,
    save_record,
)


def _kept_file(paths: Paths, name: str) -> Path:
    return paths.models_dir / "revisions" / f"{name}.json"


def kept(paths: Paths, name: str) -> list[ModelRecord]:
    """The records ``name`` served before, the newest first; empty when there are none."""
    try:
        data = json.loads(_kept_file(paths, name).read_text("utf-8"))
        return [ModelRecord.from_json(r) for r in data["kept"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _write_kept(paths: Paths, name: str, records: list[ModelRecord]) -> None:
    path = _kept_file(paths, name)
    if not records:
        path.unlink(missing_ok=True)
        return
    paths.ensure(path.parent)
    write_text_atomic(path, json.dumps({"kept": [r.to_json() for r in records]}, indent=2))


def switch(paths: Paths, current: ModelRecord, new: ModelRecord) -> None:
    """``new`` serves as ``current.name`` from now on; ``current`` is kept as the way back (a
    kept copy of ``new`` itself, from an update rolled back before, is dropped)."""
    older = [r for r in kept(paths, current.name) if r.revision != new.revision]
    _write_kept(paths, current.name, [current, *older])
    save_record(paths, new)
    forget_states(paths, current)


def rollback(paths: Paths, name: str) -> tuple[ModelRecord, ModelRecord]:
    """Back to the revision the last switch replaced; returns (from, to). The one left is kept,
    so a second rollback undoes the first."""
    current = find_model(paths, name)
    older = kept(paths, name)
    if not older:
        raise UsageError(
            f"no earlier revision of {name} is kept",
            hint="`lucebox models update NAME` keeps the revision it replaces until "
            "`lucebox models prune`",
        )
    back = older[0]
    gone = [f.path for f in back.files if not Path(f.path).exists()]
    if gone:
        raise StoreError(
            f"revision {back.revision or '?'} of {name} lost its files: {', '.join(gone)}",
            hint=f"`lucebox models prune {name}` forgets it",
        )
    _write_kept(paths, name, [current, *older[1:]])
    save_record(paths, back)
    return current, back


def _in_use(paths: Paths) -> set[str]:
    """Every file a current record or a kept revision names."""
    records = list_models(paths)
    for record in list_models(paths):
        records += kept(paths, record.name)
    return {f.path for r in records for f in r.files}


def _delete_unused(paths: Paths, records: list[ModelRecord], in_use: set[str]) -> list[Path]:
    deleted = []
    for record in records:
        for stored in record.files:
            path = Path(stored.path)
            if stored.owned and stored.path not in in_use and path.exists():
                path.unlink()
                deleted.append(path)
                in_use.add(stored.path)
    for path in deleted:
        # A revision's own folder goes once empty; the store's folders stay.
        if path.parent != files_dir(paths) and not any(path.parent.iterdir()):
            path.parent.rmdir()
    return deleted


def prune(paths: Paths, name: str | None = None) -> tuple[list[ModelRecord], list[Path]]:
    """Forget the kept revisions of ``name`` (every model when None) and delete the files
    only they named; returns the revisions forgotten and the files deleted."""
    folder = paths.models_dir / "revisions"
    names = [name] if name else sorted(p.stem for p in folder.glob("*.json"))
    forgotten = [r for n in names for r in kept(paths, n)]
    for each in names:
        _write_kept(paths, each, [])
    return forgotten, _delete_unused(paths, forgotten, _in_use(paths))


def discard(paths: Paths, candidate: ModelRecord) -> list[Path]:
    """A revision refused before it served: the files only it named are deleted."""
    return _delete_unused(paths, [candidate], _in_use(paths))
