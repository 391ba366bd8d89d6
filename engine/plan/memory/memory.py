"""The memory planner (pure): GPU facts + model facts + user limits -> a Plan, number by number.

It adds up what llama-server allocates (each term priced in :mod:`sizes`): weights from the
GGUF tensor sizes, KV cache per token from the architecture, the draft model, compute buffers,
the CUDA context, and a reserve. It chooses the context (multiple of 256, at most the model's
native maximum), the KV cache types (pairs the engine has fast kernels for), GPU layers when
the weights do not fit, and parallel slots. It never shrinks a context the user asked for: it
refuses with the largest that fits.

``make_plan`` reads as the plan's steps in order and ends in the Plan it explains: the
overheads and the room they leave (``_overheads``), the layers, KV type and context that fit
(``_fit``), then each term. The steps' helpers have modules of their own: :mod:`sizes` (what
each term costs), :mod:`layerchoice` (where the weights go), :mod:`ctxchoice` (the KV type and
context that fit), :mod:`termreasons` (why each term is what it is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lucebox.engine.core.units import MIB
from lucebox.engine.plan.memory.ctxchoice import (
    MIN_CTX,
    choose_ctx,
    choose_kv_type,
    kv_reason,
    too_slow,
    too_slow_reason,
    wanted_ctx,
)
from lucebox.engine.plan.memory.devicesplit import split_over_devices
from lucebox.engine.plan.memory.hostram import cpu_keep_free_bytes, host_ram_bound
from lucebox.engine.plan.memory.layerchoice import place_layers
from lucebox.engine.plan.memory.request import KV_PAIRS, PlanRequest
from lucebox.engine.plan.memory.sizes import (
    CTX_PAD,
    CUDA_CONTEXT_BYTES,
    MemoryBytes,
    checkpoints_per_slot,
    compute_bytes,
    compute_copies,
    draft_bytes,
    kv_bytes,
    kvflash_pool,
    prompt_cache_bytes,
    reserve_bytes,
    weights_on_gpu,
)
from lucebox.engine.plan.memory.termreasons import (
    draft_reason,
    overhead_reasons,
    split_reason,
    swa_full_reason,
)


@dataclass(frozen=True)
class Plan:
    fits: bool
    ctx: int
    cache_type_k: str
    cache_type_v: str
    n_gpu_layers: int
    n_cpu_moe: int
    parallel: int
    memory_bytes: MemoryBytes
    kvflash_pool_tokens: int | None
    """The KVFlash pool the launch serves with (the Lucebox engine's); None: the whole context
    stays exact on the card, as on llama-server, which has no KVFlash."""
    reasons: dict[str, str] = field(default_factory=dict)
    largest_ctx: int = 0
    """The largest context that fits with these types (for a refusal)."""
    swa_full: bool = False
    cache_ram_mib: int | None = None
    """The host-RAM prompt cache the engine gets; 0 turns it off."""
    context_checkpoints: int | None = None
    device_bytes: tuple[tuple[str, int], ...] = ()
    """What the engine will use on each GPU (name, bytes); their sum is ``total``."""
    tensor_split: tuple[float, ...] = ()
    """Share of the layers per device when the model is spread over several: whole layer
    slots (n_layer + 1 with the output) when every layer is offloaded, else fractions."""
    main_gpu: int = 0
    """Position (among the GPUs the engine sees) of the one holding the output and scratch."""

    def server_flags(self) -> list[str]:
        """The llama-server flags this plan decides (model paths are added by launch)."""
        flags = [
            "-c",
            str(self.ctx),
            "-np",
            str(self.parallel),
            "-ctk",
            self.cache_type_k,
            "-ctv",
            self.cache_type_v,
            "-fa",
            "on",
            "-ngl",
            str(self.n_gpu_layers) if self.n_gpu_layers >= 0 else "all",
            "--fit",
            "off",
        ]
        if self.parallel > 1:
            # Off by default for a given -np: each slot would get ctx/N, never the whole pool.
            flags.append("--kv-unified")
        if self.n_cpu_moe:
            flags += ["--n-cpu-moe", str(self.n_cpu_moe)]
        if self.swa_full:
            flags.append("--swa-full")
        if self.cache_ram_mib is not None:
            flags += ["--cache-ram", str(self.cache_ram_mib)]
        if self.context_checkpoints is not None:
            flags += ["--ctx-checkpoints", str(self.context_checkpoints)]
        if self.tensor_split:
            flags += [
                "--split-mode",
                "layer",
                "--tensor-split",
                ",".join(f"{share:g}" for share in self.tensor_split),
                "--main-gpu",
                str(self.main_gpu),
            ]
        return flags

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "ctx": self.ctx,
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "n_gpu_layers": self.n_gpu_layers,
            "n_cpu_moe": self.n_cpu_moe,
            "parallel": self.parallel,
            "memory_bytes": self.memory_bytes.to_json(),
            "kvflash_pool_tokens": self.kvflash_pool_tokens,
            "largest_ctx": self.largest_ctx,
            "swa_full": self.swa_full,
            "cache_ram_mib": self.cache_ram_mib,
            "tensor_split": list(self.tensor_split),
            "main_gpu": self.main_gpu,
            "reasons": dict(self.reasons),
        }


@dataclass(frozen=True)
class _Overheads:
    """What the device holds besides the model's weights and KV, and the room they leave."""

    reserve_bytes: int
    cuda_context_bytes: int
    prompt_cache_bytes: int
    n_checkpoints: int
    """Context checkpoints per slot."""
    checkpoints_bytes: int
    """All slots' checkpoints."""
    room_after_weights_bytes: int
    """What is left for the KV and compute buffers once every weight is on the device."""


@dataclass(frozen=True)
class _Fit:
    """Where the weights go and the context and KV type that fit beside them."""

    n_gpu_layers: int
    n_cpu_moe: int
    kv_type: str
    ctx: int
    largest_ctx: int
    fits: bool
    reasons: dict[str, str]


def make_plan(request: PlanRequest) -> Plan:
    """Choose context, KV types and offload for ``request``; explain every number."""
    target, budget, draft = request.target, request.budget, request.draft
    over = _overheads(request)
    reasons = overhead_reasons(
        request,
        over.reserve_bytes,
        over.cuda_context_bytes,
        over.prompt_cache_bytes,
        over.n_checkpoints,
        over.checkpoints_bytes,
    )
    fit = _fit(request, over)
    reasons.update(fit.reasons)
    used_ctx = max(fit.ctx, CTX_PAD)
    kv = kv_bytes(target, used_ctx, fit.kv_type, request.parallel, request.swa_full)
    swa_reason = swa_full_reason(request)
    if swa_reason:
        reasons["swa_full"] = swa_reason
    draft_total = 0
    if draft is not None:
        draft_total = draft_bytes(draft, used_ctx, fit.kv_type, request.parallel)
        reasons["draft"] = draft_reason(draft, fit.kv_type)
    compute = compute_bytes(target, used_ctx, fit.kv_type, request.swa_full)
    on_gpu = weights_on_gpu(target, fit.n_gpu_layers, fit.n_cpu_moe)
    prompt_cache, fits = over.prompt_cache_bytes, fit.fits
    if budget.is_gpu:
        # No layer on the GPU: weights_on_gpu counts them all, yet they are all in RAM.
        in_ram = target.weights_bytes - (
            0 if fit.n_gpu_layers == 0 and not fit.n_cpu_moe else on_gpu
        )
        bound = host_ram_bound(
            budget.host_total_bytes, request.keep_free_bytes, in_ram, prompt_cache,
            over.checkpoints_bytes,
        )  # fmt: skip
        prompt_cache, fits = bound.prompt_cache_bytes, fits and bound.fits
        if bound.reason:
            reasons["ram" if not bound.fits else "host_ram"] = bound.reason
    memory = MemoryBytes(
        weights=on_gpu,
        kv=kv,
        draft=draft_total,
        compute=compute * compute_copies(budget),
        cuda_context=over.cuda_context_bytes,
        reserve=over.reserve_bytes,
        available=budget.vram_free_bytes,
        prompt_cache=prompt_cache,
        checkpoints=over.checkpoints_bytes,
        projector=request.projector_bytes,
        prompt_cache_in_total=not budget.is_gpu,
    )
    reasons["kvflash_pool"] = _kvflash_pool_reason(request, memory, fit.kv_type)
    split, main_gpu, per_device = split_over_devices(
        budget, memory, target, fit.n_gpu_layers, fit.n_cpu_moe
    )
    if split:
        reasons["split"] = split_reason(budget, split, main_gpu)
    return Plan(
        fits=fits,
        ctx=fit.ctx,
        cache_type_k=fit.kv_type,
        cache_type_v=fit.kv_type,
        n_gpu_layers=fit.n_gpu_layers,
        n_cpu_moe=fit.n_cpu_moe,
        parallel=request.parallel,
        memory_bytes=memory,
        kvflash_pool_tokens=None,  # the pool a launch serves with: llama-server has none
        reasons=reasons,
        largest_ctx=fit.largest_ctx,
        swa_full=request.swa_full,
        cache_ram_mib=prompt_cache // MIB,
        # --cache off keeps nothing: not the engine's 32 default checkpoints either.
        context_checkpoints=over.n_checkpoints or (None if request.prompt_cache else 0),
        device_bytes=per_device,
        tensor_split=split,
        main_gpu=main_gpu,
    )


def _overheads(request: PlanRequest) -> _Overheads:
    """The reserve, CUDA contexts, prompt cache and checkpoints, and the room left once the
    weights are on the device (on a CPU the prompt cache shares that room)."""
    target, budget, draft = request.target, request.budget, request.draft
    reserve = (
        reserve_bytes(budget)
        if budget.is_gpu
        else cpu_keep_free_bytes(budget.vram_total_bytes, request.keep_free_bytes)
    )
    cuda_context = CUDA_CONTEXT_BYTES * budget.device_count if budget.is_gpu else 0
    prompt_cache = prompt_cache_bytes(budget, target) if request.prompt_cache else 0
    n_checkpoints, checkpoint_bytes = (
        checkpoints_per_slot(target, budget, request.swa_full) if request.checkpoints else (0, 0)
    )
    checkpoints = n_checkpoints * checkpoint_bytes * request.parallel
    resident = target.weights_bytes - (target.host_bytes if budget.is_gpu else 0)
    room = budget.vram_free_bytes - reserve - cuda_context - resident
    room -= draft.weights_bytes if draft else 0
    room -= request.projector_bytes
    if not budget.is_gpu:
        room -= prompt_cache + checkpoints
    return _Overheads(reserve, cuda_context, prompt_cache, n_checkpoints, checkpoints, room)


def _fit(request: PlanRequest, over: _Overheads) -> _Fit:
    """The layers on the device, then the KV type and context that fit beside them."""
    target = request.target
    kv_choices = [t for t in KV_PAIRS if t in request.kv_types] or ["f16"]
    min_ctx = min(MIN_CTX, target.native_ctx)
    reasons: dict[str, str] = {}
    n_gpu_layers, n_cpu_moe, largest, reasons["n_gpu_layers"] = place_layers(
        request,
        over.room_after_weights_bytes,
        over.reserve_bytes + over.cuda_context_bytes + request.projector_bytes,
        kv_choices,
        min_ctx,
    )
    kv_type = choose_kv_type(largest, wanted_ctx(request.ctx, target.native_ctx))
    ctx, fits, reasons["ctx"] = choose_ctx(request, largest[kv_type], kv_type, min_ctx)
    if too_slow(request, fits, ctx, min_ctx):
        fits, reasons["too_slow"] = False, too_slow_reason(request, min_ctx)
    reasons["cache_type"] = kv_reason(kv_type, largest, target.native_ctx)
    return _Fit(n_gpu_layers, n_cpu_moe, kv_type, ctx, largest[kv_type], fits, reasons)


def _kvflash_pool_reason(request: PlanRequest, memory: MemoryBytes, kv_type: str) -> str:
    """The pool the Lucebox engine would keep here, for comparison: llama-server has none."""
    target = request.target
    kv_per_token = kv_bytes(target, CTX_PAD * 64, kv_type) / (CTX_PAD * 64)
    pool = kvflash_pool(
        memory.available - memory.cuda_context - memory.weights,
        memory.reserve,
        kv_per_token,
        target.native_ctx,
    )
    return f"{pool} tokens by the lucebox engine's KVFlash rule; not available on llama-server"
