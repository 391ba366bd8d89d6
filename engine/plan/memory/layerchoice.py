"""Where the weights go when they leave too little room for context: GPU layers for a dense
model, experts kept on the CPU for an MoE, and the largest context per KV type that leaves."""

from __future__ import annotations

from lucebox.engine.plan.memory.ctxchoice import largest_ctx, wanted_ctx
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.memory.sizes import compute_bytes, kv_bytes


def place_layers(
    request: PlanRequest,
    room_after_weights: int,
    overhead: int,
    kv_choices: list[str],
    min_ctx: int,
) -> tuple[int, int, dict[str, int], str]:
    """GPU layers and CPU experts, the largest context per KV type they leave, and why."""
    target, budget = request.target, request.budget
    largest = {t: largest_ctx(room_after_weights, request, t) for t in kv_choices}
    if not budget.is_gpu:
        return 0, 0, largest, "no GPU: everything runs on the CPU"
    # An MoE leaves experts on the CPU for an agent-sized context (or the one asked for): a
    # token reads only a few experts, so in system RAM they cost little speed. A dense model's
    # layers on the CPU slow every token, so it offloads only for the smallest usable context.
    offload_ctx = wanted_ctx(request.ctx, target.native_ctx) if target.expert_bytes else min_ctx
    best_kv = max(largest, key=lambda t: largest[t])
    offload_kv = "q8_0" if target.expert_bytes and "q8_0" in largest else best_kv
    if largest[offload_kv] >= offload_ctx:
        return -1, 0, largest, "all layers on the GPU"
    n_gpu_layers, n_cpu_moe, offloaded = _offload(request, overhead, offload_ctx)
    room_after_weights += offloaded
    largest = {t: largest_ctx(room_after_weights, request, t) for t in kv_choices}
    why = (
        f"{n_cpu_moe} layers' experts stay on the CPU to make room for a {offload_ctx}-token "
        "context (a token reads only a few experts: in system RAM they cost little speed)"
        if n_cpu_moe
        else f"the weights do not fit with a {min_ctx}-token context: "
        f"{n_gpu_layers} of {target.n_layer} layers on the GPU"
    )
    return n_gpu_layers, n_cpu_moe, largest, why


def _offload(request: PlanRequest, overhead: int, min_ctx: int) -> tuple[int, int, int]:
    """GPU layers (dense) or CPU-expert layers (MoE) so the weights leave room for min_ctx.

    Returns (n_gpu_layers, n_cpu_moe, bytes moved off the GPU).
    """
    target = request.target
    need = (
        kv_bytes(target, min_ctx, "q8_0", request.parallel)
        + compute_bytes(target, min_ctx)
        + overhead
        + target.weights_bytes
        - request.budget.vram_free_bytes
    )
    if target.expert_bytes:
        per_layer = target.expert_bytes // max(target.n_layer, 1)
        layers = min(target.n_layer, -(-need // max(per_layer, 1)))
        return -1, layers, layers * per_layer
    per_layer = target.layer_bytes // max(target.n_layer, 1)
    layers_off = min(target.n_layer, -(-need // max(per_layer, 1)))
    return target.n_layer - layers_off, 0, layers_off * per_layer
