"""llama-server's saved conversations on disk (``--slot-save-path``): what they hold, kept
within a budget by recency, forgotten with their model file.

Each saved slot is a file ``<alias>.slot`` with its record ``<alias>.slot.json`` beside it (what
it was saved for, its bytes and tokens: :mod:`lucebox.engine.run.slots`), in the slots folder,
or in a served set's folder under ``sets/``. A slot of a large model's long conversation takes
gigabytes, and every model and set served keeps its own: before a start the store is trimmed
to the same share of the disk as the Lucebox engine's prefix cache
(:func:`prefixstore.budget_bytes`), the least recently saved first, never the launch's own.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOT_SUFFIX = ".slot"
RECORD_SUFFIX = ".json"
SETS_FOLDER = "sets"
"""A served set's slots, one folder per set."""


@dataclass(frozen=True)
class SlotStoreUsage:
    """What the slots folder keeps: conversations, their bytes and the tokens they hold."""

    conversations: int
    bytes: int
    tokens: int


def saved_slots(root: Path) -> list[Path]:
    """Every saved slot file under ``root`` (the single models' and the sets')."""
    found = [*root.glob(f"*{SLOT_SUFFIX}"), *root.glob(f"{SETS_FOLDER}/*/*{SLOT_SUFFIX}")]
    return [slot for slot in found if slot.is_file()]


def record_of(slot: Path) -> dict[str, Any]:
    """What ``slot`` was saved for (empty when its record is missing or unreadable)."""
    try:
        record = json.loads(slot.with_name(slot.name + RECORD_SUFFIX).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def usage(root: Path) -> SlotStoreUsage:
    conversations = size = tokens = 0
    for slot in saved_slots(root):
        with contextlib.suppress(OSError):
            size += slot.stat().st_size
            conversations += 1
            held = record_of(slot).get("tokens")
            tokens += held if isinstance(held, int) else 0
    return SlotStoreUsage(conversations, size, tokens)


def held_bytes(root: Path) -> int:
    return usage(root).bytes


def trim(root: Path, keep: Path | None, budget_bytes: int) -> list[Path]:
    """Remove saved slots other than ``keep``, least recently saved first, until the store
    holds at most ``budget_bytes``; the slots removed."""
    slots = saved_slots(root)
    held = {slot: _size(slot) for slot in slots}
    total = sum(held.values())
    removed: list[Path] = []
    for slot in sorted((s for s in slots if s != keep), key=_saved_at):
        if total <= budget_bytes:
            break
        _remove(slot)
        total -= held[slot]
        removed.append(slot)
    return removed


def forget_model(root: Path, model_path: Path) -> list[Path]:
    """Remove the slots saved for ``model_path`` (removed or updated: a state of the old file
    is never valid for the new one); the slots removed."""
    wanted = str(model_path.resolve())
    removed = []
    for slot in saved_slots(root):
        saved_for = record_of(slot).get("model_path")
        if isinstance(saved_for, str) and str(Path(saved_for).resolve()) == wanted:
            _remove(slot)
            removed.append(slot)
    return removed


def _remove(slot: Path) -> None:
    with contextlib.suppress(OSError):
        slot.unlink(missing_ok=True)
        slot.with_name(slot.name + RECORD_SUFFIX).unlink(missing_ok=True)


def _size(slot: Path) -> int:
    try:
        return slot.stat().st_size
    except OSError:
        return 0


def _saved_at(slot: Path) -> float:
    try:
        return slot.stat().st_mtime
    except OSError:
        return 0.0
