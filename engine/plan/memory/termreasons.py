"""Why each memory term of a plan is what it is: the reasons a Plan gives for the reserve, the
weights, the CUDA context, the prompt cache, the projector, the checkpoints, the sliding-window
cache, the draft and the split over devices (the context's own are in :mod:`ctxchoice`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.memory.hostram import CPU_KEEP_FREE_FRACTION
from lucebox.engine.plan.memory.sizes import (
    CHECKPOINT_RAM_SHARE,
    CUDA_CONTEXT_BYTES,
    PROMPT_CACHE_MAX_BYTES,
    PROMPT_CACHE_PROMPTS,
    PROMPT_CACHE_RAM_SHARE,
    RESERVE_FRACTION,
    RESERVE_MIN_BYTES,
)

if TYPE_CHECKING:
    from lucebox.engine.machine.budget import GpuBudget
    from lucebox.engine.models.modelfacts import ModelFacts
    from lucebox.engine.plan.memory.request import PlanRequest


def overhead_reasons(
    request: PlanRequest,
    reserve: int,
    cuda_context: int,
    prompt_cache: int,
    n_checkpoints: int,
    checkpoints: int,
) -> dict[str, str]:
    """Why each term that does not depend on the context is what it is."""
    target, budget = request.target, request.budget
    reasons = {
        "reserve": (
            f"{reserve / MIB:.0f} MiB kept free: max({RESERVE_MIN_BYTES // MIB} MiB, "
            f"{RESERVE_FRACTION:.1%} of the {budget.vram_free_bytes / GIB:.1f} GiB free)"
            if budget.is_gpu
            else f"{reserve / MIB:,.0f} MiB of RAM left to the rest of the PC: "
            + (
                "machine.keep_free_ram_mib"
                if request.keep_free_bytes
                else f"max(2 GiB, {CPU_KEEP_FREE_FRACTION:.0%} of the "
                f"{budget.vram_total_bytes / GIB:.1f} GiB of RAM)"
            )
        ),
        "weights": (
            f"{target.weights_bytes / GIB:.2f} GiB of tensors from the "
            f"{'GGUF header' if target.source == 'header' else 'preset'}"
        ),
    }
    if cuda_context:
        reasons["cuda_context"] = (
            f"{CUDA_CONTEXT_BYTES / MIB:.0f} MiB CUDA context and workspace"
            + (f" on each of {budget.device_count} GPUs" if budget.device_count > 1 else "")
        )
    reasons["prompt_cache"] = _prompt_cache_reason(request, prompt_cache)
    if request.projector_bytes:
        reasons["projector"] = request.projector_reason
    if n_checkpoints:
        what = "recurrent state" if target.recurrent_state_bytes else "sliding-window cache"
        reasons["checkpoints"] = (
            f"{checkpoints / MIB:.0f} MiB host RAM: up to {n_checkpoints} checkpoints of the "
            f"{what} (the engine takes one near the end of each prompt, at most 1/"
            f"{CHECKPOINT_RAM_SHARE} of the RAM), so an agent's growing prompt resumes from "
            "one instead of being read again"
        )
    return reasons


def _prompt_cache_reason(request: PlanRequest, prompt_cache: int) -> str:
    if not request.prompt_cache:
        return "no host-RAM prompt cache (--cache-ram 0): every prompt is processed anew"
    where = (
        "host RAM beside the GPU, not counted in VRAM"
        if request.budget.is_gpu
        else "the same RAM as the model, counted in total"
    )
    return (
        f"{prompt_cache / MIB:.0f} MiB host-RAM prompt cache (--cache-ram): the engine's "
        f"{PROMPT_CACHE_MAX_BYTES // MIB} MiB default, at most 1/{PROMPT_CACHE_RAM_SHARE} of the "
        f"PC's RAM and {PROMPT_CACHE_PROMPTS} full-context prompts; {where}"
    )


def swa_full_reason(request: PlanRequest) -> str | None:
    if request.swa_full:
        return (
            "sliding-window layers keep the whole context (--swa-full) so an agent's growing "
            "prompt is reused instead of re-read; counted in kv"
        )
    if request.target.swa_kv_elems_per_token and request.prompt_cache:
        return (
            f"no --swa-full: keeping the whole context in the sliding-window layers would "
            f"leave less than {wanted_ctx(request.ctx, request.target.native_ctx)} tokens; a "
            "growing prompt resumes from a checkpoint, one changed before its end is read "
            "again from the checkpoint before the change"
        )
    return None


def draft_reason(draft: ModelFacts, kv_type: str) -> str:
    return (
        f"{draft.name}: {draft.weights_bytes / MIB:.0f} MiB weights, {kv_type} KV at the "
        f"same context (as the target's), compute"
    )


def split_reason(budget: GpuBudget, split: tuple[float, ...], main_gpu: int) -> str:
    return (
        f"layers spread over {len(split)} devices in proportion to what each has free after "
        f"its CUDA context and scratch ({', '.join(f'{s:g}' for s in split)}); "
        f"{budget.devices[main_gpu].label} holds the output and the compute buffer"
    )
