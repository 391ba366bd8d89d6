"""lucebox's folders of the Lucebox engine's disk prefix cache (``--kv-cache-dir``).

The engine keys its files by the model file (path, size, modification time), the context and
the chat template, and by the tensors' shapes and types, but not by its own build: a state
another build saved would be read as this one's. lucebox gives each (model file, engine
build, K and V types, context) a folder of its own, so such a state is never in the folder
the engine reads. A record beside the engine's files says what the folder is for, so removing
or updating a model removes its folders, and the store is kept within its budget by
recency (the engine evicts within the folder it serves; lucebox drops whole other folders,
least recently used first, before a start).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.units import GIB

DISK_SHARE = 4
"""A store may take a quarter of the disk it is on (what it holds counts as free)."""
BUDGET_CAP_BYTES = 64 * GIB

RECORD_NAME = "lucebox.json"
"""What a folder is for; the engine reads only its subfolders, so this file is not its."""
SAVED_SUFFIX = ".dkv"
"""The engine's saved states (``<folder>/<layout>/<tokens' hash>.dkv``)."""


@dataclass(frozen=True)
class PrefixKey:
    """What the states in one folder are valid for."""

    model_path: str
    model_bytes: int
    model_mtime_ns: int
    engine_build: str
    cache_type_k: str
    cache_type_v: str
    ctx: int

    @property
    def folder_name(self) -> str:
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(self.model_path).stem)[:48]
        return f"{stem}-{digest[:16]}"


@dataclass(frozen=True)
class StoreUsage:
    """What the engine keeps in one folder."""

    entries: int
    bytes: int


def build_of(server_path: str) -> str:
    """The engine binary at ``server_path`` as a build: a rebuild in place changes it."""
    try:
        found = Path(server_path).resolve()
        stat = found.stat()
    except OSError:
        return server_path
    return f"{found}@{stat.st_size}:{stat.st_mtime_ns}"


def model_stamp(model_path: str) -> tuple[int, int]:
    """The model file's size and modification time (0, 0 for a file not there yet)."""
    try:
        stat = os.stat(model_path)
    except OSError:
        return 0, 0
    return stat.st_size, stat.st_mtime_ns


def prepare(folder: Path, key: PrefixKey) -> None:
    """Create the folder with its record and mark it used now (its recency)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / RECORD_NAME, json.dumps(asdict(key)), durable=False)
    os.utime(folder)


def usage(folder: Path) -> StoreUsage:
    """The saved states in ``folder`` and their bytes (none for a missing folder)."""
    entries = size = 0
    for saved in folder.glob(f"*/*{SAVED_SUFFIX}"):
        with contextlib.suppress(OSError):
            size += saved.stat().st_size
            entries += 1
    return StoreUsage(entries, size)


def trim(root: Path, keep: Path, budget_bytes: int) -> list[Path]:
    """Remove whole folders other than ``keep``, least recently used first, until the store
    holds at most ``budget_bytes``; the folders removed."""
    folders = [f for f in _folders(root) if f != keep]
    held = {f: _bytes_in(f) for f in folders}
    total = sum(held.values()) + _bytes_in(keep)
    removed: list[Path] = []
    for folder in sorted(folders, key=_last_used):
        if total <= budget_bytes:
            break
        shutil.rmtree(folder, ignore_errors=True)
        total -= held[folder]
        removed.append(folder)
    return removed


def budget_bytes(free_and_held_bytes: int) -> int:
    """A store's share of its disk, given what is free there plus what the store holds: in
    whole GiB, so a plan made again a few files later passes the engine the same flags."""
    return min(BUDGET_CAP_BYTES, free_and_held_bytes // DISK_SHARE // GIB * GIB)


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk ``folder`` is (or will be) on."""
    for found in (folder, *folder.parents):
        if found.exists():
            return shutil.disk_usage(found).free
    return 0


def held_bytes(root: Path) -> int:
    """Every byte the store holds now."""
    return sum(_bytes_in(f) for f in _folders(root))


def forget_model(root: Path, model_path: Path) -> list[Path]:
    """Remove the folders of states saved for ``model_path`` (removed or updated: a state
    of the old file is never valid for the new one); the folders removed."""
    wanted = str(model_path.resolve())
    removed = []
    for folder in _folders(root):
        try:
            record = json.loads((folder / RECORD_NAME).read_text("utf-8"))
            saved_for = str(Path(record["model_path"]).resolve())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if saved_for == wanted:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


KEY_WORDS = {
    "engine_build": "another engine build",
    "cache_type_k": "another KV type",
    "cache_type_v": "another KV type",
    "ctx": "another context",
    "model_bytes": "another version of the model file",
    "model_mtime_ns": "another version of the model file",
}


def saved_elsewhere(root: Path, key: PrefixKey) -> str | None:
    """Why states kept for the same model file are not this launch's ("another engine
    build, another KV type"); None when no other folder holds any for it."""
    wanted = asdict(key)
    found: list[str] = []
    for folder in _folders(root):
        try:
            record = json.loads((folder / RECORD_NAME).read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("model_path") != key.model_path:
            continue
        if record == wanted or not usage(folder).entries:
            continue
        found += [words for name, words in KEY_WORDS.items() if record.get(name) != wanted[name]]
    return ", ".join(dict.fromkeys(found)) or None


def _folders(root: Path) -> list[Path]:
    try:
        return [f for f in root.iterdir() if f.is_dir()]
    except OSError:
        return []


def _bytes_in(folder: Path) -> int:
    total = 0
    for file in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if file.is_file():
                total += file.stat().st_size
    return total


def _last_used(folder: Path) -> float:
    """When a start last used it, or the engine last saved in it (its layout folders change
    with every save)."""
    times = [0.0]
    for found in (folder, *folder.iterdir()):
        with contextlib.suppress(OSError):
            times.append(found.stat().st_mtime)
    return max(times)
