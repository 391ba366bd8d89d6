"""The engine's log, read line by line as it writes it: llama-server's per-request facts.

At default verbosity the engine logs each finished request's timing lines (``prompt eval time
= ... ms / N tokens``, ``eval time = ...``, the draft's acceptance, then ``stop processing``);
each request becomes one :class:`FinishedRequest`, which the sampler (:mod:`metrics`) turns
into rates. The log also says when the engine re-reads a whole prompt and why it could not
start speculation.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from lucebox.engine.plan.speculation.workload import ServedRequest
from lucebox.engine.run.kinds.ownrequests import OwnRequests

_SLOT_LINE = re.compile(r"slot\s+\w+: id\s+(\d+) \| task (-?\d+) \| (.*)$")
_PROMPT_EVAL = re.compile(r"^prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"^\s*eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_DRAFT = re.compile(r"^draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")
_STOP = re.compile(r"^stop processing: n_tokens = (\d+)")
FULL_REPROCESS = "forcing full prompt re-processing"
SPEC_INIT_FAILED = re.compile(r"failed to initialize speculative decoding context: (.*)$")


@dataclass(frozen=True)
class FinishedRequest:
    """One request as the engine reported it when it finished."""

    task_id: int
    prompt_tokens: int
    """Prompt tokens processed (cached ones excluded), the engine's `prompt_n`."""
    prompt_s: float
    generated_tokens: int
    """The engine's `predicted_n`."""
    decode_s: float
    cached_tokens: int | None
    """Prompt tokens taken from the cache: what the slot held at the end, less what this
    request processed and generated (its last token never enters the cache)."""
    draft_accepted: int = 0
    draft_generated: int = 0
    ttft_s: float | None = None
    """What the client waited for its first token (request received to first token), where
    the engine's log gives it apart from the prompt time; None: the prompt time is it."""
    decode_tokens: int | None = None
    """The tokens the engine's own decode rate counts over ``decode_s``, where its rule is
    not llama-server's (the Lucebox engine counts every generated token)."""
    speculated: bool = True
    """False where the engine's log says the reply decoded without the draft."""

    @property
    def decode_steps(self) -> int:
        """The tokens the engine's own per-reply decode rate counts: llama-server's generated
        tokens less the first, which comes with the prompt, unless ``decode_tokens`` says."""
        if self.decode_tokens is not None:
            return self.decode_tokens
        return max(0, self.generated_tokens - 1)

    @property
    def first_token_s(self) -> float:
        """Time to first token as the client waited it."""
        return self.ttft_s if self.ttft_s is not None else self.prompt_s

    def served(self) -> ServedRequest:
        """The request as the speculation guard and the workload mix see it."""
        prompt_tokens = self.prompt_tokens + (self.cached_tokens or 0)
        return ServedRequest(
            prompt_tokens, self.generated_tokens, self.decode_s, speculated=self.speculated
        )


class EngineLog:
    """Per-request facts from the engine's log, fed one line at a time as it writes them."""

    def __init__(self) -> None:
        self._open: dict[int, dict[str, float]] = {}
        self._finished: list[FinishedRequest] = []
        self.full_reprocess_events = 0
        self.spec_failure: str | None = None
        self.finished_one = asyncio.Event()
        """Set when a request finishes, so the sampler samples at once."""
        self.own: OwnRequests | None = None
        """lucebox's own requests to this engine: the requests they finish are not reported."""

    def _finish(self, request: FinishedRequest) -> bool:
        """Report ``request`` finished; False when it was lucebox's own (not reported)."""
        if self.own is not None and self.own.claims():
            return False
        self._finished.append(request)
        self.finished_one.set()
        return True

    def feed(self, line: str) -> None:
        if FULL_REPROCESS in line:
            self.full_reprocess_events += 1
            return
        if (failed := SPEC_INIT_FAILED.search(line)) is not None:
            self.spec_failure = failed.group(1).strip()
            return
        slot_line = _SLOT_LINE.search(line)
        if slot_line is None:
            return
        task_id, message = int(slot_line.group(2)), slot_line.group(3)
        facts = self._open.setdefault(task_id, {})
        if (prompt := _PROMPT_EVAL.match(message)) is not None:
            facts["prompt_ms"], facts["prompt_n"] = float(prompt[1]), int(prompt[2])
        elif (decode := _EVAL.match(message)) is not None:
            facts["decode_ms"], facts["predicted_n"] = float(decode[1]), int(decode[2])
        elif (draft := _DRAFT.match(message)) is not None:
            facts["draft_accepted"], facts["draft_generated"] = int(draft[1]), int(draft[2])
        elif (stop := _STOP.match(message)) is not None:
            del self._open[task_id]
            if "prompt_n" in facts and "predicted_n" in facts:
                self._finish(self._request(task_id, facts, int(stop[1])))
        elif not facts:
            del self._open[task_id]

    @staticmethod
    def _request(task_id: int, facts: dict[str, float], slot_tokens: int) -> FinishedRequest:
        prompt_n, predicted_n = int(facts["prompt_n"]), int(facts["predicted_n"])
        cached = slot_tokens - prompt_n - max(0, predicted_n - 1)
        return FinishedRequest(
            task_id,
            prompt_n,
            facts["prompt_ms"] / 1000,
            predicted_n,
            facts["decode_ms"] / 1000,
            cached if cached >= 0 else None,
            int(facts.get("draft_accepted", 0)),
            int(facts.get("draft_generated", 0)),
        )

    def take_finished(self) -> list[FinishedRequest]:
        """The requests finished since the last call, in the order they finished."""
        finished, self._finished = self._finished, []
        return finished
