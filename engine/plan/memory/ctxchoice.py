"""The context and KV cache type a plan chooses: the largest padded context that fits each KV
type, the most precise type that gives enough, and the context itself (as asked, capped, or the
largest that fits), each with why."""

from __future__ import annotations

from lucebox.engine.plan.memory.request import KV_PAIRS, PlanRequest
from lucebox.engine.plan.memory.sizes import (
    CTX_PAD,
    compute_bytes,
    compute_copies,
    kv_bytes,
    pad_ctx,
)

MIN_CTX = 2048
ENOUGH_CTX = 32768
"""The most precise KV type that gives this much context (or the native maximum) is used:
quality first, and 32K tokens hold a long chat or a mid-size agent session."""


def wanted_ctx(asked: int | None, native_ctx: int, *, unasked: int = ENOUGH_CTX) -> int:
    """The context every plan aims for: the one asked for, else ``unasked``; never past native.

    llama-server's plans leave ``unasked`` at ENOUGH_CTX (more context costs KV that a better
    KV type or quant spends better); the Lucebox engine's pass the native context on purpose
    (KVFlash bounds the KV it keeps on the GPU, so a long context costs it little).
    """
    return min(asked or unasked, native_ctx)


def largest_ctx(room: int, request: PlanRequest, kv_type: str) -> int:
    """Largest padded context whose KV (+ draft KV + attention scratch) fits in ``room``.

    The draft's KV cache has the target's type (``-ctkd/-ctvd`` say so on the command line):
    an f16 draft cache next to a quantized target cache would spend the memory the
    quantization saved.
    """
    facts, draft, parallel = request.target, request.draft, request.parallel
    lo, hi = 0, pad_ctx(facts.native_ctx) // CTX_PAD
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ctx = mid * CTX_PAD
        need = kv_bytes(facts, ctx, kv_type, parallel, request.swa_full)
        need += compute_bytes(facts, ctx, kv_type, request.swa_full) * compute_copies(
            request.budget
        )
        if draft is not None:
            need += kv_bytes(draft, ctx, kv_type, parallel) + compute_bytes(draft, ctx, kv_type)
        if len(request.budget.devices) > 1:
            # Each device takes whole layers: up to one layer (weights + KV) per device is
            # lost to rounding when the layers are dealt out (``devicesplit._slot_counts``).
            layer = facts.layer_bytes + kv_bytes(facts, ctx, kv_type, parallel, request.swa_full)
            need += len(request.budget.devices) * layer // max(facts.n_layer, 1)
        if need <= room:
            lo = mid
        else:
            hi = mid - 1
    return min(lo * CTX_PAD, facts.native_ctx)


def choose_kv_type(largest: dict[str, int], wanted: int) -> str:
    """The most precise KV type that gives ``wanted`` tokens, else the one that gives most."""
    order = [t for t in KV_PAIRS if t in largest]
    for kv_type in order:
        if largest[kv_type] >= wanted:
            return kv_type
    return max(order, key=lambda t: largest[t])


def kv_reason(kv_type: str, largest: dict[str, int], native_ctx: int) -> str:
    options = ", ".join(f"{t}: {n} tokens" for t, n in largest.items())
    if kv_type == "f16":
        return f"f16 (full precision) already gives enough context ({options})"
    return f"{kv_type} to fit more context ({options}; native {native_ctx})"


def choose_ctx(
    request: PlanRequest, ctx_fit: int, kv_type: str, min_ctx: int
) -> tuple[int, bool, str]:
    """The context, whether the plan fits, and why: a context the user asked for is kept or
    refused with the numbers, never shrunk."""
    native = request.target.native_ctx
    fits = ctx_fit >= min_ctx
    if request.ctx is not None:
        ctx = request.ctx
        if ctx > native:
            return (
                ctx,
                False,
                (
                    f"{ctx} tokens asked, but the model was trained for {native}: "
                    f"ask for at most {native}"
                ),
            )
        if pad_ctx(ctx) > ctx_fit and ctx > ctx_fit:
            return (
                ctx,
                False,
                (
                    f"{ctx} tokens asked, but at most {ctx_fit} fit with {kv_type} KV cache; "
                    f"free {'VRAM' if request.budget.is_gpu else 'RAM'}, pick a smaller model "
                    "or quantization, or ask for less"
                ),
            )
        return ctx, fits, f"{ctx} tokens as asked"
    ctx = ctx_fit if fits else min_ctx
    why = "the model's native maximum" if ctx_fit >= native else "the largest that fits"
    if request.ctx_cap is not None and ctx > request.ctx_cap:
        ctx = request.ctx_cap // CTX_PAD * CTX_PAD
        fits = fits and ctx >= min_ctx
        why = f"at most {request.ctx_cap} after the engine ran out of memory at a larger one"
    if request.read_cap_ctx is not None and fits and ctx > request.read_cap_ctx:
        ctx = max(request.read_cap_ctx // CTX_PAD * CTX_PAD, min(min_ctx, ctx))
        why = request.read_cap_reason
    return ctx, fits, f"{ctx} tokens: {why}"


def too_slow(request: PlanRequest, fits: bool, ctx: int, min_ctx: int) -> bool:
    """A chosen context the CPU cannot read in the allowed time even at its smallest."""
    cap = request.read_cap_ctx
    return request.ctx is None and fits and cap is not None and cap < min_ctx <= ctx


def too_slow_reason(request: PlanRequest, min_ctx: int) -> str:
    return (
        f"even a {min_ctx}-token context takes longer than allowed to read: "
        f"{request.read_cap_reason}"
    )
