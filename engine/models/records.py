"""The model store's records: one small record per pulled model and where its files live;
listing, finding, re-verifying and removing them."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lucebox.engine.core import prefixstore, slotstore
from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import FetchError, HashMismatchError
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.models import ondisk
from lucebox.engine.models.modelsource import ModelSource, parse_source


class StoreError(FetchError):
    """A model cannot be pulled, found or removed."""


@dataclass(frozen=True)
class StoredFile:
    path: str
    size_bytes: int
    sha256: str
    owned: bool
    """True when the store made this file and may delete it."""


@dataclass(frozen=True)
class ModelRecord:
    """One model in the store (``<data>/models/records/<name>.json``)."""

    name: str
    source: str
    kind: str
    files: tuple[StoredFile, ...]
    sha256_source: str
    """Where the expected hash came from: hub-lfs, hf-cache-blob, pypi-sha256sums, local."""
    revision: str | None
    verified_at: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def main_path(self) -> Path:
        return Path(self.files[0].path)

    @functools.cached_property
    def model_source(self) -> ModelSource:
        """``source`` parsed, once per record (the record on disk keeps the text)."""
        return parse_source(self.source)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["size_bytes"] = self.size_bytes
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelRecord:
        return cls(
            name=data["name"],
            source=data["source"],
            kind=data["kind"],
            files=tuple(StoredFile(**f) for f in data["files"]),
            sha256_source=data["sha256_source"],
            revision=data.get("revision"),
            verified_at=data["verified_at"],
            info=dict(data.get("info") or {}),
        )


def _records_dir(paths: Paths) -> Path:
    return paths.models_dir / "records"


def files_dir(paths: Paths) -> Path:
    """The folder of the files the store downloaded or assembled (and may delete)."""
    return paths.models_dir / "files"


def repo_dir(paths: Paths, repo_id: str) -> Path:
    return files_dir(paths) / repo_id.replace("/", "--")


def stored_path(paths: Paths, source: ModelSource, file_name: str | None = None) -> Path:
    """Where the store keeps, or will keep, the (main) file of ``source``.

    ``file_name`` names a PyPI package's GGUF, known only once its wheel is read.
    """
    if source.kind == "hf":
        return repo_dir(paths, source.repo_id) / Path(source.filename).name
    if source.kind == "pypi":
        return files_dir(paths) / "pypi" / (file_name or f"{source.dist}.gguf")
    assert source.path is not None
    return source.path


def stored_file(paths: Paths, source: ModelSource) -> Path | None:
    """The file behind ``source`` when it is on disk: the path itself, or the pulled file."""
    if source.kind == "path":
        return source.path if source.path and source.path.is_file() else None
    for record in list_models(paths):
        if record.source == source.text and record.main_path.is_file():
            return record.main_path
    return None


def now_text() -> str:
    """The time a record says its files were verified (local time, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def save_record(paths: Paths, record: ModelRecord) -> None:
    folder = paths.ensure(_records_dir(paths))
    write_text_atomic(folder / f"{record.name}.json", json.dumps(record.to_json(), indent=2))


def list_models(paths: Paths) -> list[ModelRecord]:
    folder = _records_dir(paths)
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            records.append(ModelRecord.from_json(json.loads(path.read_text("utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return records


def find_model(paths: Paths, name: str) -> ModelRecord:
    for record in list_models(paths):
        if record.name == name:
            return record
    known = ", ".join(r.name for r in list_models(paths)) or "none"
    raise StoreError(f"no model named '{name}' in the store", hint=f"stored models: {known}")


def verify_model(paths: Paths, name: str) -> ModelRecord:
    """Re-hash every file of a stored model; raises ``HashMismatchError`` on a difference."""
    record = find_model(paths, name)
    for stored in record.files:
        path = Path(stored.path)
        if not path.exists():
            raise StoreError(
                f"{path} of model '{name}' is gone", hint=f"pull {record.source} again"
            )
        actual = sha256_file(path)
        if actual != stored.sha256:
            raise HashMismatchError(
                f"{path} has sha256 {actual}, but {stored.sha256} was recorded",
                hint=f"the file changed on disk: pull {record.source} again",
            )
    updated = ModelRecord(
        record.name,
        record.source,
        record.kind,
        record.files,
        record.sha256_source,
        record.revision,
        now_text(),
        record.info,
    )
    save_record(paths, updated)
    return updated


def remove_model(paths: Paths, name: str, *, delete_foreign: bool) -> list[Path]:
    """Remove a model's record and the files the store owns; returns the deleted paths.

    Files the store does not own (a local path) are deleted only with ``delete_foreign``; files
    other programs keep (the Hugging Face cache, LM Studio, Ollama) never are.
    """
    record = find_model(paths, name)
    deleted = []
    for stored in record.files:
        path = Path(stored.path)
        foreign_ok = delete_foreign and not ondisk.belongs_to_other_app(path)
        if (stored.owned or foreign_ok) and path.exists():
            path.unlink()
            deleted.append(path)
    (_records_dir(paths) / f"{record.name}.json").unlink(missing_ok=True)
    forget_states(paths, record)
    return deleted


def forget_states(paths: Paths, record: ModelRecord) -> None:
    """Drop the prompt states the engines saved on disk for ``record``'s files, the Lucebox
    engine's and llama-server's saved slots (the model is removed or replaced: they would only
    take the disk)."""
    for stored in record.files:
        prefixstore.forget_model(paths.prefix_cache_dir, Path(stored.path))
        slotstore.forget_model(paths.slots_dir, Path(stored.path))
