"""The user's own client config files as they were before lucebox first changed them.

Kept once per file, the first time ``connect --write`` or ``launch`` changes it, and never
replaced by a later write, so ``--restore`` puts back the user's original (or removes a file
that did not exist) rather than the newest backup, which may already hold lucebox's settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, PathsError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.connect import backup_path, read_text

FOLDER_NAME = "client-originals"


@dataclass(frozen=True)
class Original:
    path: Path
    text: str | None
    """The file's text before lucebox; None when there was no file."""


@dataclass(frozen=True)
class Restored:
    path: Path
    removed: bool
    """The file did not exist before lucebox, so restoring removed it."""
    backup: Path | None
    """A dated copy of the file as lucebox's restore found it (later edits are kept there)."""


def _record(paths: Paths, client: str) -> Path:
    return paths.state_dir / FOLDER_NAME / f"{client}.json"


def read_originals(paths: Paths, client: str) -> list[Original]:
    try:
        data: Any = json.loads(_record(paths, client).read_text("utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read {_record(paths, client)}: {exc}",
            hint="the originals are lost; the dated .bak- files beside each config remain",
        ) from None
    items = data if isinstance(data, list) else []
    return [
        Original(Path(item["path"]), item.get("text"))
        for item in items
        if isinstance(item, dict) and isinstance(item.get("path"), str)
    ]


def _save(paths: Paths, client: str, originals: list[Original]) -> None:
    record = _record(paths, client)
    try:
        paths.ensure(record.parent)
    except PathsError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from exc
    document = [{"path": str(o.path), "text": o.text} for o in originals]
    write_text_atomic(record, json.dumps(document, indent=2) + "\n")


def keep_original(paths: Paths, client: str, path: Path, text: str | None) -> None:
    """Remember ``text`` as ``path``'s original unless an original of it is already kept."""
    originals = read_originals(paths, client)
    if any(o.path == path for o in originals):
        return
    _save(paths, client, [*originals, Original(path, text)])


def restore_originals(paths: Paths, client: str) -> list[Restored]:
    """Put every kept original of ``client`` back; the record is dropped once all are back."""
    restored = []
    for original in read_originals(paths, client):
        current = read_text(original.path)
        try:
            backup = None
            if current is not None and current != original.text:
                backup = backup_path(original.path)
                write_text_atomic(backup, current)
            if original.text is None:
                original.path.unlink(missing_ok=True)
            else:
                original.path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(original.path, original.text)
        except OSError as exc:
            raise ConfigError(f"cannot restore {original.path}: {exc.strerror}") from None
        restored.append(Restored(original.path, original.text is None, backup))
    _record(paths, client).unlink(missing_ok=True)
    return restored
