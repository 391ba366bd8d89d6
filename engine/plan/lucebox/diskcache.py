"""The Lucebox engine's disk prefix cache, planned: its folder, budget and policy (the rule
is pure, :func:`plan_disk_cache`; :func:`disk_cache_of` reads the disk for it).

The engine (``--kv-cache-dir``) saves prompt states to disk and finds them again after a
restart (reference/lucebox-engine-contract.md; ``disk_prefix_cache.cpp`` at the pins). Its
policy ``auto`` looks a prompt up at every chat boundary, longest first, when it has no
recent prompt to compare with (a restart), and saves the prefix a prompt shares with the
recent ones: the agent's growing conversation, turn after turn. ``full`` (its default) looks
up only the whole prompt and one short cold prefix, so the next turn of a conversation, which
is never the same prompt, would read everything again after a restart. The checkpoint
interval and cold prefix act only under ``full`` and are left at the engine's defaults.

The engine keeps its folder within ``--kv-cache-budget`` itself (``enforce_budget``: the
lowest of hits decayed over six hours times tokens per byte goes first, a state saved in the
last minute never), so lucebox relies on it there and trims only the other folders.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.core import prefixstore
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.plan.memory.memory import Plan

POLICY = "auto"
MIN_TOKENS = 1024
"""A shorter prompt is read again in about a second on the cards the engine serves; saving
each would spend the budget on system prompts alone."""
BUDGET_FLOOR_BYTES = 2 * GIB
"""Below this a 50K-token conversation's state (about 1 GiB at q4_0 for the 27B targets,
with the snapshot of the one before) does not fit: the cache is not passed."""


@dataclass(frozen=True)
class DiskCacheRequest:
    root: str
    """lucebox's folder of folders (``Paths.prefix_cache_dir``)."""
    key: prefixstore.PrefixKey
    """What this launch's states are valid for: its folder's name."""
    free_bytes: int
    """Free on the disk the store is on, plus what the store holds already."""
    wanted: bool = True
    """The agent cache profile (``--cache agent``)."""
    paged_attention: bool = False


@dataclass(frozen=True)
class DiskCache:
    """What the engine is passed: a folder and a budget, or None and why not."""

    folder: str | None
    budget_mib: int
    min_tokens: int
    policy: str
    reason: str
    key: prefixstore.PrefixKey | None = None


def plan_disk_cache(request: DiskCacheRequest) -> DiskCache:
    """The folder, budget and policy for this launch, or why the disk cache is off."""
    off = DiskCache(None, 0, MIN_TOKENS, "off", "")
    if not request.wanted:
        return _off(off, "off: the prompt cache is off (--cache off)")
    if request.paged_attention:
        return _off(off, "off: paged attention turns the engine's snapshots off")
    budget = prefixstore.budget_bytes(request.free_bytes)
    if budget < BUDGET_FLOOR_BYTES:
        return _off(
            off,
            f"off: a quarter of the disk's free space ({budget / GIB:.1f} GiB) is below "
            f"{BUDGET_FLOOR_BYTES // GIB} GiB",
        )
    folder = f"{request.root}/{request.key.folder_name}"
    budget_mib = budget // MIB
    reason = (
        f"{folder}, up to {budget / GIB:.1f} GiB (a quarter of the free disk, at most "
        f"{prefixstore.BUDGET_CAP_BYTES // GIB} GiB; the engine evicts within its folder by its "
        f"own score, lucebox drops other folders, least recently used first); policy {POLICY}: a "
        f"conversation's prefix at each chat boundary, from {MIN_TOKENS} tokens, found again "
        "after a restart; one folder per model file, engine build, KV type and context"
    )
    return DiskCache(folder, budget_mib, MIN_TOKENS, POLICY, reason, request.key)


def _off(off: DiskCache, why: str) -> DiskCache:
    return DiskCache(off.folder, off.budget_mib, off.min_tokens, off.policy, why)


def disk_cache_of(
    paths: Paths, model_path: str, engine_build: str, plan: Plan, *, wanted: bool
) -> DiskCache:
    """The disk prefix cache of a launch of ``model_path`` on ``engine_build`` with ``plan``:
    its folder keyed by the model file, the build, the KV types and the context; its budget
    from the disk it is on."""
    key = prefixstore.PrefixKey(
        model_path, *prefixstore.model_stamp(model_path), engine_build,
        plan.cache_type_k, plan.cache_type_v, plan.ctx,
    )  # fmt: skip
    root = paths.prefix_cache_dir
    request = DiskCacheRequest(
        str(root),
        key,
        prefixstore.free_bytes(root) + prefixstore.held_bytes(root),
        wanted=wanted,
        # lucebox does not pass --paged-attention, which would turn the cache off.
        paged_attention=False,
    )
    return plan_disk_cache(request)
