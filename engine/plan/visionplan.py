"""Vision in the plan: which projector serves (if any), what it costs, and why.

``--vision auto`` serves a projector only when the plan still gives the context (and KV type)
it gives without it, trying the most precise projector first; ``on`` serves it or refuses;
``off`` frees its memory. A projector that does not match the model is refused by name with
the stable problem code ``mmproj-mismatch``. Pure but for reading projector headers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.address import is_loopback
from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.units import MIB
from lucebox.engine.models.projector import (
    MISMATCH_CODE,
    ProjectorInfo,
    embedded_vision,
    mismatch,
    precision_rank,
    projectors_beside,
    read_projector,
)
from lucebox.engine.plan.enginechoice import NO_VISION
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.memory.memory import Plan, make_plan
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.memory.sizes import image_compute_bytes
from lucebox.engine.plan.modelfiles import ModelFile
from lucebox.engine.plan.options import Resolved


@dataclass(frozen=True)
class Vision:
    served: bool
    projector: ProjectorInfo | None
    """The projector served, or the one that was weighed and left out."""
    reason: str
    memory_bytes: int = 0
    """What the projector costs where it would run (its weights and one image's buffer)."""

    @property
    def path(self) -> str | None:
        return str(self.projector.path) if self.served and self.projector else None

    def to_json(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "projector": self.path,
            "reason": self.reason,
            "projector_type": self.projector.projector_type if self.projector else None,
            "memory_bytes": self.memory_bytes,
        }


ENGINE_WITH_PROJECTOR = (
    "with a projector loaded llama-server turns off context shift and --cache-reuse, and makes "
    "no context checkpoint in a batch that holds an image's tokens; a cached prompt prefix is "
    "still reused"
)
"""What the pinned llama-server changes once ``--mmproj`` is loaded (server-context.cpp)."""

NO_PROJECTOR = Vision(False, None, "no projector: pass --mmproj PATH to serve images")


def projector_bytes(projector: ProjectorInfo, *, on_gpu: bool) -> int:
    """What serving it costs on the device: its weights and one image's compute buffer."""
    compute = image_compute_bytes(
        projector.image_size, projector.patch_size, projector.n_embd, projector.n_ff,
        on_gpu=on_gpu,
    )  # fmt: skip
    return projector.weights_bytes + compute


def _cost_text(projector: ProjectorInfo, *, on_gpu: bool) -> str:
    compute = projector_bytes(projector, on_gpu=on_gpu) - projector.weights_bytes
    stand_in = f" ({projector.stand_in})" if projector.stand_in else ""
    return (
        f"{projector.path.name} ({projector.projector_type}): "
        f"{projector.weights_bytes / MIB:.0f} MiB weights + {compute / MIB:.0f} MiB for one "
        f"{projector.image_size}px image{stand_in}"
    )


def _found(
    resolved: Resolved, target: ModelFile, known: tuple[ProjectorInfo, ...]
) -> tuple[list[ProjectorInfo], list[str], GuardRefusal | None]:
    """The projectors to weigh (named, else beside the weights and ``known`` from the model's
    Hub repo, most precise first), why others were left, and the refusal of a named one that
    is not this model's."""
    width = target.info.embedding_length if target.info is not None else None
    if resolved.mmproj:
        # Absolute: the engine does not run in the folder a relative path was given in.
        path = Path(resolved.mmproj).expanduser().absolute()
        named = read_projector(path)
        why = f"{path} does not exist" if not path.is_file() else mismatch(named, path, width)
        if why is not None or named is None:
            refused = GuardRefusal(
                why or f"{path.name} is not a vision projector",
                hint="pass the mmproj file made for this model, or --vision off",
                problem_codes=(MISMATCH_CODE,),
            )
            return [], [], refused
        return [named], [], None
    beside = projectors_beside(target.path) if target.present else ()
    # A file of the repo already beside the weights is the one read from disk.
    candidates = [*((path, read_projector(path)) for path in beside)]
    candidates += [(k.path, k) for k in known if k.path.name not in {p.name for p in beside}]
    found, left = [], []
    for path, projector in sorted(candidates, key=lambda c: precision_rank(c[0].name)):
        why = mismatch(projector, path, width)
        if why is None and projector is not None:
            found.append(projector)
        else:
            left.append(why or path.name)
    return found, left, None


def _none_found(target: ModelFile, left: list[str]) -> str:
    if target.present and embedded_vision(target.path):
        return (
            f"not served: {target.path.name} holds its vision tensors inside the one model file "
            "(as Ollama's own vision models do), and llama-server reads images only through a "
            "projector in a file of its own: pass --mmproj PATH (the model's mmproj GGUF)"
        )
    return "; ".join([NO_PROJECTOR.reason, *left])


URL_FETCH = (
    "llama-server fetches any http(s) image URL a client names (it has no switch for it): off "
    "loopback any client could make this machine fetch URLs"
)


def _url_fetch_refusal(resolved: Resolved) -> str | None:
    """Why images are not served on this address; None on loopback or when allowed."""
    if is_loopback(resolved.host) or resolved.image_urls:
        return None
    return f"{URL_FETCH} (--host {resolved.host})"


def choose_vision(
    request: PlanRequest,
    resolved: Resolved,
    target: ModelFile,
    known: tuple[ProjectorInfo, ...] = (),
    serve: Callable[[PlanRequest], Plan] = make_plan,
) -> tuple[Vision, PlanRequest, GuardRefusal | None]:
    """The vision served with this memory request, the request that holds it, and the refusal
    when --vision on cannot be served or a named projector does not match. ``known`` are the
    projectors of the model's Hub repo, where the store keeps (or will keep) them. ``serve``
    is the plan a launch serves from a request (its speculation chosen): the choice weighs
    plans without a draft, and the reason quotes the contexts each choice serves."""
    if resolved.vision == "off":
        return Vision(False, None, f"off ({resolved.vision_from})"), request, None
    found, left, refused = _found(resolved, target, known)
    if refused is not None:
        return Vision(False, None, f"refused: {refused.message}"), request, refused
    exposed = _url_fetch_refusal(resolved) if found else None
    if exposed is not None:
        vision, refusal = _kept_off_address(resolved, found[0], exposed, request.budget.is_gpu)
        return vision, request, refusal
    if not found:
        vision, refusal = _none_found_vision(resolved, target, left)
        return vision, request, refusal
    return _weigh_projectors(request, resolved, found, serve)


def _kept_off_address(
    resolved: Resolved, projector: ProjectorInfo, exposed: str, on_gpu: bool
) -> tuple[Vision, GuardRefusal | None]:
    """A projector not served because its URL fetching would reach beyond loopback; refused
    under --vision on."""
    hint = "set model.image_urls true to serve images anyway, or serve on 127.0.0.1"
    cost_bytes = projector_bytes(projector, on_gpu=on_gpu)
    if resolved.vision == "on":
        refusal = GuardRefusal(f"vision is on ({resolved.vision_from}) but {exposed}", hint=hint)
        return Vision(False, projector, f"refused: {exposed}", cost_bytes), refusal
    return Vision(False, projector, f"not served: {exposed}; {hint}", cost_bytes), None


def _none_found_vision(
    resolved: Resolved, target: ModelFile, left: list[str]
) -> tuple[Vision, GuardRefusal | None]:
    """No projector to weigh: why, and the refusal under --vision on."""
    if resolved.vision != "on":
        return replace(NO_PROJECTOR, reason=_none_found(target, left)), None
    refusal = GuardRefusal(
        f"vision is on ({resolved.vision_from}) but the model has no projector that "
        + ("matches it: " + "; ".join(left) if left else "lucebox can find"),
        hint="pass --mmproj PATH (the model's mmproj GGUF), or --vision auto",
        problem_codes=(MISMATCH_CODE,) if left else (),
    )
    return NO_PROJECTOR, refusal


def _holding(request: PlanRequest, projector: ProjectorInfo) -> PlanRequest:
    """``request`` with the projector's memory in it."""
    on_gpu = request.budget.is_gpu
    return replace(
        request,
        projector_bytes=projector_bytes(projector, on_gpu=on_gpu),
        projector_reason=f"vision projector {_cost_text(projector, on_gpu=on_gpu)}",
    )


def _weigh_projectors(
    request: PlanRequest,
    resolved: Resolved,
    found: list[ProjectorInfo],
    serve: Callable[[PlanRequest], Plan],
) -> tuple[Vision, PlanRequest, GuardRefusal | None]:
    """The first projector, most precise first, that keeps the plan's context, KV type and
    layers (under --vision on, the first that fits); else the last one, left out."""
    on_gpu = request.budget.is_gpu
    plain = make_plan(request)
    asked_ctx = wanted_ctx(request.ctx, request.target.native_ctx)
    wanted = min(plain.ctx, asked_ctx)
    for projector in found:
        held = _holding(request, projector)
        planned = make_plan(held)
        keeps = planned.fits and planned.ctx >= wanted
        keeps = keeps and planned.cache_type_k == plain.cache_type_k
        keeps = keeps and not _layers_moved(planned, plain)
        if keeps or (resolved.vision == "on" and planned.fits):
            why = (
                _served_why(serve(held), serve(request), asked_ctx)
                if keeps
                else f"served ({resolved.vision_from})"
            )
            reason = f"{why}; {_cost_text(projector, on_gpu=on_gpu)}; {ENGINE_WITH_PROJECTOR}"
            return Vision(True, projector, reason, held.projector_bytes), held, None
    vision, refusal = _left_out(request, resolved, found[-1], plain, serve)
    return vision, request, refusal


def _left_out(
    request: PlanRequest,
    resolved: Resolved,
    projector: ProjectorInfo,
    plain: Plan,
    serve: Callable[[PlanRequest], Plan],
) -> tuple[Vision, GuardRefusal | None]:
    """The projector not served, with what serving it would cost; refused under --vision on."""
    held = _holding(request, projector)
    planned = make_plan(held)
    costs = _cost_text(projector, on_gpu=request.budget.is_gpu)
    moved = _layers_moved(planned, plain)
    if not planned.fits:
        cost = f"{costs} does not fit beside the model"
    elif moved:
        cost = f"{costs} would move {moved} off the GPU (slower decoding)"
    else:
        cost = _context_cost(costs, serve(held), serve(request))
    if resolved.vision == "on":
        refusal = GuardRefusal(
            f"vision is on ({resolved.vision_from}) but {cost}",
            hint="free GPU memory, pick a smaller quant, or pass --vision auto",
        )
        return Vision(False, projector, f"refused: {cost}", held.projector_bytes), refusal
    reason = f"not served: {cost}; pass --vision on to serve it"
    return Vision(False, projector, reason, held.projector_bytes), None


def _layers_moved(planned: Plan, plain: Plan) -> str:
    """The weights serving the projector would move off the GPU ('' when none): auto never
    trades decode speed for vision (a 16 GB card's qwen3.6-27b plan kept 54 of 64 layers with
    it, 59 without). ``n_gpu_layers`` -1 is all of them."""
    every_before, every_after = plain.n_gpu_layers < 0, planned.n_gpu_layers < 0
    if not every_after and (every_before or planned.n_gpu_layers < plain.n_gpu_layers):
        kept = "all" if every_before else str(plain.n_gpu_layers)
        return f"layers ({planned.n_gpu_layers} on the GPU instead of {kept})"
    if planned.n_cpu_moe > plain.n_cpu_moe:
        return f"the experts of {planned.n_cpu_moe - plain.n_cpu_moe} more layers"
    return ""


def _context_cost(costs: str, with_it: Plan, without: Plan) -> str:
    """What serving the projector would cost, from the plans served with it and without it."""
    if not with_it.fits:  # a draft the user forced may not fit beside it
        return f"{costs} does not fit beside the model"
    return (
        f"{costs} would leave {with_it.ctx} tokens with {with_it.cache_type_k} KV instead of "
        f"{without.ctx} with {without.cache_type_k}"
    )


def _served_why(served: Plan, without: Plan, wanted: int) -> str:
    """Why auto serves a projector that keeps the context asked for (or, none asked, the
    32K lucebox aims for), from the plans served with it and with --vision off: the tokens or
    the KV precision it costs are said rather than hidden (a 24 GB card can give 82K without
    it and 38K with it)."""
    kv_kept = served.cache_type_k == without.cache_type_k
    if served.ctx >= without.ctx and kv_kept:
        return "served: it costs no context"
    leaves, instead = f"{served.ctx} tokens", f"{without.ctx}"
    if not kv_kept:
        leaves += f" with {served.cache_type_k} KV"
        instead += f" with {without.cache_type_k} KV"
    enough = f", at least the {wanted} wanted" if served.ctx >= wanted else ""
    rest = "the rest" if served.ctx < without.ctx else f"{without.cache_type_k} KV"
    return (
        f"served: it leaves {leaves} ({instead} without it){enough}; pass --vision off for {rest}"
    )


def lucebox_vision(
    resolved: Resolved, target: ModelFile, known: tuple[ProjectorInfo, ...] = ()
) -> tuple[Vision, GuardRefusal | None]:
    """What the plan says about vision when the Lucebox engine serves (it has none), and the
    refusal of a named projector that is not this model's."""
    if resolved.vision == "off":
        return Vision(False, None, f"off ({resolved.vision_from})"), None
    found, _, refused = _found(resolved, target, known)
    if refused is not None:
        return Vision(False, None, f"refused: {refused.message}"), refused
    if not found:
        return Vision(False, None, f"not served: {NO_VISION}, and no projector was found"), None
    reason = (
        f"not served: {NO_VISION}; --vision on would move the launch to llama-server (without "
        f"DDTree and KVFlash) and serve {_cost_text(found[0], on_gpu=True)}"
    )
    return Vision(False, found[0], reason, projector_bytes(found[0], on_gpu=True)), None
