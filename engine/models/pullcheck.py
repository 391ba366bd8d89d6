"""The checks every pull goes through: room on disk before the first byte, and after the last
the model check, then a record, or quarantine for bytes that are bad."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from lucebox.engine.core import units
from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.models.checkresult import CheckResult
from lucebox.engine.models.guard import check_model, model_name
from lucebox.engine.models.modelsource import ModelSource
from lucebox.engine.models.records import ModelRecord, StoredFile, now_text, save_record

STRUCTURAL_CODES = {"not-gguf", "corrupt-header", "truncated", "missing-shard"}
"""Problems that mean the bytes are bad (quarantine), as opposed to a model to think about."""
DISK_MARGIN_BYTES = 512 * 2**20
"""Free space a download leaves beyond its own bytes: a full disk breaks more than lucebox."""


def _summary(result: CheckResult) -> dict[str, Any]:
    info = result.info
    if info is None:
        return {}
    return {
        "architecture": info.architecture,
        "name": info.name,
        "size_label": info.size_label,
        "file_type": info.file_type_name,
        "context_length": info.context_length,
        "has_chat_template": info.has_chat_template,
        "weights_bytes": info.weights_bytes,
        "problems": [p.code for p in result.problems],
    }


def _quarantine(paths: Paths, files: list[Path], result: CheckResult) -> None:
    folder = paths.ensure(paths.models_dir / "quarantine")
    kept = []
    for path in files:
        if path.exists():
            target = folder / f"{path.name}.{int(time.time())}"
            path.rename(target)
            kept.append(str(target))
    problems = "; ".join(
        f"{p.code}: {p.message}" for p in result.problems if p.code in STRUCTURAL_CODES
    )
    raise GuardRefusal(
        f"{Path(result.path).name} failed its check ({problems})",
        hint=f"it was moved to {', '.join(kept) or folder}; pull it again",
    )


def check_and_record(
    paths: Paths,
    source: ModelSource,
    files: list[tuple[Path, str, bool]],
    sha_source: str,
    revision: str | None,
) -> ModelRecord:
    record = checked_record(paths, source, files, sha_source, revision)
    save_record(paths, record)
    return record


def checked_record(
    paths: Paths,
    source: ModelSource,
    files: list[tuple[Path, str, bool]],
    sha_source: str,
    revision: str | None,
) -> ModelRecord:
    """The record of ``files`` once they pass the model check, not yet saved; bad bytes are
    quarantined (the owned files) and refused."""
    result = check_model(files[0][0], allow_base=True)
    if any(p.code in STRUCTURAL_CODES for p in result.problems):
        _quarantine(paths, [p for p, _, owned in files if owned], result)
    return ModelRecord(
        name=model_name(files[0][0].name),
        source=source.text,
        kind=source.kind,
        files=tuple(StoredFile(str(p), p.stat().st_size, sha, owned) for p, sha, owned in files),
        sha256_source=sha_source,
        revision=revision,
        verified_at=now_text(),
        info=_summary(result),
    )


def _size_text(size_bytes: int) -> str:
    return (
        units.gib_text(size_bytes, 2) if size_bytes >= units.GIB else units.mib_text(size_bytes, 1)
    )


def check_free_disk(folder: Path, needed_bytes: int) -> None:
    """Refuse before the first byte when ``folder``'s disk cannot hold ``needed_bytes`` more."""
    free = shutil.disk_usage(folder).free
    wanted = needed_bytes + DISK_MARGIN_BYTES
    if wanted > free:
        raise GuardRefusal(
            f"not enough disk for the download: {folder} has {_size_text(free)} free, "
            f"it needs {_size_text(wanted)} ({_size_text(needed_bytes)} still to fetch "
            f"plus {_size_text(DISK_MARGIN_BYTES)} to spare)",
            hint="free space there or point LUCEBOX_HOME to a larger disk",
        )
