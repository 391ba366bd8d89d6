"""What the sampler reports: frozen values that the state file, the CLI and the TUI share.

Kept apart from the sampler itself so that `lucebox status` reads them without importing the
HTTP client the sampler needs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, TypeVar

from lucebox.engine.engines.kindname import KIND_TEXT

WINDOW_S = 10.0
"""Rates are token-weighted over the requests that finished (or progressed) this long ago."""

_Value = TypeVar(
    "_Value",
    "Sample",
    "SpecStatus",
    "MeasuredRate",
    "CacheStatus",
    "GpuStatus",
    "SideStatus",
    "PeerStatus",
    "QueueStatus",
    "EngineStatus",
    "KeyUse",
    "LanStatus",
    "SamplingStatus",
    "SamplingRate",
)


def _from_json(kind: type[_Value], data: Any) -> _Value | None:
    """``kind`` from its ``to_json`` form; None when ``data`` is not one (an older file)."""
    if not isinstance(data, dict):
        return None
    known = {f.name for f in fields(kind)}
    try:
        return kind(**{key: value for key, value in data.items() if key in known})
    except TypeError:
        return None


@dataclass(frozen=True)
class Sample:
    """One sample of the serving engine.

    Rates are per request as the engine reports them in its per-task timing lines, weighted by
    tokens over the last ``window_s`` seconds (finished requests, plus the progress of requests
    still running); the ``last_*`` fields are those of the last finished request alone.
    """

    at_s: float
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    ttft_s: float | None
    """Time to first token as the client waits it, the mean over the requests finished in the
    window: the Lucebox engine's whole reply less its decode (PFlash's drafter scoring and
    KVFlash's paging included); llama-server's prompt time, from its slot taking the task to
    the first token (queueing and the network are not in it)."""
    spec_acceptance: float | None
    vram_used_bytes: int | None
    gpu_util_percent: int | None
    engine_cpu_percent: float | None
    engine_rss_bytes: int | None
    requests_finished: int
    """Requests finished since the previous sample (each counted once, from the engine's log)."""
    slots_busy: int | None = None
    slots_total: int | None = None
    gpu_temperature_c: int | None = None
    gpu_power_w: float | None = None
    window_s: float = WINDOW_S
    last_decode_tokens_per_s: float | None = None
    last_prefill_tokens_per_s: float | None = None
    last_ttft_s: float | None = None
    requests_finished_total: int = 0
    """Requests finished since the sampler started."""
    decode_tokens_total: int = 0
    """Decode tokens of those requests, as each engine counts them in its own rate
    (llama-server: the first token is free; the Lucebox engine: every generated token)."""
    decode_seconds_total: float = 0.0
    prefill_tokens_total: int = 0
    """Prompt tokens those requests processed (cached ones excluded)."""
    prefill_seconds_total: float = 0.0
    prompt_tokens_total: int | None = None
    """The engine's /metrics counters since it started: prompt tokens processed ..."""
    cached_prompt_tokens_total: int | None = None
    """... prompt tokens reused from its cache ..."""
    generated_tokens_total: int | None = None
    """... and tokens generated."""
    cached_prompt_share: float | None = None
    """Cached / (cached + processed) prompt tokens of the requests finished in the window (the
    last window's while none finishes)."""
    draft_tokens_total: int | None = None
    """The engine's speculation counters since it started: tokens drafted ..."""
    accepted_tokens_total: int | None = None
    """... and drafted tokens the target accepted."""
    gpu_loads: tuple[tuple[int, int | None, int | None], ...] = ()
    """With several GPUs in the launch, each one's (NVML index, the engine's bytes there, load
    %): the dashboard's bar per card."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Sample | None:
        found = _from_json(cls, data)
        if found is None:
            return None
        try:  # JSON keeps the triples as lists
            loads = tuple((int(i), used, util) for i, used, util in found.gpu_loads)
        except (TypeError, ValueError):
            loads = ()
        return replace(found, gpu_loads=loads)


_MODE_NAMES = {
    "draft-mtp": "MTP",
    "draft-dflash": "DFlash",
    "draft-dspark": "DSpark",
    "draft-eagle3": "EAGLE-3",
    "draft-simple": "draft model",
}


@dataclass(frozen=True)
class MeasuredRate:
    """Decode speed of the served speculation against none, measured on this card."""

    baseline_tok_s: float
    tok_s: float
    ratio: float
    probes: int
    at: float
    """Unix time of the measurement."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> MeasuredRate | None:
        return _from_json(cls, data)


@dataclass(frozen=True)
class SpecStatus:
    """Speculative decoding as planned and as the engine really runs it."""

    type: str
    active: bool | None
    """Whether the engine runs it (its /slots say so); None until the engine has answered."""
    reason: str
    acceptance: float | None
    """Accepted / drafted tokens since the engine started (its spec_decode counters)."""
    accepted_per_step: float | None
    """Draft tokens accepted per verification step."""
    measured: MeasuredRate | None = None
    """Its decode speed against none on this card; None until the calibration measured it."""
    by_sampling: tuple[SamplingRate, ...] = ()
    """Greedy and sampled replies apart, each where there is data: a sampled reply accepts
    fewer drafts, so one figure for both says little of either."""

    @property
    def mode_name(self) -> str:
        """``MTP``, ``DFlash``, ``n-gram``, ``n-gram + MTP``...: the mode as a user calls it
        (a combination of types, ``ngram-mod,draft-mtp``, by each of them)."""
        names = []
        for part in self.type.split(","):
            name = "n-gram" if part.startswith("ngram") else _MODE_NAMES.get(part, part)
            if name not in names:
                names.append(name)
        return " + ".join(names)

    def headline(self) -> str | None:
        """What the measurement says, in a few words: ``MTP 1.59x (measured)``, or for a mode
        it switched off ``MTP off: drafted nothing, 0.65x``; None before it measured."""
        if self.measured is None:
            return None
        if self.active is False and self.reason.startswith("off: "):
            return f"{self.mode_name} {self.reason.split(' (', 1)[0]}"
        return f"{self.mode_name} {self.measured.ratio:.2f}x (measured)"

    def sampling_text(self) -> str | None:
        """Greedy and sampled replies apart, as the dashboard and `status` show them after the
        mode's name: ``greedy 1.59x measured, 90% accepted · sampled (t0.7) 45% accepted``;
        None without a figure for either, or for a mode switched off (its headline says why)."""
        if self.active is False:
            return None
        return " · ".join(rate.text() for rate in self.by_sampling) or None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "by_sampling": [r.to_json() for r in self.by_sampling]}

    @classmethod
    def from_json(cls, data: Any) -> SpecStatus | None:
        found = _from_json(cls, data)
        if found is None:
            return None
        measured = MeasuredRate.from_json(found.measured) if found.measured else None
        stored = found.by_sampling if isinstance(found.by_sampling, list | tuple) else ()
        rates = (SamplingRate.from_json(r) for r in stored)
        return replace(
            found, measured=measured, by_sampling=tuple(r for r in rates if r is not None)
        )


