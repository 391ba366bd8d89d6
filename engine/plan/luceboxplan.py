"""The memory plan and flags for the Lucebox engine (``dflash_server``), pure.

What lives where (reference/lucebox-engine-contract.md section 5, checked on the H100 against
nvidia-smi after a warm-up request): the target's weights on the GPU except its token
embeddings, which stay in host RAM; the draft whole; the attention KV over ``--max-ctx`` (or
over the KVFlash pool) at one K=V type; the delta-net state; the draft's feature ring; the
rollback buffers and compute graphs, which the engine allocates on the first request (so
lucebox sends a warm-up request before it reports ready); the CUDA context. A context beyond
what fits is served with a KVFlash pool and the rest of the KV paged to host RAM: sparse
attention over the resident pool, not exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from lucebox.engine.core.units import MIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.plan.luceboxlaunch import SAMPLED_VERIFY_ARCHS, LuceboxFlags
from lucebox.engine.plan.memory import (
    CTX_PAD,
    CUDA_CONTEXT_BYTES,
    KV_TYPE_BYTES,
    KVFLASH_CAP,
    KVFLASH_FLOOR,
    MIN_CTX,
    MemoryBytes,
    Plan,
    pad_ctx,
)

PrefillMode = Literal["auto", "off", "pflash"]
PREFILL_MODES: tuple[PrefillMode, ...] = ("auto", "off", "pflash")
PREFILL_DRAFTER_SOURCE = "hf:unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-BF16.gguf"
"""PFlash's prefill drafter (the engine scores prompt tokens with Qwen3-0.6B in BF16)."""
CHUNK_TOKENS = 512
"""The engine's prefill micro-batch (``--chunk``): its logits buffer spans it."""
N_CAPTURE_LAYERS = 5
"""Target layers the draft reads; the feature ring holds them over at most 4096 tokens."""
FEATURE_RING_TOKENS = 4096
DDTREE_MIN_BUDGET = 15
"""Below the draft's block size the verify graph fails a shape assertion (budget 12 on an
RTX 5090, upstream's RESULTS.md)."""
DDTREE_BUDGETS = (("4090", 28), ("3090", 22), ("5090", 22))
"""Per card class, from upstream's measurements; other cards get the engine's default."""
DDTREE_DEFAULT_BUDGET = 22
RUNTIME_BYTES = 240 * MIB
"""CUDA graphs, cuBLAS workspaces and the scratch of a full 512-token prefill chunk beyond the
terms above: what nvidia-smi showed after lucebox's warm-up on the H100 for the generated
qwen35 (n_embd 1024, vocabulary 248,320; 2142 MiB at 4096 tokens) less the plan's terms.
Calibrated on that one shape; a real 27B target is still to be measured."""
DRAFT_RUNTIME_BYTES = 100 * MIB
"""With a draft, its graphs and the DDTree verify scratch beyond its weights and feature ring
(same run: 2872 MiB with the draft at 262144 tokens)."""
MAX_TOKENS_CAP = 8192
PREFIX_CACHE_MAX_SLOTS = 32
PREFIX_CACHE_RAM_SHARE = 8
"""Prefix-cache snapshots may take up to an eighth of the PC's RAM."""
F16_KV_ARCHS = ("gemma4",)
"""Families whose KV the engine keeps in f16 whatever the flags say."""


@dataclass(frozen=True)
class LuceboxRequest:
    target: ModelFacts
    budget: GpuBudget
    draft: ModelFacts | None = None
    ctx: int | None = None
    """The context asked for; None lets the plan choose (the largest exact one that fits)."""
    ctx_cap: int | None = None
    kv_types: tuple[str, ...] = ("q8_0", "q4_0")
    """K=V types the built engine has kernels for."""
    prefill: PrefillMode = "off"
    prefill_drafter: str | None = None
    prefill_drafter_bytes: int = 0


@dataclass(frozen=True)
class LuceboxPlan:
    plan: Plan
    flags: LuceboxFlags
    reasons: dict[str, str] = field(default_factory=dict)


def kv_bytes_per_token(target: ModelFacts, kv_type: str) -> float:
    return target.full_kv_elems_per_token * KV_TYPE_BYTES[kv_type]


def ddtree_budget(device_name: str) -> int:
    """The DDTree budget for the card class (never under the draft's block size - 1)."""
    for marker, budget in DDTREE_BUDGETS:
        if re.search(marker, device_name):
            return max(DDTREE_MIN_BUDGET, budget)
    return DDTREE_DEFAULT_BUDGET


