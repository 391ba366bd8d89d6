"""The prompt states an engine keeps on disk, around its starts, and what they hold for
``status``: the Lucebox engine's disk prefix cache, llama-server's saved slots.

Before each start of the Lucebox engine the launch's folder gets its record (what its states
are valid for) and is marked used; the other folders are dropped, least recently used first,
until the whole store fits the planned budget (the engine evicts only within the folder it
serves). Before each start of llama-server with saved slots, the slots other than the
launch's own are dropped, least recently saved first, until the slots folder fits the same
share of its disk (:func:`prefixstore.budget_bytes`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from lucebox.engine.core import prefixstore, slotstore
from lucebox.engine.core.units import MIB
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.savedslots import slots_budget_bytes
from lucebox.engine.run.sample import CacheStatus
from lucebox.engine.run.slots import SlotKey

SAVING_STOP_S = 35.0
"""After SIGTERM the engine writes its tracked prompts to the disk cache (``HttpServer``'s
shutdown save: several GiB for a large model's long conversations) before it exits: it gets
this long before SIGKILL, inside the 45 s `lucebox down` waits."""


def stop_timeout_s(launch: ServerLaunch, default_s: float) -> float:
    """How long the engine may take to exit after SIGTERM."""
    disk = launch.lucebox.disk_cache if launch.lucebox is not None else None
    return SAVING_STOP_S if disk is not None and disk.folder is not None else default_s


@dataclass(frozen=True)
class DiskCacheStatus:
    """What the disk prefix cache of the running launch keeps."""

    folder: str
    entries: int
    bytes: int
    budget_bytes: int


def before_start(launch: ServerLaunch) -> list[Path]:
    """Ready the launch's folder and trim the store to its budget; the folders (or slots)
    dropped."""
    if launch.slot_save_path is not None:
        return _trim_slots(launch, Path(launch.slot_save_path))
    disk = launch.lucebox.disk_cache if launch.lucebox is not None else None
    if disk is None or disk.folder is None or disk.key is None:
        return []
    folder = Path(disk.folder)
    try:
        prefixstore.prepare(folder, disk.key)
    except OSError:
        return []  # the engine makes the folder itself; only the record and recency are lost
    return prefixstore.trim(folder.parent, folder, disk.budget_mib * MIB)


def _trim_slots(launch: ServerLaunch, root: Path) -> list[Path]:
    own = root / SlotKey.of(launch).file_name
    return slotstore.trim(root, own, slots_budget_bytes(root))


def _changed_ns(root: Path) -> int:
    """When a slot was last saved or dropped there: a save renames its file into the folder."""
    try:
        return root.stat().st_mtime_ns
    except OSError:
        return 0


@functools.lru_cache(maxsize=4)
def _slots_usage(root: str, changed_ns: int) -> slotstore.SlotStoreUsage:
    """What the slots folder holds, read again only once it changed: status asks every
    sample, and the folder changes on a stop or a start."""
    return slotstore.usage(Path(root))


def disk_cache_status(launch: ServerLaunch) -> DiskCacheStatus | None:
    """What the launch's folder keeps now; None when the engine has no disk cache."""
    disk = launch.lucebox.disk_cache if launch.lucebox is not None else None
    if disk is None or disk.folder is None:
        return None
    used = prefixstore.usage(Path(disk.folder))
    return DiskCacheStatus(disk.folder, used.entries, used.bytes, disk.budget_mib * MIB)


def with_disk(cache: CacheStatus, launch: ServerLaunch) -> CacheStatus:
    """``cache`` with what the launch's disk prefix cache (or the saved slots) keeps now, and
    why nothing was restored when states kept for the same model were saved by another
    launch."""
    if launch.slot_save_path is not None:
        kept = _slots_usage(launch.slot_save_path, _changed_ns(Path(launch.slot_save_path)))
        return replace(
            cache,
            disk_entries=kept.conversations,
            disk_bytes=kept.bytes,
            disk_tokens=kept.tokens,
            disk_store="slots",
        )
    disk = disk_cache_status(launch)
    if disk is None:
        return cache
    restore = cache.last_restore
    key = launch.lucebox.disk_cache.key if launch.lucebox and launch.lucebox.disk_cache else None
    if restore is None and key is not None:
        elsewhere = prefixstore.saved_elsewhere(Path(disk.folder).parent, key)
        if elsewhere is not None:
            restore = f"not restored: the states kept on disk were saved with {elsewhere}"
    return replace(
        cache,
        disk_entries=disk.entries,
        disk_bytes=disk.bytes,
        last_restore=restore,
        disk_store="prefix-cache",
    )
