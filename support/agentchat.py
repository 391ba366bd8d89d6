"""An agent's long conversation with a real `lucebox serve`, for the conversation benchmark: the
serve process in a home of its own (started, stopped with `lucebox down`, its settings set the
way `lucebox config set` sets them), and the turns a client sends, timed to the first token,
each with the CPU the machine's other work took meanwhile (on a shared machine it can slow a
turn several times over)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.machine import config
from lucebox.engine.run.runstate import Status, current_status
from support.ports import free_port
from support.smolserver import private_engine_home

WAIT_S = 900.0
"""The longest wait for a start, a calibration or a sleep (a loaded 2-core machine)."""


@dataclass(frozen=True)
class CpuMark:
    """The machine's busy CPU time and that of this process and all it started, at one time."""

    at_s: float
    busy_s: float
    """User, nice, system and interrupt time of every core (the host's steal left out)."""
    ours_s: float
    """This process's CPU time and its descendants', the exited ones' included."""


def cpu_mark() -> CpuMark:
    """The machine's and this process tree's CPU time now: the bench, `lucebox serve`, the
    engine and every model process are all its descendants."""
    times = psutil.cpu_times()
    busy_s = times.user + times.nice + times.system
    busy_s += getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)
    me = psutil.Process()
    ours_s = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            used = process.cpu_times()
        except psutil.Error:  # gone meanwhile: its parent counts it once it is reaped
            continue
        ours_s += used.user + used.system + used.children_user + used.children_system
    return CpuMark(time.monotonic(), busy_s, ours_s)


def others_cores(before: CpuMark, after: CpuMark) -> float | None:
    """How many cores the machine's other work kept busy between two marks, on average: its
    busy time less this process tree's (pure). None over no time."""
    span_s = after.at_s - before.at_s
    if span_s <= 0:
        return None
    other_s = (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)
    return round(max(other_s, 0.0) / span_s, 2)


def note_line(index: int) -> str:
    """One line of the agent's long project note (its system prompt)."""
    return (
        f"Note {index}: module_{index}.py keeps its state in a cache file; "
        f"its tests are in tests/test_{index}.py and run in {index % 7 + 1} s.\n"
    )


def tool_result(step: int, lines: int) -> str:
    """What a test run prints: the tool result of agent step ``step``."""
    said = [f"$ pytest tests/test_module_{step}.py"]
    said += [
        f"tests/test_module_{step}.py::test_case_{case} PASSED"
        f"{'':<30}[{100 * (case + 1) // lines:3d}%]"
        for case in range(lines)
    ]
    return "\n".join(said)


@dataclass
class Conversation:
    """The messages a client sends back each turn: every earlier reply as it came."""

    messages: list[dict[str, str]]
    max_tokens: int
    steps: int = 0
    model: str | None = None
    """The model each turn names (a served set routes by it); None names none."""

    async def turn(self, url: str, question: str) -> dict[str, Any]:
        """One streamed turn: time to the first token and to the end, the tokens the engine
        read (``prompt_n``) and found cached (``cache_n``), and the cores the machine's other
        work kept busy meanwhile (``others_cores``)."""
        self.messages.append({"role": "user", "content": question})
        body = {
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        if self.model is not None:
            body["model"] = self.model
        reply, first_s = "", None
        timings: dict[str, Any] = {}
        started = time.monotonic()
        before = cpu_mark()
        async with (
            httpx.AsyncClient(timeout=WAIT_S) as client,
            client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer,
        ):
            answer.raise_for_status()
            async for line in answer.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text and first_s is None:
                        first_s = time.monotonic() - started
                    reply += text
        total_s = time.monotonic() - started
        others = others_cores(before, cpu_mark())
        self.messages.append({"role": "assistant", "content": reply})
        self.steps += 1
        prompt_ms = timings.get("prompt_ms")
        return {
            "ttft_s": round(first_s if first_s is not None else total_s, 3),
            "total_s": round(total_s, 3),
            "prompt_n": timings.get("prompt_n"),
            "cache_n": timings.get("cache_n"),
            "prompt_ms": round(prompt_ms, 1) if prompt_ms is not None else None,
            "others_cores": others,
        }


@dataclass
class Serving:
    """`lucebox serve --model MODEL [--model OTHER ...] --ctx CTX` in ``home``, stopped with
    `lucebox down`."""

    home: Path
    model: Path
    ctx: int
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    settings: dict[str, str] = field(default_factory=dict)
    others: tuple[Path, ...] = ()
    """The served set's other models (each one more ``--model``); none serves ``model`` alone."""

    @classmethod
    def in_folder(cls, folder: Path, model: Path, ctx: int) -> Serving:
        return cls(private_engine_home(folder / "home"), model, ctx)

    @property
    def paths(self) -> Paths:
        return resolve_paths({"LUCEBOX_HOME": str(self.home)})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def status(self) -> Status:
        return current_status(self.paths)

    def configure(self, settings: dict[str, str]) -> None:
        """Set ``settings`` in the home's config.toml (read by the next serve)."""
        for key, value in settings.items():
            config.set_setting(self.paths, key, value)
        self.settings = dict(settings)

    async def serve(self) -> None:
        """Start `lucebox serve` and wait until it serves."""
        self.process = self._start()
        await self.until(lambda s: s.state == "ready" and s.engine_pid is not None, "ready")

    def _start(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", str(self.model)]
        for other in self.others:
            argv += ["--model", str(other)]
        argv += ["--ctx", str(self.ctx), "--port", str(self.port)]
        with (self.home / "serve.out").open("ab") as out:
            return subprocess.Popen(
                argv,
                env={**os.environ, "LUCEBOX_HOME": str(self.home)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def down(self) -> None:
        """`lucebox down`, reaping the serve process meanwhile (`down` waits for its pid to
        go, and a child no one waited for stays a zombie)."""
        down = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "down"],
            env={**os.environ, "LUCEBOX_HOME": str(self.home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if self.process is not None:
            self.process.wait(timeout=120)
            self.process = None
        said, _ = down.communicate(timeout=120)
        if down.returncode != 0:
            raise RuntimeError(f"lucebox down failed: {said}")

    async def until(self, done: Callable[[Status], bool], what: str) -> Status:
        """Poll the state file (in this process: a `lucebox status` each poll would load the
        machine) until ``done(status)``."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"serve exited ({self.process.returncode}) before {what}")
            now = self.status
            if done(now):
                return now
            await asyncio.sleep(0.2)
        raise RuntimeError(f"not {what} within {WAIT_S:.0f} s: {self.status}")

    def engine_log(self) -> str:
        log = self.paths.logs_dir / "engine.log"
        return log.read_text(errors="replace") if log.exists() else ""
