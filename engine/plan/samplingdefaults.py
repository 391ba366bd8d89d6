"""The sampling a request gets where it leaves a field unset, the same whichever engine serves.

Pure: decided once per launch from the served model's own generation defaults and carried to
the front (:mod:`lucebox.engine.run.front.apishape`), which fills every unset field of a
generation request with them, so llama-server and the Lucebox engine apply the same sampling.

Left to themselves the engines differ: llama-server takes its flags (a preset's ``[sampling]``),
else the GGUF's ``general.sampling.*`` keys, else its built-in defaults; the Lucebox engine takes
a model card found beside its binary, else greedy (``reference/lucebox-engine-contract.md``
2.5). Each field here comes from the preset's ``[sampling]``, else the GGUF header's
``general.sampling.*`` (read by :mod:`lucebox.engine.models.headerinfo`), else the rule:
llama.cpp's built-in defaults (:data:`RULE`), what llama-server, the default engine, gives a
model without its own. ``min_p`` is filled on both, but the Lucebox engine does not implement
it (its sampler has no min-p).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

SamplingSource = Literal["preset", "gguf", "rule"]
FIELDS = ("temperature", "top_p", "top_k", "min_p")
"""The request fields filled where a client leaves them unset (both engines' names)."""
RULE: Mapping[str, float] = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}
"""llama.cpp's built-in sampling defaults (``common/common.h``, pinned build)."""


@dataclass(frozen=True)
class SamplingDefaults:
    """The sampling of a request that says none, decided once per launch."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    source: SamplingSource
    """The most specific source any field came from."""

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature, self.top_k)

    @property
    def label(self) -> str:
        """The sampling measurements at these defaults are stored under (:func:`label`)."""
        return label(0.0 if self.greedy else self.temperature)

    def fields(self) -> dict[str, float | int]:
        """The request fields, by their API names."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }

    def filled(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """``doc`` with each sampling field it leaves unset (absent or null) set to these."""
        missing = {k: v for k, v in self.fields().items() if doc.get(k) is None}
        return {**doc, **missing} if missing else dict(doc)

    def to_json(self) -> dict[str, Any]:
        return {**self.fields(), "source": self.source}


GREEDY = "greedy"
"""The label of greedy sampling: measurements stored before sampling was recorded are these."""


def label(temperature: float) -> str:
    """A sampling as the measurement store names it: ``greedy``, or ``t0.7`` when sampled at
    temperature 0.7 (greedy and sampled rates are kept apart)."""
    return GREEDY if temperature <= 0 else f"t{temperature:g}"


def is_greedy(temperature: float, top_k: float) -> bool:
    """Whether this sampling always takes the likeliest token (both engines' rule)."""
    return temperature <= 0 or top_k == 1


def sampling_defaults(
    preset: Mapping[str, float] | None, gguf: Mapping[str, float] | None
) -> SamplingDefaults:
    """Each field from the preset's ``[sampling]``, else the GGUF's keys, else :data:`RULE`."""
    chosen: dict[str, float] = {}
    source: SamplingSource = "rule"
    for name, layer in (("gguf", gguf or {}), ("preset", preset or {})):
        known = {k: float(v) for k, v in layer.items() if k in FIELDS}
        if known:
            chosen.update(known)
            source = "preset" if name == "preset" else "gguf"
    merged = {**RULE, **chosen}
    return SamplingDefaults(
        temperature=max(merged["temperature"], 0.0),
        top_p=merged["top_p"],
        top_k=int(merged["top_k"]),
        min_p=merged["min_p"],
        source=source,
    )
