"""llama-server's saved slots, planned: where the agent's conversation is saved on every stop,
the budget the slots folder is kept within, and what it holds now (for ``plan``).

The rule is the Lucebox engine's disk prefix cache's (:func:`prefixstore.budget_bytes`: a
quarter of the free disk, what the folder holds counting as free, at most 64 GiB); the trim
itself runs before each start (:mod:`lucebox.engine.run.prefixdisk`).
"""

from __future__ import annotations

from pathlib import Path

from lucebox.engine.core import prefixstore, slotstore
from lucebox.engine.core.units import GIB


def slots_budget_bytes(root: Path) -> int:
    """The slots folder's share of its disk (what it holds counts as free)."""
    return prefixstore.budget_bytes(prefixstore.free_bytes(root) + slotstore.held_bytes(root))


def slots_reason(root: Path, budget_bytes: int, kept: slotstore.SlotStoreUsage) -> str:
    """What ``plan`` says of the saved slots."""
    held = (
        f"{kept.conversations} conversations saved now ({kept.tokens} tokens, "
        f"{kept.bytes / GIB:.1f} GiB)"
        if kept.conversations
        else "none saved yet"
    )
    return (
        f"{root}: the agent's conversation saved on every stop and restored on the next start "
        f"of the same model file, context, KV types and engine build; up to "
        f"{budget_bytes / GIB:.0f} GiB (a quarter of the free disk, at most "
        f"{prefixstore.BUDGET_CAP_BYTES // GIB} GiB), the least recently saved dropped first; "
        f"{held}"
    )


def saved_slots_reason(root: Path) -> str:
    """:func:`slots_reason` for the folder as it is on disk."""
    return slots_reason(root, slots_budget_bytes(root), slotstore.usage(root))
