"""Benchmark: does a client's conversation survive a stop and start of the run (issue 55)?

An agent's conversation of 8K+ tokens (a long project note, then agent steps: a test run's
output of a few hundred tokens with every earlier reply sent back, as clients send them; the
replies short) with a real `lucebox serve` on the built CPU llama-server, through the front's
`/v1/chat/completions` with the model's template, for SmolLM2 (real, PyPI; its header's trained
context raised so `serve` plans past 8K) and a generated qwen35 hybrid (recurrent layers, 8x
the tests' width). Each event, three times: a warm turn, the event, then the next turn; the
medians of both and their ratio (issue 55 asks the turn after within 1.5x of the warm one):

- restart: `lucebox down`, `lucebox serve` (the slot saved at the stop, restored at the start);
- idle calibration: a serve whose speculation is unmeasured (its measurement store emptied,
  ``spec.calibrate_idle_s`` on, as a first serve of a model has it) goes idle after the warm
  turn; the calibration `serve` starts then runs its trials (their restarts and probes take
  the engine) and serves what it chose; the next turn comes after;
- sleep: the engine sleeps once idle (``server.sleep_idle_s``) and the turn wakes it;
- evict and wake: the model served in a set beside a generated wide llama (1 GiB of weights)
  with ``models.ram_mib`` so tight that one evicts the other; a request to the other model
  evicts the bench's (the set's proxy saves its slot first), and the next turn loads it again
  (the proxy restores the slot before the turn passes).

``outside_s`` of a turn is its time to the first token less the engine's prompt time: the
start, the restore and the front's hold on a wake or restart. ``others_cores`` of a turn is how
many cores the machine's other work (not the bench, the serve or its engines) kept busy during
it: on a shared 2-core machine the same prompt on the same engine takes from 0.9 s to 5.5 s as
that load comes and goes, so a pair whose turns saw different loads says little.

    .venv/bin/python -m benchmarks.conversation_survives_restart [--out FILE] [--models ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.plan.speculation.measurements import store_file
from support.agentchat import WAIT_S, Conversation, Serving, note_line, tool_result
from support.agentrun import write_results
from support.ggufgen import ModelSpec, cached_gguf, qwen35_target, widen
from support.realmodels import smol_model_long

CTX = 20480
"""Room for the 8K+ start and the ~25 agent steps after it."""
NOTE_LINES = {"smollm2": 210, "qwen35-hybrid": 60}
"""~8,200 tokens of note each: SmolLM2 reads a note line in ~39 tokens, the generated
tokenizer in ~137."""
TOOL_LINES = {"smollm2": 11, "qwen35-hybrid": 2}
"""~300 tokens of test output an agent step (~28 and ~160 tokens a line)."""
REPLY_TOKENS = 16
REPEATS = 3
HYBRID_WIDTH = 8
"""The generated hybrid 8x wider than the tests' (n_embd 512): reading a prompt takes long
enough to tell a warm turn from a cold one by time, not only by tokens."""
PLAIN = {"server.sleep_idle_s": "0", "spec.calibrate_idle_s": "0"}
SLEEPING = {"server.sleep_idle_s": "3", "spec.calibrate_idle_s": "0"}
CALIBRATING = {
    "server.sleep_idle_s": "0",
    "spec.calibrate_idle_s": "5",
    "spec.probe_max_tokens": "32",
}
"""Five seconds idle before the calibration (30 by default: the bench waits it out 3 times);
short probes, as the calibration's own tests use."""
IN_A_SET = {**PLAIN, "models.ram_mib": "1800"}
"""Room for either model of the set alone, each with its whole 20480-token context, never for
both: the other's weights alone take 1 GiB."""
OTHER = ModelSpec(
    basename="wide-llama",
    n_ctx=32768,
    n_layer=5,
    n_embd=2048,
    n_head=16,
    n_head_kv=2,
    n_ff=16384,
    constant_weights=True,
)
"""The set's other model: a generated llama wide enough that the planner cannot shrink the two
to fit together (the Gemma 270M is a base model the set refuses; a tiny one fits beside with a
quantized cache)."""


def model_path(name: str) -> Path:
    if name == "smollm2":
        return smol_model_long(32768)
    return cached_gguf(widen(qwen35_target(mtp=False, n_ctx=32768), HYBRID_WIDTH))


