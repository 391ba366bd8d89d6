"""Serving the Lucebox engine (dflash_server): warm-up, its log lines and its status page.

The engine has no ``/metrics`` and no ``/slots``. What it did for each reply comes from its
log (``[spec-decode] ... accepted=A/D``, ``[ar-decode] ...``, ``[server] chat DONE ...``,
written to stderr as each reply ends) and from ``/status/json``, whose ``perf_history``
holds each reply's prefill and decode rates. Its rollback buffers and compute graphs are
allocated on the first request, where an out-of-memory abort can still come: lucebox sends a
warm-up request before it reports the engine ready. The line formats are the pinned engine's
(``qwen35_backend.cpp``, ``http_server.cpp``); the tests read lines the engine logged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import httpx

from lucebox.engine.run.hang import Look
from lucebox.engine.run.kinds.enginelog import EngineLog, FinishedRequest
from lucebox.engine.run.kinds.metrics import Sampler
from lucebox.engine.run.sample import CacheStatus, Sample, SpecStatus

WARM_UP_TURN = " ".join(["warm"] * 300)
WARM_UP_MESSAGES = (
    {"role": "user", "content": WARM_UP_TURN},
    {"role": "assistant", "content": "warm"},
    {"role": "user", "content": WARM_UP_TURN},
)
"""Past one prefill chunk (512 tokens), so the chunk's graphs are allocated too; two turns,
because PFlash compresses a single-shot prompt but never a continuation, so the target
prefills the whole prompt and reaches its steady memory in every mode."""
_SPEC = re.compile(
    r"^\[spec-decode\] tokens=(\d+) time=([\d.]+) s speed=([\d.]+) tok/s steps=(\d+) "
    r"accepted=(\d+)/(\d+) \(([\d.]+)%\) avg_commit=([\d.]+)"
)
_AR = re.compile(r"^\[ar-decode\] tokens=(\d+) time=([\d.]+) s speed=([\d.]+) tok/s")
_DONE = re.compile(
    r"^\[server\] chat DONE (\S+) ok=(\w+) in=(\d+) effective_in=(\d+) out=(\d+) "
    r"([\d.]+)s (?:([\d.]+) tok/s )?.*?"
    r"finish=(\S+) restore=(\w+) slot=(-?\d+) prefix_len=(\d+) prefill=([\d.]+)s "
    r"decode=([\d.]+)s\(([\d.]+)tok/s\) error=(\S+)"
)
_DISK_HIT = re.compile(r"^\[disk-cache\] hit policy=\S+ len=(\d+) slot=-?\d+ pos=(\d+)")
DISK_NOTES = {
    "[disk-cache] lookup failed, removing ": "a saved state could not be read (removed)",
    "[disk-cache] adopted layout mismatch": "the saved states' layout is not this launch's",
}
"""The disk prefix cache's lines (``disk_prefix_cache.cpp``) that say why a state was not used."""
_POOL = re.compile(r"^\[kvflash\] resident pool (\d+) tokens \(logical max_ctx (\d+)\)")
_TARGET = re.compile(r"^\[target\] target loaded: .* on GPU ([\d.]+) GiB, tok_embd (\d+) MiB")


@dataclass(frozen=True)
class DecodeLine:
    """One reply's decode as the engine logs it."""

    speculative: bool
    tokens: int
    time_s: float
    tokens_per_s: float
    steps: int = 0
    accepted: int = 0
    drafted: int = 0
    avg_commit: float | None = None


@dataclass(frozen=True)
class ReplyLine:
    """The engine's closing line for one chat reply."""

    reply_id: str
    ok: bool
    prompt_tokens: int
    effective_prompt_tokens: int
    completion_tokens: int
    total_s: float
    """From the request to the reply's end: a compressing drafter's scoring (PFlash) and
    paging (KVFlash) are in it, not in ``prefill_s``."""
    finish: str
    cache_restored: bool
    prefix_tokens: int
    prefill_s: float
    decode_s: float
    decode_tokens_per_s: float
    error: str | None


def parse_decode(line: str) -> DecodeLine | None:
    if (spec := _SPEC.match(line)) is not None:
        return DecodeLine(
            True,
            int(spec[1]),
            float(spec[2]),
            float(spec[3]),
            int(spec[4]),
            int(spec[5]),
            int(spec[6]),
            float(spec[8]),
        )
    if (ar := _AR.match(line)) is not None:
        return DecodeLine(False, int(ar[1]), float(ar[2]), float(ar[3]))
    return None


