"""Configurations that lucebox starts one after the other, each measured by one workload.

For ``bench quick --compare spec=on,off`` and ``bench replay --compare cache=on,off`` (or
``vision=on,off``): each
named configuration is served by a real ``lucebox serve`` (the same pipeline and planner as a
user's server) on a free loopback port, the workload runs against its URL, and the server is
stopped through its own SIGTERM path before the next one starts, so no engine outlives it.

A configuration says what differs from the planned launch: ``lucebox serve`` options the one
planner turns into the engine's flags (so a compared launch is a planned launch), and fields
added to every request. ``engine=lucebox,llama-server`` serves the same files with each
engine; each side is planned first, so a side the planner refuses (the Lucebox engine on a PC
without an NVIDIA GPU) stops the comparison before any server starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lucebox.engine.bench.recalibration import (
    CALIBRATED_TIMEOUT_S,
    MeasurementsAside,
    calibrating_env,
    wait_calibrated,
)
from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.command import cli_argv
from lucebox.engine.core.errors import GuardRefusal, RunError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds
from lucebox.engine.machine import config
from lucebox.engine.machine.apikey import client_api_key
from lucebox.engine.pipeline import ServeOptions, prepare
from lucebox.engine.plan.enginechoice import EngineMode
from lucebox.engine.plan.speculation.speculation import SPEC_MODES
from lucebox.engine.run.runstate import current_status, pid_alive
from lucebox.engine.run.sample import SamplingStatus

Result = TypeVar("Result")


@dataclass(frozen=True)
class ServeConfig:
    """One configuration to serve and measure."""

    name: str
    serve_args: tuple[str, ...] = ()
    """Arguments added to ``lucebox serve``."""
    request_fields: tuple[tuple[str, Any], ...] = ()
    """Fields the workload adds to every request (e.g. ``cache_prompt: false``)."""
    engine: EngineMode | None = None
    """The engine asked for (``--engine``); None leaves the choice to the planner."""


@dataclass(frozen=True)
class Served:
    """A running server a workload talks to."""

    url: str
    model: str | None = None
    api_key: str | None = None
    config: ServeConfig = field(default_factory=lambda: ServeConfig("default"))
    engine_log: Path | None = None
    """The serving engine's log, where the Lucebox engine writes what each reply drafted."""
    sampling: SamplingStatus | None = None
    """The sampling its requests got (`status`); the bench measures at it. None: greedy."""

    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)


# What each side of a --compare axis changes. cache=on is the planner's agent profile; off: no
# host-RAM prompt cache, no checkpoints or slot files, and no prompt reuse per request
# (llama-server's `cache_prompt`). spec=on lets the planner choose the speculation (a verdict the
# calibration stored serves, a combination of n-gram lookup and a draft included), spec=MODE
# forces one mode (spec=on,off,draft,ngram measures each side of a calibration). vision=on
# serves the model's projector (a loaded projector changes what llama-server may reuse of a
# prompt), off serves the same model without it.
AXES: Mapping[str, Mapping[str, ServeConfig]] = {
    "cache": {
        "on": ServeConfig("cache=on", serve_args=("--cache", "agent")),
        "off": ServeConfig(
            "cache=off", serve_args=("--cache", "off"), request_fields=(("cache_prompt", False),)
        ),
    },
    "spec": {
        "on": ServeConfig("spec=on", serve_args=("--spec", "auto")),
        "off": ServeConfig("spec=off", serve_args=("--spec", "off")),
        **{
            mode: ServeConfig(f"spec={mode}", serve_args=("--spec", mode))
            for mode in SPEC_MODES
            if mode not in ("auto", "off")
        },
    },
    "engine": {
        kind: ServeConfig(f"engine={kind}", engine=kind)
        for kind in (kinds.LUCEBOX.name, kinds.LLAMA_SERVER.name)
    },
    "vision": {
        "on": ServeConfig("vision=on", serve_args=("--vision", "on")),
        "off": ServeConfig("vision=off", serve_args=("--vision", "off")),
    },
}


def compare_form(axis: str) -> str:
    """How ``--compare`` names both sides of ``axis``: ``spec=on,off`` (its first two)."""
    return f"{axis}={','.join(list(AXES[axis])[:2])}"