def rollback_bytes(target: ModelFacts, verify_tokens: int) -> int:
    """Per delta-net layer a snapshot of its state plus an f16 copy per verified token."""
    state = target.recurrent_state_bytes
    return state + state // 2 * verify_tokens


def compute_bytes(target: ModelFacts) -> int:
    """Logits of one prefill chunk (f32 over the vocabulary) and the chunk's activations."""
    return target.n_vocab * 4 * CHUNK_TOKENS + CHUNK_TOKENS * target.n_embd * 4 * 16


def _kv_types(request: LuceboxRequest) -> tuple[str, ...]:
    if request.target.architecture in F16_KV_ARCHS:
        return ("f16",)
    preferred = [t for t in ("q8_0", "q4_0") if t in request.kv_types]
    return tuple(preferred) or ("q4_0",)


@dataclass(frozen=True)
class _Fixed:
    """Everything on the GPU but the KV cache."""

    weights: int
    draft: int
    ring: int
    rollback: int
    runtime: int
    prefill_drafter: int
    ddtree_budget: int | None
    verify_tokens: int

    @property
    def compute(self) -> int:
        return self.ring + self.rollback + self.runtime

    def total(self, target: ModelFacts) -> int:
        return (
            self.weights + self.draft + self.prefill_drafter + self.compute
            + compute_bytes(target) + CUDA_CONTEXT_BYTES + target.recurrent_state_bytes
        )  # fmt: skip


@dataclass(frozen=True)
class _Context:
    kv_type: str
    per_token: float
    max_ctx: int
    pool: int | None
    largest: int
    reason: str


def _fixed(request: LuceboxRequest) -> _Fixed:
    target = request.target
    budget = ddtree_budget(request.budget.device) if request.draft else None
    verify_tokens = max(16, (budget or 0) + 1)
    return _Fixed(
        weights=max(0, target.weights_bytes - target.host_bytes),
        draft=request.draft.weights_bytes if request.draft else 0,
        ring=N_CAPTURE_LAYERS * target.n_embd * FEATURE_RING_TOKENS * 2 if request.draft else 0,
        rollback=rollback_bytes(target, verify_tokens),
        runtime=RUNTIME_BYTES + (DRAFT_RUNTIME_BYTES if request.draft else 0),
        prefill_drafter=request.prefill_drafter_bytes if request.prefill != "off" else 0,
        ddtree_budget=budget,
        verify_tokens=verify_tokens,
    )


def _context(request: LuceboxRequest, room: int) -> _Context:
    """The KV type and context: exact when it fits, a KVFlash pool when a larger context was
    asked for, else the largest exact one."""
    target = request.target
    native = target.native_ctx
    wanted = min(request.ctx or native, native)
    if request.ctx_cap is not None and request.ctx is None:
        wanted = min(wanted, request.ctx_cap)
    types = _kv_types(request)
    largest = {t: _largest(room, kv_bytes_per_token(target, t), native) for t in types}
    kv_type = next((t for t in types if largest[t] >= wanted), types[-1])
    per_token, fit = kv_bytes_per_token(target, kv_type), largest[kv_type]
    if fit >= wanted:
        max_ctx = pad_ctx(wanted) if request.ctx else wanted // CTX_PAD * CTX_PAD
        reason = f"{max_ctx} tokens with exact attention at {kv_type} KV"
        return _Context(kv_type, per_token, max_ctx, None, fit, reason)
    if request.ctx is None:
        reason = f"{fit} tokens: the largest exact context that fits at {kv_type} KV"
        return _Context(kv_type, per_token, fit, None, fit, reason)
    max_ctx = pad_ctx(wanted)
    pool = max(KVFLASH_FLOOR, min(KVFLASH_CAP, fit, max_ctx))
    reason = (
        f"{max_ctx} tokens asked for; {fit} fit in VRAM at {kv_type} KV, so KVFlash keeps a "
        f"{pool}-token pool on the GPU and pages the rest to host RAM (sparse attention over "
        "the pool, not exact; policy lru: its drafter policy needs Qwen3-0.6B)"
    )
    return _Context(kv_type, per_token, max_ctx, pool, fit, reason)


