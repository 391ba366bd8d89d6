"""Metrics sampler: llama-server's /metrics counters, NVML and psutil -> one Sample a second.

llama-server's throughput gauges reset on every scrape, so lucebox reads only the counters
and derives rates from their deltas. The predicted and draft counters advance only when a
request finishes (contract 2.6), so the live decode rate comes from /slots, whose `n_decoded`
grows with every token; the counters give the rate when no slot is decoding any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import httpx
import psutil

from lucebox.engine.gpu import NvmlNotSupportedError, NvmlProvider, NvmlUnavailableError

HISTORY = 300
_LINE = re.compile(r"^llamacpp:(\w+)(\{[^}]*\})?\s+([0-9.eE+-]+|nan|inf)\s*$")


@dataclass(frozen=True)
class Sample:
    at_s: float
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    ttft_s: float | None
    """Prompt time of the requests finished since the last sample, per request."""
    spec_acceptance: float | None
    vram_used_bytes: int | None
    gpu_util_percent: int | None
    engine_cpu_percent: float | None
    engine_rss_bytes: int | None
    requests_finished: int
    slots_busy: int | None = None
    slots_total: int | None = None
    gpu_temperature_c: int | None = None
    gpu_power_w: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_counters(text: str) -> dict[str, float]:
    """Unlabelled ``llamacpp:`` series of a Prometheus text page."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match and not match.group(2):
            with contextlib.suppress(ValueError):
                values[match.group(1)] = float(match.group(3))
    return values


RATE_FIELDS = ("decode_tokens_per_s", "prefill_tokens_per_s", "ttft_s", "spec_acceptance")


def with_last_rates(last: Sample | None, sample: Sample) -> Sample:
    """``sample`` with each rate it lacks taken from ``last``: the last known value to show."""
    if last is None:
        return sample
    kept = {name: getattr(last, name) for name in RATE_FIELDS if getattr(sample, name) is None}
    return replace(sample, **kept)


def live_decoded(
    before: dict[tuple[int, int], int], slots: list[Any]
) -> tuple[int, dict[tuple[int, int], int]]:
    """Tokens generated since ``before`` by the slots still decoding, and the new snapshot.

    ``before`` maps (slot id, task id) to the slot's `n_decoded`; a task seen for the first
    time counts from zero.
    """
    now: dict[tuple[int, int], int] = {}
    tokens = 0
    for slot in slots:
        if not isinstance(slot, dict) or not slot.get("is_processing"):
            continue
        next_token = slot.get("next_token") or [{}]
        decoded = next_token[0].get("n_decoded") if isinstance(next_token[0], dict) else None
        slot_id, task_id = slot.get("id"), slot.get("id_task")
        if not (isinstance(decoded, int) and isinstance(slot_id, int) and isinstance(task_id, int)):
            continue
        key = (slot_id, task_id)
        now[key] = decoded
        tokens += max(0, decoded - before.get(key, 0))
    return tokens, now


def derive(
    before: dict[str, float], after: dict[str, float]
) -> tuple[float | None, float | None, float | None]:
    """(decode tok/s, prefill tok/s, spec acceptance) from two counter snapshots."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    decode = prefill = acceptance = None
    if delta("tokens_predicted_seconds_total") > 0:
        decode = delta("tokens_predicted_total") / delta("tokens_predicted_seconds_total")
    if delta("prompt_seconds_total") > 0:
        prefill = delta("prompt_tokens_total") / delta("prompt_seconds_total")
    if delta("spec_decode_num_draft_tokens_total") > 0:
        acceptance = delta("spec_decode_num_accepted_tokens_total") / delta(
            "spec_decode_num_draft_tokens_total"
        )
    return decode, prefill, acceptance


class Sampler:
    """Polls the engine at ``interval_s`` and keeps a short history for sparklines."""

    def __init__(
        self,
        url: str,
        engine_pid: int,
        *,
        nvml: NvmlProvider | None = None,
        gpu_index: int = 0,
        interval_s: float = 1.0,
        client: httpx.AsyncClient | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = url
        self.nvml = nvml
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.client = client
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        self.process: psutil.Process | None = None
        with contextlib.suppress(psutil.Error):
            self.process = psutil.Process(engine_pid)
            self.process.cpu_percent(None)
        self._counters: dict[str, float] = {}
        self._decoded: dict[tuple[int, int], int] = {}
        self._slots_total: int | None = None
        self._sampled_at = time.monotonic()
        self._pending_prompt_s = 0.0

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

    async def _slots(self, client: httpx.AsyncClient) -> list[Any] | None:
        try:
            reply = await client.get(f"{self.url}/slots", headers=self.headers)
            slots = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return slots if isinstance(slots, list) else None

    async def sample_once(self, client: httpx.AsyncClient) -> Sample | None:
        try:
            page = await client.get(f"{self.url}/metrics", headers=self.headers)
        except httpx.HTTPError:
            return None
        if page.status_code != 200:
            return None
        counters = parse_counters(page.text)
        # /slots is read only while requests run (or just ended): an idle server costs one
        # request a second.
        processing = counters.get("requests_processing", 0.0) > 0 or bool(self._decoded)
        slots = await self._slots(client) if processing or self._slots_total is None else None
        now = time.monotonic()
        interval_s, self._sampled_at = max(now - self._sampled_at, 1e-3), now
        finished = self._finished_since_last(counters)
        decode, prefill, acceptance = derive(self._counters, counters)
        # A request's prompt time is counted when it is processed, its end when it finishes:
        # time to first token is the prompt time gathered until a request finishes.
        self._pending_prompt_s += counters.get("prompt_seconds_total", 0.0) - self._counters.get(
            "prompt_seconds_total", 0.0
        )
        ttft = None
        if finished:
            ttft, self._pending_prompt_s = self._pending_prompt_s / finished, 0.0
        self._counters = counters
        busy = 0 if self._slots_total is not None else None
        if slots is not None:
            live_tokens, self._decoded = live_decoded(self._decoded, slots)
            busy, self._slots_total = len(self._decoded), len(slots)
            if busy:
                decode = live_tokens / interval_s
        used, util, temperature, power = self._gpu()
        cpu = rss = None
        if self.process is not None:
            with contextlib.suppress(psutil.Error):
                cpu = self.process.cpu_percent(None)
                rss = self.process.memory_info().rss
        sample = Sample(
            time.time(),
            decode,
            prefill,
            ttft,
            acceptance,
            used,
            util,
            cpu,
            rss,
            finished,
            slots_busy=busy,
            slots_total=self._slots_total,
            gpu_temperature_c=temperature,
            gpu_power_w=power,
        )
        self.history.append(sample)
        return sample

    def _finished_since_last(self, counters: dict[str, float]) -> int:
        # The engine exports no request counter; the predicted-tokens counter moves only when
        # a request ends, so a rise means one (or, rarely within one second, several) ended.
        before = self._counters.get("tokens_predicted_total")
        after = counters.get("tokens_predicted_total")
        return 1 if before is not None and after is not None and after > before else 0

    async def samples(self) -> AsyncIterator[Sample]:
        own = self.client is None
        client = self.client or httpx.AsyncClient(timeout=2.0)
        try:
            while True:
                sample = await self.sample_once(client)
                if sample is not None:
                    yield sample
                await asyncio.sleep(self.interval_s)
        finally:
            if own:
                await client.aclose()