@dataclass
class Session:
    """One model's conversation and the serve it talks to."""

    name: str
    chat: Conversation
    serving: Serving
    turns: list[dict[str, Any]]
    verdicts: list[str | None]
    """What each idle calibration chose."""

    async def turn(self, label: str) -> dict[str, Any]:
        """The next agent step: a test run's output (the earlier replies sent back)."""
        question = "tool result:\n" + tool_result(self.chat.steps, TOOL_LINES[self.name])
        found = await self.chat.turn(self.serving.url, question)
        if found["prompt_ms"] is not None:
            found["outside_s"] = round(found["ttft_s"] - found["prompt_ms"] / 1000, 3)
        status = self.serving.status
        found["label"] = label
        found["restarts"] = [status.restarts, status.planned_restarts]
        self.turns.append(found)
        print(f"{self.name} {label}: {found}", file=sys.stderr, flush=True)
        return found

    async def serve_with(self, settings: dict[str, str], others: tuple[Path, ...] = ()) -> None:
        """A serve read with ``settings``, of the model alone or in a set with ``others``; a new
        one (and a turn that restores the slot, left out of the pairs) when the one running was
        started otherwise."""
        serving = self.serving
        if serving.process is not None and (serving.settings, serving.others) == (settings, others):
            return
        if serving.process is not None:
            serving.down()
        serving.configure(settings)
        serving.others = others
        self.chat.model = serving.model.stem if others else None  # a set routes by alias
        await serving.serve()
        await self.turn("after a start (unpaired)")


@dataclass(frozen=True)
class Event:
    """An event between a warm turn and the next: ``prepare`` brings the serve to where the
    warm turn is served, ``happen`` is the event."""

    name: str
    prepare: Callable[[Session], Awaitable[None]]
    happen: Callable[[Session], Awaitable[None]]


async def plain(session: Session) -> None:
    await session.serve_with(PLAIN)


async def restart(session: Session) -> None:
    """`lucebox down`, then `lucebox serve` until it serves."""
    session.serving.down()
    await session.serving.serve()


async def sleeping_serve(session: Session) -> None:
    await session.serve_with(SLEEPING)


async def sleep(session: Session) -> None:
    """Idle until the engine sleeps (its slot saved); the next turn wakes it."""
    await session.serving.until(lambda s: s.sleep is not None and s.sleep.asleep, "asleep")


async def uncalibrated_serve(session: Session) -> None:
    """A serve whose speculation is unmeasured: a calibration is due once it is idle."""
    if session.serving.process is not None:
        session.serving.down()
    store_file(session.serving.paths).unlink(missing_ok=True)
    await session.serve_with(CALIBRATING)


async def idle_calibration(session: Session) -> None:
    """Idle until the calibration `serve` started has chosen and serves its choice: the store
    holds a verdict and no planned restart came for 3 s."""
    serving = session.serving
    await serving.until(lambda _: chosen(serving) is not None, "calibrated")
    session.verdicts.append(chosen(serving))
    restarts = -1
    while restarts != serving.status.planned_restarts:
        restarts = serving.status.planned_restarts
        await asyncio.sleep(3)
        await serving.until(lambda s: s.state == "ready", "ready after the calibration")


def chosen(serving: Serving) -> str | None:
    """The calibration's verdict in the home's measurement store; None before it."""
    path = store_file(serving.paths)
    entries = json.loads(path.read_text())["entries"] if path.exists() else {}
    verdicts = [entry.get("chosen") for entry in entries.values()]
    return next((v for v in verdicts if v is not None), None)


async def set_serve(session: Session) -> None:
    """The model served in a set beside :data:`OTHER`, one of the two loaded at a time."""
    await session.serve_with(IN_A_SET, (cached_gguf(OTHER),))


