"""Whether a model that fits one card of several should run there alone or be split.

A split costs speed (every token crosses the cards), so it must buy something: at least
``SPLIT_GAIN`` times the context, or a more precise KV type. Otherwise the model stays on one
card and the other cards stay free (for another model of a served set, or the desktop).
"""

from __future__ import annotations

from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.request import KV_PAIRS

SPLIT_GAIN = 1.5
"""A split must give at least this many times the context one card gives."""


def _precision(kv_type: str) -> int:
    """Higher is more precise: f16 > q8_0 > q4_0."""
    return len(KV_PAIRS) - KV_PAIRS.index(kv_type) if kv_type in KV_PAIRS else 0


def keep_alone(alone: Plan, split: Plan | None, card: str) -> tuple[bool, str]:
    """(run alone on ``card``, why): alone unless the split buys context or KV precision.

    ``split`` is None when the split plan does not fit at all.
    """
    if split is None or not split.fits:
        return True, f"fits on {card} alone: no split (the split does not fit)"
    gain = split.ctx / alone.ctx if alone.ctx else float("inf")
    better_kv = _precision(split.cache_type_k) > _precision(alone.cache_type_k)
    split_text = f"{split.ctx} tokens of {split.cache_type_k} KV split"
    alone_text = f"{alone.ctx} tokens of {alone.cache_type_k} KV on {card} alone"
    if gain >= SPLIT_GAIN:
        return False, f"split: {split_text} vs {alone_text} ({gain:.2f}x >= {SPLIT_GAIN}x)"
    if better_kv:
        return False, f"split: {split_text} vs {alone_text} (a more precise KV type)"
    return True, (
        f"fits on {card} alone: no split ({split_text} would be {gain:.2f}x the context, "
        f"under {SPLIT_GAIN}x, and no more precise KV type)"
    )