@dataclass(frozen=True)
class SamplingRate:
    """Speculation for the replies of one sampling: its speed-up as the calibration measured
    it at that sampling, and its draft acceptance as served."""

    sampled: bool
    """False: greedy replies (temperature 0 or top_k 1)."""
    at: str
    """The sampling the speed-up was measured at, as the store names it (``greedy``,
    ``t0.7``)."""
    ratio: float | None
    """Decode speed against none measured at ``at`` on this card; None where it was not."""
    acceptance: float | None
    """Draft tokens accepted of those drafted in served replies of this sampling; None before
    any."""
    spread: float = 0.0
    """The speed-up's runs of the probe set, highest less lowest over their mean (0 with one
    run)."""
    runs: int = 1
    """Runs of the probe set the speed-up is the latest of."""

    def text(self) -> str:
        """``greedy 1.59x measured, 90% accepted``, ``greedy 1.59x measured ±3% over 2 runs``
        or ``sampled (t0.7) 45% accepted``."""
        name = f"sampled ({self.at})" if self.sampled else "greedy"
        spread = f" ±{self.spread / 2:.0%} over {self.runs} runs" if self.runs > 1 else ""
        figures = [
            *([f"{self.ratio:.2f}x measured{spread}"] if self.ratio is not None else []),
            *([f"{self.acceptance:.0%} accepted"] if self.acceptance is not None else []),
        ]
        return f"{name} {', '.join(figures)}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> SamplingRate | None:
        return _from_json(cls, data)


