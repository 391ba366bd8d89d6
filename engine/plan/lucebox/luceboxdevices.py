"""The Lucebox engine on two GPUs: where each memory term goes, per card, and which placement
serves, pure.

Three placements, each only where the built engine's ``--help`` offers its flags (the build's
features) and the launch has two cards:

- ``one``: target and draft on the card with the most free memory; the other stays idle.
- ``draft-apart``: the target on that card, the DFlash draft on the other (``--target-device
  cuda:0 --draft-device cuda:1``): the draft's weights, graphs and its f32 mirror of the
  target's captured features leave the first card, whose room goes to KV. Needs a draft.
- ``tensor``: the target split by tensor across both (``--target-devices cuda:0,cuda:1
  --target-split-mode tensor``; 4cf58a04 and later, dense qwen35 only). Read from
  ``src/qwen35/qwen35_tensor_parallel.cpp``: every layer's attention, FFN and delta-net
  matrices, the attention KV (by heads) and the delta-net state are split evenly; the output
  matrix (its argmax runs in the graph) and everything else is mirrored on both cards. The
  draft stays on the first card (the engine's default draft device).

Each card pays its own CUDA context; in tensor mode each also runs the whole graph (its
workspace and a prefill chunk's logits), so those count on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lucebox.engine.core.units import MIB

PlacementName = Literal["one", "draft-apart", "tensor"]
PLACEMENTS: tuple[PlacementName, ...] = ("one", "draft-apart", "tensor")
"""In the order the prior prefers them: the fewer bytes cross cards per decoded token, the
earlier (one card: none; draft apart: the captured features once per step; tensor: two
all-reduces per layer per step)."""
PlacementMode = Literal["auto", "one", "draft-apart", "tensor"]
PLACEMENT_MODES: tuple[PlacementMode, ...] = ("auto", *PLACEMENTS)
FEATURE_OF: dict[PlacementName, str] = {
    "draft-apart": "draft-device",
    "tensor": "target-split-mode",
}
"""The build feature (a flag its ``--help`` lists) each two-card placement needs."""
TENSOR_ARCHS = ("qwen35",)
"""Targets the engine splits by tensor ("tensor parallelism is currently supported only for
dense qwen35", src/common/feature_gate.cpp)."""
PLACEMENT_TEXT: dict[PlacementName, str] = {
    "one": "one card",
    "draft-apart": "the draft on the second card",
    "tensor": "tensor parallel across both cards",
}


@dataclass(frozen=True)
class Parts:
    """The engine's memory terms before they are put on cards (bytes)."""

    weights: int
    """The target's weights on the GPU (its token embeddings stay in host RAM)."""
    layer_weights: int
    """Those of its repeating layers: what tensor parallel splits."""
    draft: int
    draft_runtime: int
    graph: int
    """A prefill chunk's logits and activations, kept in the engine's pool."""
    ring: int
    rollback: int
    runtime: int
    tensor_runtime: int
    """More on each card under tensor parallel (the build's fit)."""
    draft_card_runtime: int
    """The draft's graphs on a card of its own (the build's fit)."""
    cuda_context: int
    transient: int
    recurrent: int


@dataclass(frozen=True)
class DeviceLoad:
    """What one card holds of a placement, the attention KV apart (its share of it)."""

    label: str
    free_bytes: int
    weights: int
    draft: int
    compute: int
    cuda_context: int
    state: int
    """Its share of the delta-net state."""
    transient: int
    kv_share: float
    """Its share of the attention KV."""

    @property
    def reserve(self) -> int:
        return max(64 * MIB, int(self.free_bytes * 0.005))

    @property
    def fixed(self) -> int:
        """What it holds at its peak before any attention KV."""
        return (
            self.weights + self.draft + self.compute + self.cuda_context + self.state
            + self.transient
        )  # fmt: skip

    @property
    def room(self) -> int:
        return self.free_bytes - self.reserve - self.fixed

    def resident(self, attention_kv: int) -> int:
        """What nvidia-smi shows for the engine on this card between requests."""
        return (
            self.weights + self.draft + self.compute + self.cuda_context + self.state
            + int(attention_kv * self.kv_share)
        )  # fmt: skip


def device_loads(
    placement: PlacementName, parts: Parts, cards: Sequence[tuple[str, int]]
) -> tuple[DeviceLoad, ...]:
    """Each card's load under ``placement``; ``cards`` are (label, free bytes), the first the
    target's (one card: only it)."""
    first = cards[0]
    if placement == "one":
        compute = parts.graph + parts.ring + parts.rollback + parts.runtime + parts.draft_runtime
        return (
            DeviceLoad(first[0], first[1], parts.weights, parts.draft, compute,
                       parts.cuda_context, parts.recurrent, parts.transient, 1.0),
        )  # fmt: skip
    second = cards[1]
    if placement == "draft-apart":
        compute = parts.graph + parts.ring + parts.rollback + parts.runtime
        return (
            DeviceLoad(first[0], first[1], parts.weights, 0, compute, parts.cuda_context,
                       parts.recurrent, parts.transient, 1.0),
            DeviceLoad(second[0], second[1], 0, parts.draft, parts.draft_card_runtime,
                       parts.cuda_context, 0, 0, 0.0),
        )  # fmt: skip
    n = 2
    mirrored = parts.weights - parts.layer_weights
    weights = mirrored + parts.layer_weights // n
    compute = parts.graph + parts.ring + parts.rollback // n + parts.runtime + parts.tensor_runtime
    state = parts.recurrent // n
    return (
        DeviceLoad(first[0], first[1], weights, parts.draft, compute + parts.draft_runtime,
                   parts.cuda_context, parts.recurrent - state, parts.transient, 1 / n),
        DeviceLoad(second[0], second[1], weights, 0, compute, parts.cuda_context, state,
                   parts.transient, 1 / n),
    )  # fmt: skip


def attention_room(loads: Sequence[DeviceLoad]) -> int:
    """Bytes of attention KV the placement holds: limited by the card that fills first
    (negative when a card cannot even hold its fixed part)."""
    rooms = [load.room for load in loads]
    if min(rooms) < 0:
        return min(rooms)
    return min(int(load.room / load.kv_share) for load in loads if load.kv_share > 0)


def offered(
    features: Sequence[str], n_cards: int, has_draft: bool, architecture: str, pflash: bool
) -> tuple[PlacementName, ...]:
    """The placements this build, these cards and this launch allow, in the prior's order
    (the engine refuses tensor parallel with PFlash: "does not yet support prefill
    compression")."""
    found: list[PlacementName] = ["one"]
    if n_cards < 2:
        return tuple(found)
    if has_draft and FEATURE_OF["draft-apart"] in features:
        found.append("draft-apart")
    if architecture in TENSOR_ARCHS and FEATURE_OF["tensor"] in features and not pflash:
        found.append("tensor")
    return tuple(found)


@dataclass(frozen=True)
class Candidate:
    """One placement as planned: what it buys, and its decode where measured."""

    name: PlacementName
    fits: bool
    exact: bool
    """It holds the wanted context with exact attention (no KVFlash pool)."""
    ctx: int
    """The largest exact context it holds."""
    decode_tok_s: float | None = None

    def text(self) -> str:
        measured = f", {self.decode_tok_s:.0f} tok/s measured" if self.decode_tok_s else ""
        held = f"{self.ctx} tokens exact" if self.fits else "does not fit"
        return f"{PLACEMENT_TEXT[self.name]}: {held}{measured}"


PLACEMENT_MARGIN = 0.05
"""A placement later in the prior's order (it ties up the second card, or crosses it more) must
decode this much faster than an earlier one: on two H200s the draft on card 1 measured 3,024
tok/s against one card's 2,909 (+4%) while two runs of either spread by 8-15%."""


def choose_placement(candidates: Sequence[Candidate], wanted_ctx: int) -> tuple[Candidate, str]:
    """The placement that serves and why: of those that hold the wanted context exactly, the
    fastest measured one; none measured, the prior's first; none holding it, the one that
    buys the most context."""
    listed = "; ".join(c.text() for c in candidates)
    holding = [c for c in candidates if c.fits and c.exact]
    measured = [c for c in holding if c.decode_tok_s]
    if measured:
        best = measured[0]
        for later in measured[1:]:  # the prior's order: a later one must win by the margin
            if (later.decode_tok_s or 0.0) > (best.decode_tok_s or 0.0) * (1 + PLACEMENT_MARGIN):
                best = later
        why = (
            f"the fastest measured of those that hold {wanted_ctx} tokens exactly (one that "
            f"uses more of the cards wins only by more than {PLACEMENT_MARGIN:.0%})"
        )
    elif holding:
        best = holding[0]
        why = (
            f"it holds {wanted_ctx} tokens exactly; decode not measured on these cards yet, so "
            "the prior decides: the fewer bytes cross cards per token the better (one card "
            "none, the draft apart its captured features once per step, tensor parallel two "
            "all-reduces per layer per step)"
        )
    else:
        fitting = [c for c in candidates if c.fits]
        if not fitting:
            return candidates[0], f"{PLACEMENT_TEXT[candidates[0].name]}: none fits ({listed})"
        best = max(fitting, key=lambda c: c.ctx)
        why = f"none holds {wanted_ctx} tokens exactly; it buys the most context"
    return best, f"{PLACEMENT_TEXT[best.name]}: {why} ({listed})"
