"""What each known Lucebox engine build holds on the GPU beyond the terms the plan models from
the model's shapes, fitted per build on the GPU (`benchmarks/device/drive.sh
lucebox_memory_by_stage fit`), pure.

Two builds of the same source family measure differently with the same model and flags: on
two H200s (driver 580.159.04, CUDA 13.0) 4cf58a04 held 516 MiB less on one card after the
warm-up than 62880e20 had on a single H200, with its f32-logits peak the same 478 MiB above
that; under tensor parallel it held 836 MiB more per card than the split of the one-card terms
gives (its per-card communication buffers and mirrored graphs). Which part of the one-card gap
is the build and which the host (each fit ran on its own lease) is still to be measured on one
host: both fits stay within 5% of what their runs showed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lucebox.engine.core.units import MIB


@dataclass(frozen=True)
class BuildMemory:
    version: str
    runtime_bytes: int
    """Graphs, workspaces and cuBLAS beyond a plain CUDA context, on the target's card, once
    a request has run."""
    pool_resident: bool
    """Whether a prefill chunk's f16 logits and activations stay in the engine's pool between
    requests (else they count only while a prefill runs, under its f32 logits' peak)."""
    tensor_runtime_bytes: int
    """More on each card when the target is split by tensor across two."""
    draft_card_runtime_bytes: int
    """The draft's graphs and workspaces on a card of its own (the draft apart), beyond its
    weights and a CUDA context."""
    fitted: str
    """Where and how the figures were measured."""


BUILD_MEMORY: tuple[BuildMemory, ...] = (
    BuildMemory(
        "62880e20",
        runtime_bytes=447 * MIB,
        pool_resident=True,
        tensor_runtime_bytes=0,
        draft_card_runtime_bytes=139 * MIB,
        fitted=(
            "the generated qwen35 (n_embd 1024, vocabulary 248,320, f16) on an H200: 2148 MiB "
            "after lucebox's warm-up at 4096 tokens of q8_0 KV; the same fit held at 131072 "
            "tokens, with a KVFlash pool and with PFlash "
            "(benchmarks/results/h200-lucebox-memory-by-stage.json); "
            "the draft's own card not measured (the one-card draft's graphs)"
        ),
    ),
    BuildMemory(
        "4cf58a04",
        runtime_bytes=205 * MIB,
        pool_resident=False,
        tensor_runtime_bytes=840 * MIB,
        draft_card_runtime_bytes=96 * MIB,
        fitted=(
            "the generated qwen35 on two H200s: 1632 MiB after the warm-up at 4096 tokens of "
            "q8_0 KV, 1886 with the draft at 32768, 2362 per card in tensor parallel, peaks "
            "478 MiB above (benchmarks/results/"
            "h200x2-lucebox-memory-by-stage-fit-4cf58a04.json); the draft's own "
            "card 830 MiB (benchmarks/results/h200x2-two-gpus-planned-vs-run-both-engines.json)"
        ),
    ),
)
"""Per known source (engine/engines/lucebox.py), oldest first."""


UNKNOWN_BUILD = BuildMemory(
    "unknown",
    runtime_bytes=max(fit.runtime_bytes for fit in BUILD_MEMORY),
    pool_resident=True,
    tensor_runtime_bytes=max(fit.tensor_runtime_bytes for fit in BUILD_MEMORY),
    draft_card_runtime_bytes=max(fit.draft_card_runtime_bytes for fit in BUILD_MEMORY),
    fitted="the largest of the known builds' fits (a plan that errs high does not run out)",
)
"""For a build lucebox has no fit for (not built yet, or newer than its table)."""


def build_memory(version: str | None) -> BuildMemory:
    """The fit of the build whose version string names a known commit, else
    :data:`UNKNOWN_BUILD`."""
    for fit in BUILD_MEMORY:
        if version and re.search(rf"\b{fit.version}\b", version):
            return fit
    return UNKNOWN_BUILD