CHOSEN_BY_TEXT = {
    "measured": "measured on this card",
    "rule": "by the rule, not measured here yet",
    "asked": "as asked",
    "trial": "a calibration trial",
}


@dataclass(frozen=True)
class EngineStatus:
    """Which engine kind serves now, and what chose it."""

    kind: str
    """``llama-server`` or ``lucebox``."""
    chosen_by: str
    """``measured`` (the engines' verdict on this card), ``rule`` (the planner's rule, before a
    measurement), ``asked`` (``--engine`` or engine.kind) or ``trial`` (the engine calibration
    runs it to measure it)."""
    reason: str

    def text(self) -> str:
        """``the Lucebox engine (measured on this card)``."""
        name = KIND_TEXT.get(self.kind, self.kind)
        return f"{name} ({CHOSEN_BY_TEXT.get(self.chosen_by, self.chosen_by)})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> EngineStatus | None:
        return _from_json(cls, data)


@dataclass(frozen=True)
class CacheStatus:
    """How much of the prompts the engine took from its cache instead of computing them."""

    cached_prompt_share: float | None
    """Cached / (cached + processed) prompt tokens of the requests finished in the window (the
    last window's while none finishes); None before the first."""
    full_reprocess_events: int
    """Times the engine logged that it re-processed a whole prompt for lack of cache data."""
    last_cached_tokens: int | None = None
    """Prompt tokens the last finished request took from the cache."""
    last_prompt_tokens: int | None = None
    """Prompt tokens the last finished request processed."""
    slot_save_failure: str | None = None
    """Why the last save of the agent slot before a planned stop failed; None: it did not."""
    last_restore: str | None = None
    """What the restore at this engine's start did: the tokens restored, or why none."""
    disk_entries: int | None = None
    """Prompt states the Lucebox engine keeps in its disk prefix cache, or conversations
    llama-server's saved slots keep (``disk_store`` says which); None: none is kept."""
    disk_bytes: int | None = None
    disk_tokens: int | None = None
    """Tokens the saved slots hold (the Lucebox engine's states do not say)."""
    disk_store: str | None = None
    """``prefix-cache`` (the Lucebox engine's) or ``slots`` (llama-server's saved slots)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> CacheStatus | None:
        return _from_json(cls, data)


@dataclass(frozen=True)
class GpuStatus:
    """One NVIDIA GPU of this PC, as the sampler last read it."""

    index: int
    vram_used_bytes: int
    vram_total_bytes: int
    util_percent: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> GpuStatus | None:
        return _from_json(cls, data)


@dataclass(frozen=True)
class PeerStatus:
    """One RPC peer of the launch: what it published at start, and whether it still answers."""

    address: str
    build: str
    free_bytes: int
    state: str
    """up, or lost (its RPC server stopped answering)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> PeerStatus | None:
        return _from_json(cls, data)


