"""Metrics sampler: the engine's per-request facts, its counters, NVML and psutil -> Samples.

Rates come from what the engine reports for each finished request, read from its log by
:mod:`enginelog`. Each request is counted once, however short, and the rates are the engine's
own, as each reply's ``timings`` reports them (llama-server: decode steps over decode time,
its first token is free); time to first token is what the client waited. A request still
running shows its progress from /slots until its timing lines replace it, and a finished one
is sampled at once (a status read right after a reply never shows it running). /metrics gives
the token totals and the speculative counters; /slots says whether speculation runs.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
import psutil

from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.waits import event_within
from lucebox.engine.machine.gpu import NvmlNotSupportedError, NvmlProvider, NvmlUnavailableError
from lucebox.engine.run.hang import SILENT_FACTOR, Look
from lucebox.engine.run.kinds.enginelog import EngineLog, FinishedRequest
from lucebox.engine.run.sample import WINDOW_S, CacheStatus, SpecStatus
from lucebox.engine.run.sample import Sample as Sample

HISTORY = 300
_COUNTER = re.compile(r"^llamacpp:(\w+)(\{[^}]*\})?\s+([0-9.eE+-]+|nan|inf)\s*$")


def parse_counters(text: str) -> dict[str, float]:
    """Unlabelled ``llamacpp:`` series of a Prometheus text page."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _COUNTER.match(line.strip())
        if match and not match.group(2):
            with contextlib.suppress(ValueError):
                values[match.group(1)] = float(match.group(3))
    return values


RATE_FIELDS = (
    "decode_tokens_per_s",
    "prefill_tokens_per_s",
    "ttft_s",
    "spec_acceptance",
    "last_decode_tokens_per_s",
    "last_prefill_tokens_per_s",
    "last_ttft_s",
    "cached_prompt_share",
)


def with_last_rates(last: Sample | None, sample: Sample) -> Sample:
    """``sample`` with each rate it lacks taken from ``last``: the last known value to show."""
    if last is None:
        return sample
    kept = {name: getattr(last, name) for name in RATE_FIELDS if getattr(sample, name) is None}
    return replace(sample, **kept)


@dataclass(frozen=True)
class _Span:
    """Work the window counts: a finished request, or a running one's progress since a poll."""

    at_s: float
    task_id: int
    decode_steps: int
    decode_s: float
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    finished: bool = False
    draft_accepted: int = 0
    draft_generated: int = 0
    cached_tokens: int | None = None
    first_token_s: float = 0.0


@dataclass(frozen=True)
class WindowRates:
    """What :class:`RateWindow` reports; None where the window holds nothing to measure."""

    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    ttft_s: float | None
    """Mean time to first token of the finished requests, as their clients waited it."""
    spec_acceptance: float | None
    cached_prompt_share: float | None
    """Cached / (cached + processed) prompt tokens of the finished requests."""


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