def parse_reply(line: str) -> ReplyLine | None:
    done = _DONE.match(line)
    if done is None:
        return None
    return ReplyLine(
        reply_id=done[1],
        ok=done[2] == "true",
        prompt_tokens=int(done[3]),
        effective_prompt_tokens=int(done[4]),
        completion_tokens=int(done[5]),
        total_s=_total_s(float(done[6]), int(done[5]), done[7]),
        finish=done[8],
        cache_restored=done[9] == "true",
        prefix_tokens=int(done[11]),
        prefill_s=float(done[12]),
        decode_s=float(done[13]),
        decode_tokens_per_s=float(done[14]),
        error=None if done[15] == "-" else done[15],
    )


def _total_s(rounded_s: float, tokens: int, tokens_per_s: str | None) -> float:
    """The reply's whole time: the line rounds it to 0.1 s, and its overall rate (rounded to
    0.1 tok/s) gives it closer where the reply is fast (0.3387 s for 256 tokens at 755.9 tok/s);
    the closer of the two is taken."""
    rate = float(tokens_per_s) if tokens_per_s else 0.0
    if tokens <= 0 or rate <= 0:
        return rounded_s
    from_rate_s = tokens / rate
    rate_error_s = from_rate_s * 0.05 / rate
    return from_rate_s if rate_error_s < 0.05 else rounded_s


def parse_pool(line: str) -> tuple[int, int] | None:
    """(resident pool tokens, logical context) from KVFlash's start-up line."""
    pool = _POOL.match(line)
    return (int(pool[1]), int(pool[2])) if pool else None


def parse_target_loaded(line: str) -> tuple[int, int] | None:
    """(weights on the GPU, token embeddings in host RAM) in bytes, from the load line."""
    loaded = _TARGET.match(line)
    if loaded is None:
        return None
    return int(float(loaded[1]) * 2**30), int(loaded[2]) * 2**20


def reply_from_usage(usage: dict[str, Any]) -> tuple[int, int, float, float, float | None]:
    """(prompt tokens, completion tokens, prefill s, decode s, acceptance) of a reply's
    ``usage`` (``timings`` in ms; ``accept_rate`` 0 when nothing was drafted)."""
    timings = usage.get("timings") or {}
    accept = usage.get("accept_rate")
    return (
        int(usage.get("prompt_tokens", 0)),
        int(usage.get("completion_tokens", 0)),
        float(timings.get("prefill_ms", 0.0)) / 1000,
        float(timings.get("decode_ms", 0.0)) / 1000,
        float(accept) if isinstance(accept, int | float) else None,
    )


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


class LuceboxLog(EngineLog):
    """Per-reply facts from the engine's log, fed a line at a time, as llama-server's
    :class:`EngineLog` gives them (so the sampler and the status take either)."""

    def __init__(self) -> None:
        super().__init__()
        self._decode: DecodeLine | None = None
        self.accepted_total = 0
        self.drafted_total = 0
        self.spec_steps_total = 0
        self.replies_without_speculation = 0
        self.failed_replies: list[str] = []
        self.kvflash_pool: tuple[int, int] | None = None
        self._replies = 0
        self.disk_restore: str | None = None
        """What the disk prefix cache last restored, or why it could not."""

    def _disk(self, line: str) -> bool:
        if (hit := _DISK_HIT.match(line)) is not None:
            self.disk_restore = f"read {hit[2]} tokens from the disk prefix cache"
            return True
        for start, why in DISK_NOTES.items():
            if line.startswith(start):
                self.disk_restore = f"not restored from disk: {why}"
                return True
        return False

    def feed(self, line: str) -> None:
        if line.startswith("[disk-cache]") and self._disk(line):
            return
        if (decode := parse_decode(line)) is not None:
            self._decode = decode
            return
        if (pool := parse_pool(line)) is not None:
            self.kvflash_pool = pool
            return
        if line.startswith("spec-decode: ") and "failed" in line:
            self.spec_failure = line.removeprefix("spec-decode: ").strip()
            return
        reply = parse_reply(line)
        if reply is None:
            return
        decode, self._decode = self._decode, None
        if not reply.ok:
            self.failed_replies.append(f"{reply.reply_id}: {reply.error}")
            return
        decode_s = decode.time_s if decode is not None else reply.decode_s
        self._replies += 1
        kept = self._finish(
            FinishedRequest(
                task_id=self._replies,
                prompt_tokens=reply.effective_prompt_tokens,
                prompt_s=reply.prefill_s,
                generated_tokens=reply.completion_tokens,
                decode_s=decode_s,
                cached_tokens=reply.prefix_tokens if reply.cache_restored else 0,
                draft_accepted=decode.accepted if decode is not None else 0,
                draft_generated=decode.drafted if decode is not None else 0,
                decode_tokens=reply.completion_tokens,  # its decode rate counts them all
                speculated=decode is None or decode.speculative,
                # The client waits for the whole reply less its decode: PFlash's scoring and
                # KVFlash's paging are outside the engine's prefill time.
                ttft_s=max(0.0, reply.total_s - decode_s),
            )
        )
        if kept and decode is not None:  # lucebox's own replies are not the guard's to judge
            self._count_speculation(decode)

    def _count_speculation(self, decode: DecodeLine) -> None:
        if decode.speculative:
            self.accepted_total += decode.accepted
            self.drafted_total += decode.drafted
            self.spec_steps_total += decode.steps
        else:
            self.replies_without_speculation += 1


