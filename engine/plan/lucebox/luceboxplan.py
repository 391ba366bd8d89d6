"""The memory plan and flags for the Lucebox engine (``dflash_server``), pure.

What lives where (reference/lucebox-engine-contract.md section 5, checked on the GPU against
NVML after a warm-up request and at the peak of each request;
benchmarks/lucebox_memory_by_stage.py): the
target's weights on the GPU except its token embeddings, which stay in host RAM; the draft
whole; the attention KV over ``--max-ctx`` (or over the KVFlash pool) at one K=V type; the
delta-net state; the feature ring the draft reads (allocated with or without a draft); the
rollback buffers and compute graphs, which the engine allocates on the first request (so
lucebox sends a warm-up request before it reports ready); the CUDA context. On top of that, a
prefill holds the f32 logits of its last chunk while it runs, and PFlash's drafter is loaded
only while it scores a prompt, with the target's weights parked off the GPU: both are freed
after, so they count in the peak that must fit, not in what the GPU shows between requests.
A context beyond what fits is served with a KVFlash pool and the rest of the KV paged to host
RAM: sparse attention over the resident pool, not exact.

``plan_lucebox`` prices the terms in the order the engine allocates them (``_terms``), puts
them on the placement's cards, fits the context in the room left (``_context``) and explains
each number (``_reasons``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from lucebox.engine.core.units import MIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.plan.lucebox.luceboxdevices import (
    PLACEMENT_TEXT,
    DeviceLoad,
    Parts,
    PlacementName,
    attention_room,
    device_loads,
)
from lucebox.engine.plan.lucebox.luceboxfit import UNKNOWN_BUILD, BuildMemory
from lucebox.engine.plan.lucebox.luceboxlaunch import SAMPLED_VERIFY_ARCHS, LuceboxFlags
from lucebox.engine.plan.memory.ctxchoice import MIN_CTX, wanted_ctx
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.sizes import (
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
KvMode = Literal["auto", "exact", "kvflash"]
KV_MODES: tuple[KvMode, ...] = ("auto", "exact", "kvflash")
"""How the attention KV is held: auto (exact while it fits, a KVFlash pool only when no exact
cache gives the context asked for), exact (never KVFlash: a context that does not fit is
refused), kvflash (a pool even where the exact cache fits: the user's call, it is not exact)."""
PREFILL_DRAFTER_SOURCE = "hf:unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-BF16.gguf"
"""PFlash's prefill drafter (the engine scores prompt tokens with Qwen3-0.6B in BF16)."""
PREFILL_DRAFTER_BYTES = 1_200_000_000
"""Its size before it is pulled (about 1.2 GB, as upstream lists it), so a plan made first
already counts its peak."""
PREFILL_THRESHOLD_TOKENS = 32000
"""The engine's ``--prefill-threshold``: in auto mode a prompt this long or longer is
compressed, a shorter one never."""
PREFILL_KEEP_PERCENT = 5
"""The engine's ``--prefill-keep-ratio`` (0.05): the share of a compressed prompt it keeps."""
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
DRAFT_RUNTIME_BYTES = 139 * MIB
"""With a draft, its graphs and the DDTree verify scratch beyond its weights (same runs: 194
MiB more with the draft and DDTree budget 22 at 4096 tokens, 44 of them its weights, 11 the
longer rollback)."""
PFLASH_SCORING_BYTES = 512 * MIB
"""PFlash's drafter's scoring buffers beside its weights: upstream's KVFlash reserve for the
drafter (1.7 GiB) less the 1.2 GB Qwen3-0.6B file; the generated stand-in used 260 MiB
scoring a 3,037-token prompt."""
MAX_TOKENS_CAP = 8192
PREFIX_CACHE_MAX_SLOTS = 32
PREFIX_CACHE_RAM_SHARE = 8
"""Prefix-cache snapshots may take up to an eighth of the PC's RAM."""
F16_KV_ARCHS = ("gemma4",)
"""Families whose KV the engine keeps in f16 whatever the flags say."""
RING_WITH_DRAFT_ONLY_ARCHS = ("gemma4",)
"""Families whose feature ring the engine allocates only when a draft loads; the qwen35
family's cache always has one (measured: 40 MiB more at load without a draft)."""


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
    placement: PlacementName = "one"
    cards: tuple[tuple[str, int], ...] = ()
    """(label, free bytes) of the cards the placement uses, the target's first; empty: the
    budget as one card."""
    kv_mode: KvMode = "auto"
    build: BuildMemory = UNKNOWN_BUILD
    """The engine build's own memory fit (plan/lucebox/luceboxfit.py)."""


@dataclass(frozen=True)
class LuceboxPlan:
    plan: Plan
    flags: LuceboxFlags
    reasons: dict[str, str] = field(default_factory=dict)
    exact: bool = False
    """It holds the context it aimed for with exact attention (no KVFlash pool)."""
    wanted_ctx: int = 0
    """The context it aimed for: the one asked, else the model's native one (or the cap)."""


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
    """What a full prefill chunk leaves in the engine's memory pool: its logits in f16 (the
    output matmul's result before conversion) and its activations."""
    return target.n_vocab * 2 * CHUNK_TOKENS + CHUNK_TOKENS * target.n_embd * 4 * 16


def chunk_logits_bytes(target: ModelFacts) -> int:
    """The f32 logits of a full prefill chunk, held while the chunk runs."""
    return target.n_vocab * 4 * CHUNK_TOKENS


def kv_types_for(request: LuceboxRequest) -> tuple[str, ...]:
    if request.target.architecture in F16_KV_ARCHS:
        return ("f16",)
    preferred = [t for t in ("q8_0", "q4_0") if t in request.kv_types]
    return tuple(preferred) or ("q4_0",)


@dataclass(frozen=True)
class _Terms:
    """What the engine allocates besides the attention KV, before it is put on cards."""

    parts: Parts
    ddtree_budget: int | None
    verify_tokens: int
    """Tokens one verification rolls back over: the DDTree budget and one more, at least 16."""
    scoring_bytes: int
    """What PFlash's drafter and its buffers take beyond the target's weights they park."""


@dataclass(frozen=True)
class _Context:
    """The context served and how its attention KV is held."""

    max_ctx: int
    kv_type: str
    largest_ctx: int
    """The largest exact context that fits at ``kv_type``."""
    pool_tokens: int | None
    """The KVFlash pool; None: the whole context is exact on the card."""
    exact: bool
    attention_kv_bytes: int
    wanted_ctx: int
    reason: str


def plan_lucebox(request: LuceboxRequest) -> LuceboxPlan:
    """Context, KV type, KVFlash pool, DDTree budget and every memory term, with reasons."""
    target, budget = request.target, request.budget
    terms = _terms(request)
    cards = request.cards or ((budget.device, budget.vram_free_bytes),)
    loads = device_loads(request.placement, terms.parts, cards)
    room = attention_room(loads)
    context = _context(request, room)
    max_ctx, kv_type, pool = context.max_ctx, context.kv_type, context.pool_tokens
    fits = max_ctx >= min(MIN_CTX, target.native_ctx) and room - context.attention_kv_bytes >= 0
    per_token = kv_bytes_per_token(target, kv_type)
    per_slot = target.recurrent_state_bytes + int(per_token * min(max_ctx, 32768))
    slots = _prefix_slots(budget.host_total_bytes, per_slot)
    max_tokens = max(CTX_PAD, min(MAX_TOKENS_CAP, max_ctx // 4))
    memory = MemoryBytes(
        weights=sum(load.weights for load in loads),
        kv=context.attention_kv_bytes + target.recurrent_state_bytes,
        draft=terms.parts.draft,
        compute=sum(load.compute for load in loads),
        cuda_context=sum(load.cuda_context for load in loads),
        reserve=sum(load.reserve for load in loads),
        available=sum(free for _, free in cards),
        prompt_cache=slots * per_slot,
        # KV pages beyond the KVFlash pool live in host RAM.
        checkpoints=int(max(0, max_ctx - pool) * per_token) if pool is not None else 0,
        prefill_transient=sum(load.transient for load in loads),
    )
    reasons = _reasons(request, terms, context, memory, fits, slots=slots, max_tokens=max_tokens)
    if len(loads) > 1:
        reasons["devices"] = _devices_reason(request.placement, loads, context.attention_kv_bytes)
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
        largest_ctx=context.largest_ctx,
        device_bytes=_device_bytes(loads, context.attention_kv_bytes, memory.total),
    )
    flags = _flags(request, context, terms.ddtree_budget, slots, max_tokens)
    return LuceboxPlan(
        plan, flags, reasons, exact=context.exact and fits, wanted_ctx=context.wanted_ctx
    )


def _terms(request: LuceboxRequest) -> _Terms:
    """Each memory term but the attention KV, in the order the engine allocates them."""
    target, build = request.target, request.build
    weights = max(0, target.weights_bytes - target.host_bytes)
    budget_ddtree = ddtree_budget(request.budget.device) if request.draft else None
    verify_tokens = max(16, (budget_ddtree or 0) + 1)
    ring = N_CAPTURE_LAYERS * target.n_embd * FEATURE_RING_TOKENS * 2
    if request.draft is None and target.architecture in RING_WITH_DRAFT_ONLY_ARCHS:
        ring = 0
    scoring = 0
    if request.prefill != "off":
        scoring = request.prefill_drafter_bytes + PFLASH_SCORING_BYTES - weights
    parts = Parts(
        weights=weights,
        layer_weights=min(weights, target.layer_bytes),
        draft=request.draft.weights_bytes if request.draft else 0,
        draft_runtime=DRAFT_RUNTIME_BYTES if request.draft else 0,
        graph=compute_bytes(target) if build.pool_resident else 0,
        ring=ring,
        rollback=rollback_bytes(target, verify_tokens),
        runtime=build.runtime_bytes,
        tensor_runtime=build.tensor_runtime_bytes,
        draft_card_runtime=build.draft_card_runtime_bytes if request.draft else 0,
        cuda_context=CUDA_CONTEXT_BYTES,
        transient=max(chunk_logits_bytes(target), scoring),
        recurrent=target.recurrent_state_bytes,
    )
    return _Terms(parts, budget_ddtree, verify_tokens, scoring)


def _context(request: LuceboxRequest, room_bytes: int) -> _Context:
    """The context and KV type that fit in ``room_bytes``: exact while the context wanted
    fits, else (a context asked for) a KVFlash pool unless --kv-mode exact forbids it, else
    (none asked) the largest exact one; --kv-mode kvflash with a context pins a pool."""
    target = request.target
    native = target.native_ctx
    wanted = wanted_ctx(request.ctx, native, unasked=native)
    if request.ctx_cap is not None and request.ctx is None:
        wanted = min(wanted, request.ctx_cap)
    types = kv_types_for(request)
    largest = {t: _largest(room_bytes, kv_bytes_per_token(target, t), native) for t in types}
    kv_type = next((t for t in types if largest[t] >= wanted), types[-1])
    pinned = request.kv_mode == "kvflash" and request.ctx is not None
    if pinned:
        kv_type = types[0]  # the pool is small: it keeps the best KV type
    per_token = kv_bytes_per_token(target, kv_type)
    fit = largest[kv_type]
    pool: int | None = None
    exact = fit >= wanted and not pinned
    if exact:
        max_ctx = pad_ctx(wanted) if request.ctx else wanted // CTX_PAD * CTX_PAD
        kv = int(pad_ctx(max_ctx) * per_token)
        reason = f"{max_ctx} tokens with exact attention at {kv_type} KV"
    elif request.ctx is None:
        max_ctx = max(0, fit)
        kv = int(max_ctx * per_token)
        reason = f"{max_ctx} tokens: the largest exact context that fits at {kv_type} KV"
    elif request.kv_mode == "exact":
        max_ctx = pad_ctx(wanted)
        kv = int(max_ctx * per_token)
        reason = (
            f"{max_ctx} tokens asked for with an exact cache (--kv-mode exact); {fit} "
            f"fit in VRAM at {kv_type} KV, and KVFlash (not exact) was not allowed"
        )
    else:  # a context asked for beyond what fits, or --kv-mode kvflash
        max_ctx = pad_ctx(wanted)
        pool = kvflash_pool(fit, max_ctx)
        kv = int(pool * per_token)
        held = (
            f"with KVFlash as asked (--kv-mode kvflash): a {pool}-token pool at {kv_type} KV on "
            "the GPU, the rest paged to host RAM"
            if pinned
            else f"asked for; {fit} fit in VRAM at {kv_type} KV, so KVFlash keeps a "
            f"{pool}-token pool on the GPU and pages the rest to host RAM"
        )
        reason = f"{max_ctx} tokens {held} (sparse attention over the pool, not exact)"
    return _Context(max_ctx, kv_type, fit, pool, exact, kv, wanted, reason)


def _reasons(
    request: LuceboxRequest,
    terms: _Terms,
    context: _Context,
    memory: MemoryBytes,
    fits: bool,
    *,
    slots: int,
    max_tokens: int,
) -> dict[str, str]:
    """Why each memory term and the context are what they are."""
    target, budget, build, parts = request.target, request.budget, request.build, terms.parts
    pool_kept = "kept in the engine's pool" if build.pool_resident else "freed between requests"
    runtime = parts.runtime + parts.draft_runtime
    transient = memory.prefill_transient
    reasons = {
        "engine": "the Lucebox engine (dflash_server): one request at a time (batch 1)",
        "ctx": context.reason,
        "weights": (
            f"{parts.weights / MIB:.0f} MiB on the GPU; the token embeddings "
            f"({target.host_bytes / MIB:.0f} MiB) stay in host RAM"
        ),
        "kv": f"{context.kv_type} for K and V (this build has only the symmetric kernels)"
        + ("; Gemma 4's KV is f16 whatever the flags say" if context.kv_type == "f16" else ""),
        "compute": (
            f"a prefill chunk's f16 logits and activations {compute_bytes(target) / MIB:.0f} MiB "
            f"({pool_kept}), feature ring "
            f"{parts.ring / MIB:.0f} MiB, rollback {parts.rollback / MIB:.0f} MiB (for "
            f"{terms.verify_tokens} verified tokens), graphs and workspaces "
            f"{runtime / MIB:.0f} MiB (fitted for {build.version}); allocated on the first "
            "request, which lucebox sends before ready"
        ),
        "prefill": _prefill_reason(target, request, terms.scoring_bytes, transient),
        "max_tokens": f"{max_tokens}: a reply's default and cap, below --max-ctx {context.max_ctx}",
        "prompt_cache": f"{slots} prefix-cache snapshot slots in host RAM",
    }
    if not fits:
        reasons["fit"] = (
            f"the engine needs {memory.peak / MIB:.0f} MiB at its peak "
            f"({parts.weights / MIB:.0f} MiB weights, {memory.kv / MIB:.0f} MiB KV for "
            f"{context.pool_tokens or context.max_ctx} tokens on the GPU, "
            f"{memory.compute / MIB:.0f} MiB graphs and buffers, {transient / MIB:.0f} MiB "
            f"while a prefill runs, {memory.cuda_context / MIB:.0f} MiB CUDA context); "
            f"{memory.available / MIB:.0f} MiB are free on {budget.device} and "
            f"{memory.reserve / MIB:.0f} MiB stay in reserve"
        )
    if context.pool_tokens is not None:
        reasons["kvflash"] = (
            f"{memory.checkpoints / MIB:.0f} MiB of KV paged to host RAM at full context"
        )
    if terms.ddtree_budget is not None:
        reasons["ddtree"] = f"DDTree budget {terms.ddtree_budget} for {budget.device}"
    return reasons


def _flags(
    request: LuceboxRequest,
    context: _Context,
    budget_ddtree: int | None,
    slots: int,
    max_tokens: int,
) -> LuceboxFlags:
    """The engine's switches for this plan."""
    arch = request.target.architecture
    prefill = {"off": "off", "pflash": "always"}.get(request.prefill, "auto")
    return LuceboxFlags(
        max_ctx=context.max_ctx,
        max_tokens=max_tokens,
        cache_type=None if context.kv_type == "f16" and arch in F16_KV_ARCHS else context.kv_type,
        prefix_cache_slots=slots,
        ddtree_budget=budget_ddtree,
        kvflash_pool=context.pool_tokens,
        prefill=prefill,
        prefill_drafter=request.prefill_drafter,
        sampled_verify=request.draft is not None and arch in SAMPLED_VERIFY_ARCHS,
        placement=request.placement,
    )


def _device_bytes(
    loads: tuple[DeviceLoad, ...], attention_kv: int, total: int
) -> tuple[tuple[str, int], ...]:
    """Each card's resident bytes; the last takes the rounding, so they sum to ``total``."""
    firsts = [(load.label, load.resident(attention_kv)) for load in loads[:-1]]
    return (*firsts, (loads[-1].label, total - sum(b for _, b in firsts)))


def _devices_reason(
    placement: PlacementName, loads: tuple[DeviceLoad, ...], attention_kv: int
) -> str:
    cards = "; ".join(
        f"{load.label}: {load.resident(attention_kv) / MIB:.0f} MiB (weights "
        f"{load.weights / MIB:.0f}, draft {load.draft / MIB:.0f}, KV "
        f"{(attention_kv * load.kv_share + load.state) / MIB:.0f}, graphs and buffers "
        f"{load.compute / MIB:.0f}, CUDA context {load.cuda_context / MIB:.0f}) of "
        f"{load.free_bytes / MIB:.0f} free"
        for load in loads
    )
    return f"{PLACEMENT_TEXT[placement]}: {cards}"


def _prefill_reason(
    target: ModelFacts, request: LuceboxRequest, scoring: int, transient: int
) -> str:
    logits = f"{chunk_logits_bytes(target) / MIB:.0f} MiB of f32 logits while a prefill chunk runs"
    if request.prefill == "off":
        return f"{logits}, freed after it"
    if request.prefill == "auto":
        mode = (
            "PFlash auto (the engine's --prefill-compression auto): a prompt of "
            f"{PREFILL_THRESHOLD_TOKENS} tokens or more is cut to about {PREFILL_KEEP_PERCENT}% "
            "of its tokens before the target reads it (lossy), a shorter one never"
        )
    else:
        mode = (
            "PFlash on every prompt (the engine's --prefill-compression always): a short prompt "
            "is compressed too, and every request parks the target and loads the drafter "
            "(so even a short question waits for that before its first token); --prefill auto "
            "compresses only long prompts"
        )
    drafter = (
        f"PFlash's drafter ({request.prefill_drafter_bytes / MIB:.0f} MiB) with its scoring "
        f"buffers while it scores a prompt, the target's weights parked off the GPU meanwhile"
        + (f" ({scoring / MIB:.0f} MiB more than they free)" if scoring > 0 else "")
    )
    return (
        f"{mode}. Up to {transient / MIB:.0f} MiB on top only while a prefill runs: "
        f"{logits}; {drafter}"
    )


def kvflash_pool(fits_tokens: int, max_ctx: int) -> int:
    """The KVFlash pool in tokens: what fits on the card, within the engine's floor and cap,
    never more than the context."""
    return max(KVFLASH_FLOOR, min(KVFLASH_CAP, fits_tokens, max_ctx))


def _largest(room: int, per_token: float, native: int) -> int:
    if room <= 0:
        return 0
    return min(native, int(room / max(per_token, 1.0)) // CTX_PAD * CTX_PAD)


def _prefix_slots(host_total_bytes: int, per_slot_bytes: int) -> int:
    if host_total_bytes <= 0 or per_slot_bytes <= 0:
        return 1
    share = host_total_bytes // PREFIX_CACHE_RAM_SHARE
    return max(1, min(PREFIX_CACHE_MAX_SLOTS, share // per_slot_bytes))