class RateWindow:
    """Token-weighted rates over the last ``window_s`` seconds of finished and running work.

    A running request adds its decode progress between two polls; when it finishes, its
    timing lines replace that progress, so no token is counted twice.
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.spans: deque[_Span] = deque()
        self._seen: dict[int, tuple[int, float]] = {}
        """Running tasks: the decoded count and time of their last poll."""

    def add_finished(self, request: FinishedRequest, now_s: float) -> None:
        self._seen.pop(request.task_id, None)
        self.spans = deque(span for span in self.spans if span.task_id != request.task_id)
        self.spans.append(
            _Span(
                now_s,
                request.task_id,
                request.decode_steps,
                request.decode_s,
                request.prompt_tokens,
                request.prompt_s,
                finished=True,
                draft_accepted=request.draft_accepted,
                draft_generated=request.draft_generated,
                cached_tokens=request.cached_tokens,
                first_token_s=request.first_token_s,
            )
        )

    def add_progress(self, running: dict[int, int], now_s: float) -> None:
        """``running`` maps each decoding task to its generated count (/slots `n_decoded`)."""
        for task_id, decoded in running.items():
            before = self._seen.get(task_id)
            self._seen[task_id] = (decoded, now_s)
            # The first sight of a task has no start to measure from: it counts from the next.
            # A poll with no new token still counts its time (a draft step can bring several
            # tokens at once); up to the first token, as for the engine, the time is the
            # prompt's.
            if before is not None and before[0] > 0:
                self.spans.append(_Span(now_s, task_id, decoded - before[0], now_s - before[1]))
        for task_id in set(self._seen) - set(running):
            del self._seen[task_id]

    def rates(self, now_s: float) -> WindowRates:
        while self.spans and self.spans[0].at_s < now_s - self.window_s:
            self.spans.popleft()
        spans = self.spans
        finished = [span for span in spans if span.finished]
        prompted = [span for span in finished if span.prompt_tokens > 0]
        cached = [span for span in finished if span.cached_tokens is not None]
        return WindowRates(
            _ratio(sum(s.decode_steps for s in spans), sum(s.decode_s for s in spans)),
            _ratio(sum(s.prompt_tokens for s in prompted), sum(s.prompt_s for s in prompted)),
            _ratio(sum(s.first_token_s for s in finished), len(finished)),
            _ratio(sum(s.draft_accepted for s in spans), sum(s.draft_generated for s in spans)),
            _ratio(
                sum(s.cached_tokens or 0 for s in cached),
                sum((s.cached_tokens or 0) + s.prompt_tokens for s in cached),
            ),
        )


def _running_tasks(slots: list[Any]) -> dict[int, int]:
    """Task id -> generated tokens of each slot that is processing a request."""
    running: dict[int, int] = {}
    for slot in slots:
        if not isinstance(slot, dict) or not slot.get("is_processing"):
            continue
        next_token = slot.get("next_token") or [{}]
        decoded = next_token[0].get("n_decoded") if isinstance(next_token[0], dict) else None
        task_id = slot.get("id_task")
        if isinstance(decoded, int) and isinstance(task_id, int):
            running[task_id] = decoded
    return running


def look_of(slots: list[Any] | None, counters: dict[str, float], now_s: float) -> Look:
    """What the hang watch needs from one sample: the busy slots' phase, prompt length and
    progress (tokens processed and generated, per slot and in the engine's counters)."""
    busy = [s for s in slots or [] if isinstance(s, dict) and s.get("is_processing")]
    if not busy:
        return Look(now_s, counters.get("requests_processing", 0.0) > 0)
    decoded = [sum(_running_tasks([slot]).values()) for slot in busy]
    processed = [int(slot.get("n_prompt_tokens_processed") or 0) for slot in busy]
    progress = (
        *decoded,
        *processed,
        int(counters.get("prompt_tokens_total", 0)),
        int(counters.get("tokens_predicted_total", 0)),
    )
    prompt = max(int(slot.get("n_prompt_tokens") or 0) for slot in busy)
    return Look(now_s, True, "decode" if any(decoded) else "prefill", prompt, progress)


class Sampler:
    """Polls the engine at ``interval_s`` and keeps a short history for sparklines."""

    silent_factor = SILENT_FACTOR
    """llama-server answers no look while a prompt batch runs: a request may go several
    prefill floors unanswered (:mod:`hang`)."""

    def __init__(
        self,
        url: str,
        engine_pid: int,
        log: EngineLog,
        *,
        nvml: NvmlProvider | None = None,
        gpu_index: int = 0,
        gpu_indices: tuple[int, ...] = (),
        interval_s: float = 1.0,
        client: httpx.AsyncClient | None = None,
        api_key: str | None = None,
        spec_type: str | None = None,
        spec_reason: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.log = log
        self.nvml = nvml
        self.gpu_index = gpu_index
        self.gpu_indices = gpu_indices
        """Every GPU of the launch (a split or a two-card placement reads each)."""
        self.interval_s = interval_s
        self.client = client
        self.headers = auth_headers(api_key)
        self.spec_type = spec_type
        self.spec_reason = spec_reason
        self.clock = clock
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        self.process: psutil.Process | None = None
        with contextlib.suppress(psutil.Error):
            self.process = psutil.Process(engine_pid)
            self.process.cpu_percent(None)
        self.window = RateWindow()
        self._counters: dict[str, float] = {}
        self._slots_total: int | None = None
        self._speculating: bool | None = None
        self._running: dict[int, int] = {}
        self._last: FinishedRequest | None = None
        self._totals = Sample(0.0, None, None, None, None, None, None, None, None, 0)
        self.finished: tuple[FinishedRequest, ...] = ()
        """The requests that finished in the latest sample."""
        self._cached_share: float | None = None
        """The last window's cached prompt share, kept while no request finishes."""
        self.look: Look | None = None
        """The latest look for the hang watch; None when the engine did not answer."""

    def _gpu(self) -> tuple[int | None, int | None, int | None, float | None]:
        """(engine VRAM bytes, GPU util %, temperature C, power W); None where NVML has none."""
        if self.nvml is None or self.process is None:
            return None, None, None, None
        used = util = temperature = power = None
        with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
            for pid, used_bytes in self.nvml.processes(self.gpu_index):
                if pid == self.process.pid:
                    used = used_bytes
        with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
            util = self.nvml.utilization_percent(self.gpu_index)
        with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
            temperature = self.nvml.temperature_c(self.gpu_index)
        with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
            power = self.nvml.power_draw_mw(self.gpu_index) / 1000
        return used, util, temperature, power

    def _gpu_loads(self) -> tuple[tuple[int, int | None, int | None], ...]:
        """Per GPU of a launch on several: the engine's bytes there and the card's load."""
        if self.nvml is None or self.process is None or len(self.gpu_indices) < 2:
            return ()
        found = []
        for index in self.gpu_indices:
            used = util = None
            with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
                used = sum(
                    b or 0 for pid, b in self.nvml.processes(index) if pid == self.process.pid
                )
            with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
                util = self.nvml.utilization_percent(index)
            found.append((index, used, util))
        return tuple(found)

    async def _slots(self, client: httpx.AsyncClient) -> list[Any] | None:
        try:
            reply = await client.get(f"{self.url}/slots", headers=self.headers)
            slots = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return slots if isinstance(slots, list) else None

    async def sample_once(self, client: httpx.AsyncClient) -> Sample | None:
        self.look = None
        try:
            page = await client.get(f"{self.url}/metrics", headers=self.headers)
        except httpx.HTTPError:
            return None
        if page.status_code != 200:
            return None
        counters = parse_counters(page.text)
        # /slots is read while requests run (or just ended) and once to learn the slots: an
        # idle server costs one request a second.
        processing = counters.get("requests_processing", 0.0) > 0 or bool(self._running)
        slots = await self._slots(client) if processing or self._slots_total is None else None
        now_s = self.clock()
        finished = self._take_finished(now_s)
        if slots is not None:
            self._slots_total = len(slots)
            self._speculating = any(isinstance(s, dict) and s.get("speculative") for s in slots)
            self._running = _running_tasks(slots)
            self.window.add_progress(self._running, now_s)
        elif processing:
            self._running = {}
        if slots is not None or not processing:
            self.look = look_of(slots, counters, now_s)
        rates = self.window.rates(now_s)
        self._counters = counters
        if rates.cached_prompt_share is not None:
            self._cached_share = rates.cached_prompt_share
        return self._assembled(
            finished,
            rates,
            slots_busy=len(self._running) if self._slots_total is not None else None,
            slots_total=self._slots_total,
            prompt_tokens_total=_whole(counters.get("prompt_tokens_total")),
            cached_prompt_tokens_total=_whole(counters.get("prompt_tokens_cached_total")),
            generated_tokens_total=_whole(counters.get("tokens_predicted_total")),
            cached_prompt_share=self._cached_share,
            draft_tokens_total=_whole(counters.get("spec_decode_num_draft_tokens_total")),
            accepted_tokens_total=_whole(counters.get("spec_decode_num_accepted_tokens_total")),
        )

    def _take_finished(self, now_s: float) -> list[FinishedRequest]:
        """The requests the engine's log finished since the last sample, into the window."""
        finished = self.log.take_finished()
        for request in finished:
            self.window.add_finished(request, now_s)
        if finished:
            self._last = finished[-1]
        return finished

    def _assembled(
        self, finished: list[FinishedRequest], rates: WindowRates, **engine_fields: Any
    ) -> Sample:
        """The sample every kind reports (the window's rates, the totals, the card's and the
        process's numbers, the last request's rates), with ``engine_fields``, the kind's own;
        kept in the history."""
        totals = self._add_totals(finished)
        used, util, temperature, power = self._gpu()
        cpu = rss = None
        if self.process is not None:
            with contextlib.suppress(psutil.Error):
                cpu = self.process.cpu_percent(None)
                rss = self.process.memory_info().rss
        last = self._last
        sample = replace(
            totals,
            at_s=time.time(),
            decode_tokens_per_s=rates.decode_tokens_per_s,
            prefill_tokens_per_s=rates.prefill_tokens_per_s,
            ttft_s=rates.ttft_s,
            spec_acceptance=rates.spec_acceptance,
            vram_used_bytes=used,
            gpu_util_percent=util,
            engine_cpu_percent=cpu,
            engine_rss_bytes=rss,
            requests_finished=len(finished),
            gpu_temperature_c=temperature,
            gpu_power_w=power,
            last_decode_tokens_per_s=_ratio(last.decode_steps, last.decode_s) if last else None,
            last_prefill_tokens_per_s=_ratio(last.prompt_tokens, last.prompt_s) if last else None,
            last_ttft_s=last.first_token_s if last else None,
            gpu_loads=self._gpu_loads(),
            **engine_fields,
        )
        self.history.append(sample)
        return sample

    def _add_totals(self, finished: list[FinishedRequest]) -> Sample:
        self.finished = tuple(finished)
        totals = self._totals
        self._totals = replace(
            totals,
            requests_finished_total=totals.requests_finished_total + len(finished),
            decode_tokens_total=totals.decode_tokens_total + sum(r.decode_steps for r in finished),
            decode_seconds_total=totals.decode_seconds_total + sum(r.decode_s for r in finished),
            prefill_tokens_total=totals.prefill_tokens_total
            + sum(r.prompt_tokens for r in finished),
            prefill_seconds_total=totals.prefill_seconds_total + sum(r.prompt_s for r in finished),
        )
        return self._totals

    def spec_status(self) -> SpecStatus | None:
        """Speculation as planned and as running; None when none was planned."""
        if self.spec_type is None:
            return None
        counters = self._counters
        drafted = counters.get("spec_decode_num_draft_tokens_total", 0.0)
        accepted = counters.get("spec_decode_num_accepted_tokens_total", 0.0)
        steps = counters.get("spec_decode_num_drafts_total", 0.0)
        if self.log.spec_failure is not None:
            reason = f"the engine could not start it: {self.log.spec_failure}"
        elif self._speculating is False:
            reason = "the engine runs without it (its /slots show no speculative context)"
        else:
            reason = self.spec_reason or f"{self.spec_type} as planned"
        return SpecStatus(
            self.spec_type,
            False if self.log.spec_failure is not None else self._speculating,
            reason,
            _ratio(accepted, drafted),
            _ratio(accepted, steps),
        )

    def cache_status(self) -> CacheStatus:
        last = self._last
        return CacheStatus(
            self._cached_share,
            self.log.full_reprocess_events,
            last.cached_tokens if last else None,
            last.prompt_tokens if last else None,
        )

    async def samples(self) -> AsyncIterator[Sample]:
        own = self.client is None
        client = self.client or httpx.AsyncClient(timeout=2.0)
        try:
            while True:
                self.log.finished_one.clear()
                sample = await self.sample_once(client)
                if sample is not None:
                    yield sample
                # Every interval, and at once when a request finishes.
                await event_within(self.log.finished_one, self.interval_s)
        finally:
            if own:
                await client.aclose()


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None else None
