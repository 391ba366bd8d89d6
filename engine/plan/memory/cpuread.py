"""How much context a CPU can read in the time the user allows (``model.cpu_read_s``).

Without a GPU a context that fits in RAM can still take an hour to read: prefill on a CPU is
compute bound, about proportional to the weight bytes each token passes through and to the
cores. Before the model has run here the rate is estimated from its size with the one CPU
estimate lucebox has (agentprompt: 55 tokens/s for SmolLM2-135M Q4_1 on 2 shared cores at a
2-8K prompt). benchmarks/cpu_plan_leaves_pc_usable.py --measure read an 8K prompt with SmolLM2 on
such a PC while
other work shared its two cores: 6,942 tokens in 275 s (25 tok/s), which is why a rate measured
here replaces the estimate once the model has run.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.plan.memory.agentprompt import CPU_PREFILL_BYTE_TOKENS_PER_CORE_S

BYTE_TOKENS_PER_CORE_S = CPU_PREFILL_BYTE_TOKENS_PER_CORE_S
"""The one CPU estimate (agentprompt's: 55 tokens/s for SmolLM2 on 2 shared cores at 2-8K)."""


@dataclass(frozen=True)
class ReadCap:
    ctx: int
    """The largest context read within the allowed time."""
    rate_tok_s: float
    reason: str


def estimated_prefill_tok_s(facts: ModelFacts, cores: int) -> float:
    return BYTE_TOKENS_PER_CORE_S * max(cores, 1) / max(facts.weights_bytes, 1)


def cpu_cores() -> int:
    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def read_cap(
    facts: ModelFacts, read_s: float, cores: int, measured_tok_s: float | None = None
) -> ReadCap | None:
    """The context the CPU reads in ``read_s`` (None when the setting is 0: no bound), at the
    rate measured for this model here when there is one, else the estimate."""
    if read_s <= 0:
        return None
    if measured_tok_s:
        rate, source = measured_tok_s, "measured for this model on this PC"
    else:
        rate = estimated_prefill_tok_s(facts, cores)
        source = (
            f"estimated from {facts.weights_bytes / 2**20:,.0f} MiB of weights on {cores} cores"
        )
    reason = (
        f"at most what this CPU reads in {read_s / 60:g} min (model.cpu_read_s): about "
        f"{rate:,.0f} tokens/s {source}; ask for more with --ctx"
    )
    return ReadCap(int(rate * read_s), rate, reason)
