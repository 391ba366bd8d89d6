"""The memory plan and flags for the Lucebox engine (``dflash_server``), pure.

What lives where (reference/lucebox-engine-contract.md section 5, checked on the H100 against
nvidia-smi after a warm-up request): the target's weights on the GPU except its token
embeddings, which stay in host RAM; the draft whole; the attention KV over ``--max-ctx`` (or
over the KVFlash pool) at one K=V type; the delta-net state; the draft's feature ring; the
rollback buffers and compute graphs, which the engine allocates on the first request (so
lucebox sends a warm-up request before it reports ready); the CUDA context. A context beyond
what fits is served with a KVFlash pool and the rest of the KV paged to host RAM: sparse
attention over the resident pool, not exact.

``plan_lucebox`` adds the terms in the order the engine allocates them and stays one function.
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
    MIN_CTX,
    Plan,
)
from lucebox.engine.plan.sizes import (
    CTX_PAD,
    CUDA_CONTEXT_BYTES,
    KV_TYPE_BYTES,
    KVFLASH_CAP,
    KVFLASH_FLOOR,
    MemoryBytes,
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


def plan_lucebox(request: LuceboxRequest) -> LuceboxPlan:
    """Context, KV type, KVFlash pool, DDTree budget and every memory term, with reasons."""
    target, budget = request.target, request.budget
    weights = max(0, target.weights_bytes - target.host_bytes)
    draft = request.draft.weights_bytes if request.draft else 0
    budget_ddtree = ddtree_budget(budget.device) if request.draft else None
    verify_tokens = max(16, (budget_ddtree or 0) + 1)
    ring = N_CAPTURE_LAYERS * target.n_embd * FEATURE_RING_TOKENS * 2 if request.draft else 0
    rollback = rollback_bytes(target, verify_tokens)
    runtime = RUNTIME_BYTES + (DRAFT_RUNTIME_BYTES if request.draft else 0)
    compute = compute_bytes(target) + ring + rollback + runtime
    prefill_drafter = request.prefill_drafter_bytes if request.prefill != "off" else 0
    cuda_context = CUDA_CONTEXT_BYTES
    reserve = max(64 * MIB, int(budget.vram_free_bytes * 0.005))
    fixed = (
        weights + draft + compute + cuda_context + prefill_drafter + target.recurrent_state_bytes
    )
    room = budget.vram_free_bytes - reserve - fixed
    native = target.native_ctx
    wanted = min(request.ctx or native, native)
    if request.ctx_cap is not None and request.ctx is None:
        wanted = min(wanted, request.ctx_cap)

    types = _kv_types(request)
    largest = {t: _largest(room, kv_bytes_per_token(target, t), native) for t in types}
    kv_type = next((t for t in types if largest[t] >= wanted), types[-1])
    per_token = kv_bytes_per_token(target, kv_type)
    pool: int | None = None
    if largest[kv_type] >= wanted:
        max_ctx = pad_ctx(wanted) if request.ctx else wanted // CTX_PAD * CTX_PAD
        kv = int(pad_ctx(max_ctx) * per_token)
        ctx_reason = f"{max_ctx} tokens with exact attention at {kv_type} KV"
    elif request.ctx is not None:
        max_ctx = pad_ctx(wanted)
        pool = max(KVFLASH_FLOOR, min(KVFLASH_CAP, largest[kv_type], max_ctx))
        kv = int(pool * per_token)
        ctx_reason = (
            f"{max_ctx} tokens asked for; {largest[kv_type]} fit in VRAM at {kv_type} KV, so "
            f"KVFlash keeps a {pool}-token pool on the GPU and pages the rest to host RAM "
            "(sparse attention over the pool, not exact)"
        )
    else:
        max_ctx = max(0, largest[kv_type])
        kv = int(max_ctx * per_token)
        ctx_reason = f"{max_ctx} tokens: the largest exact context that fits at {kv_type} KV"
    kv += target.recurrent_state_bytes
    fits = max_ctx >= min(MIN_CTX, native) and room - (kv - target.recurrent_state_bytes) >= 0
    host_pages = int(max(0, max_ctx - pool) * per_token) if pool is not None else 0
    per_slot = target.recurrent_state_bytes + int(per_token * min(max_ctx, 32768))
    slots = _prefix_slots(budget.host_total_bytes, per_slot)
    max_tokens = max(CTX_PAD, min(MAX_TOKENS_CAP, max_ctx // 4))
    memory = MemoryBytes(
        weights=weights + prefill_drafter,
        kv=kv,
        draft=draft,
        compute=compute,
        cuda_context=cuda_context,
        reserve=reserve,
        available=budget.vram_free_bytes,
        prompt_cache=slots * per_slot,
        checkpoints=host_pages,
    )
    reasons = {
        "engine": "the Lucebox engine (dflash_server): one request at a time (batch 1)",
        "ctx": ctx_reason,
        "weights": (
            f"{weights / MIB:.0f} MiB on the GPU; the token embeddings "
            f"({target.host_bytes / MIB:.0f} MiB) stay in host RAM"
        ),
        "kv": f"{kv_type} for K and V (this build has only the symmetric kernels)"
        + ("; Gemma 4's KV is f16 whatever the flags say" if kv_type == "f16" else ""),
        "compute": (
            f"chunk logits and activations {compute_bytes(target) / MIB:.0f} MiB, feature ring "
            f"{ring / MIB:.0f} MiB, rollback {rollback / MIB:.0f} MiB (for {verify_tokens} "
            f"verified tokens), graphs and workspaces {runtime / MIB:.0f} MiB; allocated on the "
            "first request, which lucebox sends before ready"
        ),
        "max_tokens": f"{max_tokens}: a reply's default and cap, below --max-ctx {max_ctx}",
        "prompt_cache": f"{slots} prefix-cache snapshot slots in host RAM",
    }
    if pool is not None:
        reasons["kvflash"] = f"{host_pages / MIB:.0f} MiB of KV paged to host RAM at full context"
    if budget_ddtree is not None:
        reasons["ddtree"] = f"DDTree budget {budget_ddtree} for {budget.device}"
    flags = LuceboxFlags(
        max_ctx=max_ctx,
        max_tokens=max_tokens,
        cache_type=None if kv_type == "f16" and target.architecture in F16_KV_ARCHS else kv_type,
        prefix_cache_slots=slots,
        ddtree_budget=budget_ddtree,
        kvflash_pool=pool,
        prefill="off" if request.prefill == "off" else
        ("always" if request.prefill == "pflash" else "auto"),
        prefill_drafter=request.prefill_drafter,
        sampled_verify=request.draft is not None and target.architecture in SAMPLED_VERIFY_ARCHS,
    )  # fmt: skip
    plan = Plan(
        fits=fits,
        ctx=max_ctx,
        cache_type_k=kv_type,
        cache_type_v=kv_type,
        n_gpu_layers=-1,
        n_cpu_moe=0,
        parallel=1,
        memory_bytes=memory,
        kvflash_pool_tokens=pool,
        reasons=reasons,
        largest_ctx=largest[kv_type],
        device_bytes=((budget.device, memory.total),),
    )
    return LuceboxPlan(plan, flags, reasons)


def _largest(room: int, per_token: float, native: int) -> int:
    if room <= 0:
        return 0
    return min(native, int(room / max(per_token, 1.0)) // CTX_PAD * CTX_PAD)


def _prefix_slots(host_total_bytes: int, per_slot_bytes: int) -> int:
    if host_total_bytes <= 0 or per_slot_bytes <= 0:
        return 1
    share = host_total_bytes // PREFIX_CACHE_RAM_SHARE
    return max(1, min(PREFIX_CACHE_MAX_SLOTS, share // per_slot_bytes))
