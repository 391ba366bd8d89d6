"""What a memory plan is asked for: the model, the card and the user's limits (values only, so
each step of :mod:`memory` reads them without importing the plan)."""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.modelfacts import ModelFacts

KV_PAIRS = ("f16", "q8_0", "q4_0")
"""K/V types with FlashAttention kernels in the default CUDA build (GGML_CUDA_FA_QUANTS)."""


@dataclass(frozen=True)
class PlanRequest:
    target: ModelFacts
    budget: GpuBudget
    draft: ModelFacts | None = None
    ctx: int | None = None
    """Context the user asked for; None lets the planner choose."""
    parallel: int = 1
    kv_types: tuple[str, ...] = KV_PAIRS
    """KV types the engine has; the planner only picks from these and KV_PAIRS."""
    ctx_cap: int | None = None
    """An upper bound the planner must stay under without the user asking for a context
    (after an out-of-memory start); the user's ``ctx`` is never capped."""
    swa_full: bool = False
    """Sliding-window layers keep the whole context, so a cached prefix can be reused."""
    prompt_cache: bool = True
    """Give the engine a host-RAM prompt cache (``--cache-ram``) sized by the plan."""
    keep_free_bytes: int | None = None
    """RAM left to the rest of the PC (setting); None: max(2 GiB, 15%) (``hostram``)."""
    read_cap_ctx: int | None = None
    """Without a GPU: the context the CPU reads in the time the settings allow (None: no
    bound). Like ``ctx_cap`` it bounds only a context the planner chooses."""
    read_cap_reason: str = ""
    checkpoints: bool = False
    """Hybrid (recurrent) and sliding-window models: the engine saves what it cannot roll back
    (the recurrent state, the window) near the end of each prompt, so a growing agent prompt
    resumes from a recent checkpoint instead of being read again; the plan bounds them."""
    projector_bytes: int = 0
    """A vision projector's weights and one image's compute buffer (0: no vision)."""
    projector_reason: str = ""