def plan_lucebox(request: LuceboxRequest) -> LuceboxPlan:
    """Context, KV type, KVFlash pool, DDTree budget and every memory term, with reasons."""
    target, budget = request.target, request.budget
    fixed = _fixed(request)
    reserve = max(64 * MIB, int(budget.vram_free_bytes * 0.005))
    room = budget.vram_free_bytes - reserve - fixed.total(target)
    ctx = _context(request, room)
    resident = ctx.pool if ctx.pool is not None else ctx.max_ctx
    kv_attention = int(pad_ctx(resident) * ctx.per_token)
    fits = ctx.max_ctx >= min(MIN_CTX, target.native_ctx) and kv_attention <= room
    host_pages = int((ctx.max_ctx - ctx.pool) * ctx.per_token) if ctx.pool is not None else 0
    per_slot = target.recurrent_state_bytes + int(ctx.per_token * min(ctx.max_ctx, 32768))
    slots = _prefix_slots(budget.host_total_bytes, per_slot)
    max_tokens = max(CTX_PAD, min(MAX_TOKENS_CAP, ctx.max_ctx // 4))
    memory = MemoryBytes(
        weights=fixed.weights + fixed.prefill_drafter,
        kv=kv_attention + target.recurrent_state_bytes,
        draft=fixed.draft,
        compute=compute_bytes(target) + fixed.compute,
        cuda_context=CUDA_CONTEXT_BYTES,
        reserve=reserve,
        available=budget.vram_free_bytes,
        prompt_cache=slots * per_slot,
        checkpoints=host_pages,
    )
    reasons = _reasons(request, fixed, ctx, max_tokens, slots, host_pages)
    flags = LuceboxFlags(
        max_ctx=ctx.max_ctx,
        max_tokens=max_tokens,
        cache_type=None if target.architecture in F16_KV_ARCHS else ctx.kv_type,
        prefix_cache_slots=slots,
        ddtree_budget=fixed.ddtree_budget,
        kvflash_pool=ctx.pool,
        prefill={"off": "off", "auto": "auto", "pflash": "always"}[request.prefill],
        prefill_drafter=request.prefill_drafter,
        sampled_verify=request.draft is not None and target.architecture in SAMPLED_VERIFY_ARCHS,
    )
    plan = Plan(
        fits=fits,
        ctx=ctx.max_ctx,
        cache_type_k=ctx.kv_type,
        cache_type_v=ctx.kv_type,
        n_gpu_layers=-1,
        n_cpu_moe=0,
        parallel=1,
        memory_bytes=memory,
        kvflash_pool_tokens=ctx.pool,
        reasons=reasons,
        largest_ctx=ctx.largest,
        device_bytes=((budget.device, memory.total),),
    )
    return LuceboxPlan(plan, flags, reasons)


def _reasons(
    request: LuceboxRequest,
    fixed: _Fixed,
    ctx: _Context,
    max_tokens: int,
    slots: int,
    host_pages: int,
) -> dict[str, str]:
    target = request.target
    reasons = {
        "engine": "the Lucebox engine (dflash_server): one request at a time (batch 1)",
        "ctx": ctx.reason,
        "weights": (
            f"{fixed.weights / MIB:.0f} MiB on the GPU; the token embeddings "
            f"({target.host_bytes / MIB:.0f} MiB) stay in host RAM"
        ),
        "kv": f"{ctx.kv_type} for K and V (this build has only the symmetric kernels)"
        + ("; Gemma 4's KV is f16 whatever the flags say" if ctx.kv_type == "f16" else ""),
        "compute": (
            f"chunk logits and activations {compute_bytes(target) / MIB:.0f} MiB, feature ring "
            f"{fixed.ring / MIB:.0f} MiB, rollback {fixed.rollback / MIB:.0f} MiB (for "
            f"{fixed.verify_tokens} verified tokens), graphs and workspaces "
            f"{fixed.runtime / MIB:.0f} MiB; allocated on the first request, which lucebox "
            "sends before ready"
        ),
        "max_tokens": f"{max_tokens}: a reply's default and cap, below --max-ctx {ctx.max_ctx}",
        "prompt_cache": f"{slots} prefix-cache snapshot slots in host RAM",
    }
    if ctx.pool is not None:
        reasons["kvflash"] = f"{host_pages / MIB:.0f} MiB of KV paged to host RAM at full context"
    if fixed.ddtree_budget is not None:
        reasons["ddtree"] = f"DDTree budget {fixed.ddtree_budget} for {request.budget.device}"
    return reasons


def _largest(room: int, per_token: float, native: int) -> int:
    if room <= 0:
        return 0
    return min(native, int(room / max(per_token, 1.0)) // CTX_PAD * CTX_PAD)


def _prefix_slots(host_total_bytes: int, per_slot_bytes: int) -> int:
    if host_total_bytes <= 0 or per_slot_bytes <= 0:
        return 1
    share = host_total_bytes // PREFIX_CACHE_RAM_SHARE
    return max(1, min(PREFIX_CACHE_MAX_SLOTS, share // per_slot_bytes))