async def evict_and_wake(session: Session) -> None:
    """One request to the set's other model: its load evicts the bench's model, whose slot the
    proxy saves first; the next turn loads it again and the proxy restores the slot."""
    serving = session.serving
    other = serving.others[0].stem
    body = {"model": other, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        (await client.post(f"{serving.url}/v1/chat/completions", json=body)).raise_for_status()
    bench = serving.model.stem
    unloaded = {"unloaded"}
    await serving.until(
        lambda s: {m.state for m in s.models if m.alias == bench} == unloaded, "evicted"
    )


EVENTS = (
    Event("restart", plain, restart),
    Event("idle_calibration", uncalibrated_serve, idle_calibration),
    Event("sleep", sleeping_serve, sleep),
    Event("evict_and_wake", set_serve, evict_and_wake),
)
"""What is measured, in this order (the set last: each other event serves the model alone)."""


async def measure(name: str, folder: Path, events: tuple[Event, ...]) -> dict[str, Any]:
    note = "".join(note_line(i) for i in range(NOTE_LINES[name]))
    chat = Conversation(
        [{"role": "system", "content": "You are a coding agent. Project notes:\n" + note}],
        REPLY_TOKENS,
    )
    serving = Serving.in_folder(folder, model_path(name), CTX)
    session = Session(name, chat, serving, [], [])
    found: dict[str, Any] = {}
    try:
        serving.configure(PLAIN)
        await serving.serve()
        found["first"] = await session.turn("first")
        for event in events:
            found[event.name] = summary(await repeated(session, event))
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        found["failed"] = f"{type(exc).__name__}: {exc}"  # the events before it are kept
    finally:
        if serving.process is not None:
            serving.down()
        found["turns"] = session.turns
        found["calibration_verdicts"] = session.verdicts
        found["lucebox_lines"] = lucebox_lines(serving.engine_log())
    return found


async def repeated(session: Session, event: Event) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The warm turn and the turn after ``event``, ``REPEATS`` times."""
    pairs = []
    for _ in range(REPEATS):
        await event.prepare(session)
        warm = await session.turn(f"warm before {event.name}")
        await event.happen(session)
        pairs.append((warm, await session.turn(f"after {event.name}")))
    return pairs


def summary(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The medians of the warm turns and of the turns after the event, and their ratio; the
    median of each pair's ratio too (a pair is served minutes apart at most: it reads less of
    the machine's changing load than medians taken over the whole run)."""
    warm_s = statistics.median(w["ttft_s"] for w, _ in pairs)
    after_s = statistics.median(a["ttft_s"] for _, a in pairs)
    return {
        "warm_ttft_median_s": round(warm_s, 3),
        "after_ttft_median_s": round(after_s, 3),
        "ratio": round(after_s / warm_s, 2),
        "ratios": [round(a["ttft_s"] / w["ttft_s"], 2) for w, a in pairs],
        "pair_ratio_median": round(
            statistics.median(a["ttft_s"] / w["ttft_s"] for w, a in pairs), 2
        ),
        "warm_prompt_n": [w["prompt_n"] for w, _ in pairs],
        "after_prompt_n": [a["prompt_n"] for _, a in pairs],
        "after_outside_s": [a.get("outside_s") for _, a in pairs],
        "warm_others_cores": [w.get("others_cores") for w, _ in pairs],
        "after_others_cores": [a.get("others_cores") for _, a in pairs],
    }


def lucebox_lines(log: str) -> list[str]:
    """What lucebox wrote in the engine log about slots (a set's lines name the model first),
    sleeps and restarts."""
    kept = ("# lucebox: slot", "# lucebox: sleeping", "# lucebox: waking", "# lucebox: restart")
    return [
        line
        for line in log.splitlines()
        if line.startswith(kept) or (line.startswith("# lucebox: ") and ": slot " in line)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--models", nargs="+", choices=list(NOTE_LINES), default=list(NOTE_LINES))
    parser.add_argument("--events", nargs="+", choices=[e.name for e in EVENTS])
    args = parser.parse_args()
    events = tuple(e for e in EVENTS if args.events is None or e.name in args.events)
    command = ["python", "-m", "benchmarks.conversation_survives_restart"]
    command += ["--models", *args.models]
    command += ["--events", *args.events] if args.events else []
    results: dict[str, Any] = {"ctx": CTX, "threads": os.cpu_count(), "repeats": REPEATS}
    results["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="lucebox-conversation-") as folder:
            results[name] = asyncio.run(measure(name, Path(folder), events))
        if args.out is not None:  # each model's figures kept as soon as they are in
            args.out.write_text(json.dumps({**results, "command": shlex.join(command)}, indent=1))
    return write_results(results, command, args.out)


if __name__ == "__main__":
    sys.exit(main())