@dataclass(frozen=True)
class SideStatus:
    """An embedding or reranker model served beside the chat engine, as it runs now."""

    role: str
    alias: str
    ready: bool
    restarts: int
    """Times its process was started again after it died."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> SideStatus | None:
        return _from_json(cls, data)


@dataclass(frozen=True)
class LanStatus:
    """Where the LAN finds the server: the name it announces over mDNS and its addresses."""

    name: str | None
    """The instance announced (``NAME.local``); None when nothing is announced."""
    addresses: tuple[str, ...]
    port: int

    @classmethod
    def from_json(cls, data: Any) -> LanStatus | None:
        found = _from_json(cls, data)
        return replace(found, addresses=tuple(found.addresses)) if found else None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "addresses": list(self.addresses), "port": self.port}

    def chat_urls(self) -> tuple[str, ...]:
        """The chat page's addresses for a phone: by name where announced, then by address."""
        named = (f"http://{self.name}.local:{self.port}/",) if self.name else ()
        return named + tuple(f"http://{a}:{self.port}/" for a in self.addresses)


@dataclass(frozen=True)
class KeyUse:
    """What one person's key used since the server started (`lucebox keys list`, status)."""

    name: str
    requests: int
    tokens: int
    """Generated tokens, as each reply reported them (or its token events)."""
    last_seen: str
    """When its last request came (UTC, ISO 8601)."""

    @classmethod
    def from_json(cls, data: Any) -> KeyUse | None:
        return _from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class QueueStatus:
    """The queue now, as `lucebox status` and ``/metrics`` show it."""

    depth: int
    """Requests waiting (not yet in the engine)."""
    running: int
    """Requests in the engine."""
    oldest_wait_s: float | None
    max_waiting: int
    capacity: int
    served: int
    rejected: int
    mean_service_s: float | None

    @classmethod
    def from_json(cls, data: Any) -> QueueStatus | None:
        return _from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def users_json(self) -> dict[str, int]:
        """People served at once as planned (the engine's slots), how many of those slots
        are busy now, and how many requests wait their turn."""
        return {"planned": self.capacity, "slots_busy": self.running, "waiting": self.depth}


@dataclass(frozen=True)
class SamplingStatus:
    """The sampling the served generation requests got, as `lucebox status` shows it: counts by
    class and the typical temperature of the sampled ones; before any request, the defaults
    the front fills in stand in (``source`` ``defaults``)."""

    greedy: int
    """Requests decoded greedily (temperature 0 or top_k 1)."""
    sampled: int
    temperature: float
    """The most common temperature of the sampled requests; 0 when none was sampled (the
    defaults' temperature before any request)."""
    source: str
    """``clients`` once a request was recorded, else ``defaults``."""
    greedy_acceptance: float | None = None
    """Draft tokens accepted of those drafted in greedy replies, where the engine's replies
    say (llama-server's timings); None before any."""
    sampled_acceptance: float | None = None
    """The same for sampled replies."""

    @property
    def is_greedy(self) -> bool:
        """Whether the mix is mostly greedy (probes are then greedy too)."""
        if self.greedy == self.sampled == 0:
            return self.temperature <= 0
        return self.greedy >= self.sampled

    def text(self) -> str:
        """One line for people: what was counted, or the defaults that stand in."""
        if self.source == "defaults":
            at = "greedy" if self.temperature <= 0 else f"temperature {self.temperature:g}"
            return f"no request yet; the defaults stand in ({at})"
        sampled = f"{self.sampled} sampled"
        if self.sampled:
            sampled += f" (mostly at temperature {self.temperature:g})"
        accepted = [
            f"{share:.0%} {kind}"
            for kind, share in (
                ("greedy", self.greedy_acceptance),
                ("sampled", self.sampled_acceptance),
            )
            if share is not None
        ]
        drafts = f"; drafts accepted {', '.join(accepted)}" if accepted else ""
        return f"{sampled}, {self.greedy} greedy{drafts}"

    @classmethod
    def from_json(cls, data: Any) -> SamplingStatus | None:
        if not isinstance(data, dict):
            return None
        found = {**data, "source": data.get("from")}
        return _from_json(cls, {k: v for k, v in found.items() if k != "from"})

    def to_json(self) -> dict[str, Any]:
        return {
            "greedy": self.greedy,
            "sampled": self.sampled,
            "temperature": self.temperature,
            "from": self.source,
            "greedy_acceptance": self.greedy_acceptance,
            "sampled_acceptance": self.sampled_acceptance,
        }