def warm_up_body() -> dict[str, Any]:
    """The first request (the engine allocates its rollback buffers and graphs then)."""
    return {"messages": list(WARM_UP_MESSAGES), "max_tokens": 8, "temperature": 0}


class LuceboxSampler(Sampler):
    """The sampler for dflash_server: liveness and phase from ``/status/json`` instead of
    ``/metrics``, replies from its log, acceptance from its ``[spec-decode]`` lines."""

    silent_factor = 1.0
    """Its connection threads answer ``/status/json`` whatever the worker computes: a running
    request whose engine answers nothing for the prefill floor is a stopped engine."""

    def __init__(self, url: str, engine_pid: int, log: LuceboxLog, **options: Any) -> None:
        super().__init__(url, engine_pid, log, **options)
        self.lucebox_log = log
        self._answers = 0

    def cache_status(self) -> CacheStatus:
        return replace(super().cache_status(), last_restore=self.lucebox_log.disk_restore)

    async def sample_once(self, client: httpx.AsyncClient) -> Sample | None:
        self.look = None
        try:
            page = await client.get(f"{self.url}/status/json")
            status = page.json() if page.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(status, dict):
            return None
        phase = status.get("phase")
        busy = phase not in (None, "idle")
        self._running = {0: 0} if busy else {}
        self._slots_total = 1
        now_s = self.clock()
        # Its status has no token counts: an answer while busy counts as progress, so only an
        # engine that stops answering is judged hung.
        self._answers += 1
        decoding = isinstance(phase, str) and "decode" in phase
        self.look = Look(now_s, busy, "decode" if decoding else "prefill", 0, (self._answers,))
        finished = self._take_finished(now_s)
        log = self.lucebox_log
        return self._assembled(
            finished,
            self.window.rates(now_s),
            # Running totals for the speculation guard, as llama-server's counters give them:
            # without them it reads "drafted nothing" and switched DDTree off at 94% accepted.
            draft_tokens_total=log.drafted_total if self.spec_type else None,
            accepted_tokens_total=log.accepted_total if self.spec_type else None,
            slots_busy=len(self._running),
            slots_total=1,
        )

    def spec_status(self) -> SpecStatus | None:
        if self.spec_type is None:
            return None
        log = self.lucebox_log
        reason = self.spec_reason or f"{self.spec_type} as planned"
        if log.spec_failure is not None:
            reason = f"the engine could not speculate: {log.spec_failure}"
        elif log.replies_without_speculation:
            reason += (
                f"; {log.replies_without_speculation} replies decoded without speculation "
                "(the engine speculates only for greedy requests without penalties unless "
                "sampled verification is on)"
            )
        return SpecStatus(
            self.spec_type,
            log.spec_failure is None,
            reason,
            _ratio(log.accepted_total, log.drafted_total),
            _ratio(log.accepted_total, log.spec_steps_total),
        )