def parse_compare(text: str, allowed_axes: tuple[str, ...]) -> tuple[ServeConfig, ...]:
    """``cache=on,off`` -> the two configurations, in the order given."""
    axis, _, values = text.partition("=")
    sides = AXES.get(axis)
    names = [value.strip() for value in values.split(",") if value.strip()]
    if axis not in allowed_axes or sides is None:
        forms = " or ".join(f"--compare {compare_form(a)}" for a in allowed_axes)
        raise UsageError(f"cannot compare {text!r} here", hint=f"use {forms}")
    if len(names) < 2 or len(set(names)) != len(names) or not set(names) <= set(sides):
        raise UsageError(
            f"--compare {text!r} needs two different values of {sorted(sides)}",
            hint=f"e.g. --compare {compare_form(axis)}",
        )
    return tuple(sides[name] for name in names)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text("utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in text.splitlines()[-lines:] if line.strip())


def _compared_options(options: ServeOptions, serve: ServeConfig, port: int | None) -> ServeOptions:
    """What ``lucebox serve`` is given for ``serve``: the files asked for, on loopback."""
    return ServeOptions(
        preset=options.preset,
        model=options.model,
        draft=options.draft,
        ctx=options.ctx,
        gpus=options.gpus,
        allow_base=options.allow_base,
        host="127.0.0.1",
        port=port,
        engine=serve.engine,
    )


def check_planned(paths: Paths, options: ServeOptions, configs: tuple[ServeConfig, ...]) -> None:
    """Refuse before any server starts when the planner refuses a configuration that asks for
    an engine (planned as ``plan`` would: nothing fetched or built)."""
    for serve in configs:
        if serve.engine is None:
            continue
        try:
            prepare(paths, _compared_options(options, serve, None), lambda e: None, dry_run=True)
        except GuardRefusal as exc:
            raise GuardRefusal(
                f"cannot compare engines: {serve.name} would not start: {exc.message}",
                hint="compare engines on a PC whose NVIDIA GPU the Lucebox engine serves "
                "(`lucebox plan --engine lucebox` says why not); one engine's speculation: "
                "--compare spec=on,off",
            ) from exc


class _ServeProcess:
    """One `lucebox serve` child: started, waited on until ready, stopped cleanly."""

    def __init__(
        self, paths: Paths, options: ServeOptions, serve: ServeConfig, env: Mapping[str, str]
    ) -> None:
        self.paths = paths
        self.config = serve
        self.port = free_port()
        self.log = paths.ensure(paths.logs_dir) / f"compare-{serve.name.replace('=', '-')}.log"
        argv = cli_argv(
            "serve",
            *_compared_options(options, serve, self.port).to_args(),
            *serve.serve_args,
        )
        with self.log.open("w") as handle:
            self.proc = subprocess.Popen(
                argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
            )
        self.engine_pid: int | None = None

    def wait_ready(self, timeout_s: float) -> str:
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = current_status(self.paths)
            if status.pid == self.proc.pid:
                self.engine_pid = status.engine_pid or self.engine_pid
                if status.state == "ready" and status.url == url:
                    return url
                if status.state == "failed":
                    break
            if self.proc.poll() is not None:
                break
            time.sleep(0.25)
        else:
            raise RunError(
                f"{self.config.name}: the server was not ready within {timeout_s:.0f} s",
                hint=f"its log is {self.log}",
            )
        raise RunError(
            f"{self.config.name}: lucebox serve stopped before it was ready: {_tail(self.log)}",
            hint=f"full log: {self.log}",
        )

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM (lucebox stops its engine on that path), then kill what is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.engine_pid is not None and pid_alive(self.engine_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.engine_pid, signal.SIGKILL)


@contextlib.contextmanager
def _cold_slots(paths: Paths) -> Iterator[None]:
    """Saved slots set aside while a configuration runs, then put back.

    Every planned stop saves the engine's slot and the next start of the same model restores
    it, so without this the second configuration would start warm from the first one's prompts
    (and the user's own saved slot would be replaced by the bench's).
    """
    folder = paths.slots_dir
    aside = folder.with_name(f"{folder.name}.compare-{os.getpid()}")
    if folder.exists():
        folder.rename(aside)
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if aside.exists():
            aside.rename(folder)


@contextlib.contextmanager
def serving(
    paths: Paths,
    options: ServeOptions,
    serve: ServeConfig,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 900,
) -> Iterator[Served]:
    """``lucebox serve`` for one configuration, from ready until the block ends.

    ``env`` is the child's environment (default: this process's); its ``LUCEBOX_HOME`` must
    name the same home as ``paths``.
    """
    with restartable(paths, options, serve, env=env, ready_timeout_s=ready_timeout_s) as server:
        yield server.served


class RestartableServer:
    """A ``lucebox serve`` child that can be stopped and started again as a user would: each
    stop saves the engine's slot and each start restores it."""

    def __init__(
        self, paths: Paths, options: ServeOptions, serve: ServeConfig, env: Mapping[str, str]
    ) -> None:
        self.paths, self.options, self.config, self.env = paths, options, serve, env
        self.child: _ServeProcess | None = None
        self._served: Served | None = None
        self.measurements: MeasurementsAside | None = None
        """The user's measurement store, kept aside once the server calibrated."""
        self.verdict: str | None = None
        """What the latest calibration chose."""

    @property
    def served(self) -> Served:
        """The server running now."""
        if self._served is None:
            raise RunError(f"{self.config.name}: the server has not started")
        return self._served

    def start(
        self,
        ready_timeout_s: float = 900,
        options: ServeOptions | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Served:
        """Serve this configuration (or ``options`` in its place, with ``env`` in place of the
        server's environment) until it is ready."""
        child = _ServeProcess(
            self.paths, options or self.options, self.config, self.env if env is None else env
        )
        self.child = child
        return self._now_served(child.wait_ready(ready_timeout_s))

    def _now_served(self, url: str) -> Served:
        api_key = client_api_key(self.paths, config.load_settings(self.paths).api_key)
        status = current_status(self.paths)
        log = Path(status.log) if status.log else None
        self._served = Served(url, status.model, api_key, self.config, log, status.sampling)
        return self._served

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child, self._served = None, None

    def restart(self) -> Served:
        """``lucebox down`` then ``lucebox serve`` of the same configuration; the new server."""
        self.stop()
        return self.start()

    def swap(self, other: ServeOptions) -> Served:
        """Serve ``other`` until it is ready, then this configuration again: a swap and back."""
        self.stop()
        self.start(options=other)
        return self.restart()

    def calibrate(self) -> Served:
        """Serve this configuration with its speculation unmeasured and a short idle wait, so it
        calibrates as ``serve`` does once idle; the server once the calibration is done and the
        planned launch serves again.

        A restart, because a serve calibrates once per launch whose speculation the store has
        not measured. The user's measurement store is kept aside from the first calibration
        until the server's block ends (:func:`restartable` puts it back); each calibration
        starts from no speculation measured, the previous turn's verdict forgotten too.
        """
        self.stop()
        if self.measurements is None:
            self.measurements = MeasurementsAside(self.paths)
        self.measurements.forget_speculation()
        served = self.start(env=calibrating_env(self.env))
        child = self.child
        assert child is not None
        self.verdict = wait_calibrated(
            self.paths,
            child.proc.pid,
            lambda: child.proc.poll() is None,
            child.log,
            CALIBRATED_TIMEOUT_S,
        )
        return self._now_served(served.url)


@contextlib.contextmanager
def restartable(
    paths: Paths,
    options: ServeOptions,
    serve: ServeConfig,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 900,
) -> Iterator[RestartableServer]:
    """A restartable server for one configuration, its saved slots its own while it lasts, and
    the measurement store as it found it once it stops (a calibration's verdicts are the bench's
    own), however the block ends."""
    with _cold_slots(paths):
        server = RestartableServer(paths, options, serve, os.environ if env is None else env)
        try:
            server.start(ready_timeout_s)
            yield server
        finally:
            try:
                server.stop()
            finally:
                if server.measurements is not None:
                    server.measurements.put_back()


def refuse_running(paths: Paths, option: str) -> None:
    """Refuse to start a bench's own server while the user's runs (one engine at a time)."""
    running = current_status(paths)
    if running.state != "stopped":
        raise UsageError(
            f"lucebox already serves {running.model} at {running.url}; "
            f"{option} starts its own servers",
            hint=f"stop it with `lucebox down`, or measure it with --url / without {option}",
        )


def run_configs(
    paths: Paths,
    options: ServeOptions,
    configs: tuple[ServeConfig, ...],
    workload: Callable[[Served], Result],
    *,
    ready_timeout_s: float = 900,
    on_note: Callable[[str], None] = lambda note: None,
) -> list[tuple[ServeConfig, Result]]:
    """Serve each configuration in turn and run ``workload`` against it (blocking)."""
    refuse_running(paths, "--compare")
    check_planned(paths, options, configs)
    results: list[tuple[ServeConfig, Result]] = []
    for serve in configs:
        on_note(f"{serve.name}: starting lucebox serve")
        try:
            with serving(paths, options, serve, ready_timeout_s=ready_timeout_s) as served:
                on_note(f"{serve.name}: ready at {served.url}")
                results.append((serve, workload(served)))
        finally:
            on_note(f"{serve.name}: stopped")
    return results
