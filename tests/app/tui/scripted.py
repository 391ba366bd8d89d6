"""A scripted TUI backend: pipeline steps, failures, server events and samples on cue.

The real backend is driven in test_tui.py's end-to-end test; this one produces the faults and
the frozen states (a download at 40%, a dashboard with a minute of samples) that snapshots and
failure tests need and that the real pipeline cannot hold still for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from textual.app import App
from textual.css.query import NoMatches
from textual.widgets import DataTable

from lucebox.app.tui.backend import Backend
from lucebox.app.tui.screens.presets import PresetScreen
from lucebox.engine import pipeline, runstart
from lucebox.engine.core.downloadprogress import TransferProgress
from lucebox.engine.core.errors import CancelledByUserError, GuardRefusal
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.machine.config import Settings
from lucebox.engine.models import checkresult, guard
from lucebox.engine.pipeline import Emit, Prepared, StepEvent
from lucebox.engine.plan import planner
from lucebox.engine.plan.engineview import EngineView, pinned_engine
from lucebox.engine.plan.launch import url_of
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.servedset.servedsetplan import plan_set
from lucebox.engine.plan.sources import presetchoice
from lucebox.engine.run.kinds.metrics import Sample
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.servedset.servedsetrun import ServedSetRun
from lucebox.engine.run.servedsetmodels import ModelNote, ModelsSample, ModelStatus
from lucebox.engine.run.serverrun.serverrun import RunItem, ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from lucebox.engine.servedchoice import ModelSet, OneModel, ServedChoice
from lucebox.engine.servedset import PreparedSet, planned_models
from support.ggufgen import ModelSpec, write_llama
from tests.engine.plan.test_memory_plan import GEMMA_270M

STEPS_DONE = [
    StepEvent("gpu", "running", "looking for an NVIDIA GPU"),
    StepEvent("gpu", "done", "GPU 0: NVIDIA GeForce RTX 4090, 22.6 GiB free"),
    StepEvent("preset", "done", "smoke (Gemma 3 270M smoke test)"),
    StepEvent("models", "done", "gemma-3-270m-q4_k_m.gguf"),
    StepEvent("engine", "done", "llama.cpp-b11434-cuda-sm89 (build 11434)"),
    StepEvent("plan", "done", "ctx 32768, KV f16, 1.33 GiB of 22.6 GiB"),
]
STEPS_DOWNLOADING = [
    *STEPS_DONE[:3],
    pipeline.download_step(
        TransferProgress(
            "Qwen3-14B-Q4_K_M.gguf",
            done_bytes=4 * GIB,
            total_bytes=10 * GIB,
            rate_bytes_per_s=48.5 * 2**20,
            eta_s=112,
        )
    ),
]
LOG_LINES = [
    "main: loading model",
    "llama_model_loader: loaded meta data with 39 key-value pairs",
    "load_tensors: offloaded 19/19 layers to GPU",
    "llama_context: n_ctx = 32768",
    "W the draft model is not used: no speculative type was set",
    "srv  init: initializing slots, n_slots = 1",
    "main: server is listening on http://127.0.0.1:8080",
    "srv  update_slots: all slots are idle",
]


RTX_4090 = GpuBudget("GPU 0: NVIDIA GeForce RTX 4090", 24 * GIB, int(22.6 * GIB), True)


def prepared_for(tmp_path: Path, server_path: str = "/opt/llama-server") -> Prepared:
    """What the real prepare returns, made by the one planner for a scripted RTX 4090."""
    model = write_llama(tmp_path / "smoke.gguf", GEMMA_270M)
    engine = pinned_engine()
    engine = EngineView("b11434", "b11434", server_path, engine.capabilities)
    options = ServeOptions(model=str(model), ctx=32768, cache="off", port=8080)
    launch = planner.plan_launch(
        resolve_paths(),
        options,
        resolved=resolve(options, Settings()),
        budget=RTX_4090,
        installs=replace(installs_of(), llama_server=engine),
    )
    return Prepared(launch, Settings(), 0, 60.0)


SET_SOURCES = ("qwen3-4b", "smollm2", "smoke")


def prepared_set_for() -> PreparedSet:
    """What the real prepare_set returns for three presets on a scripted RTX 4090."""
    engine = EngineView("b11434", "b11434", "/opt/llama-server", pinned_engine().capabilities)
    options = ServeOptions(models=SET_SOURCES, port=8080)
    planned = plan_set(
        resolve_paths(),
        options,
        SET_SOURCES,
        settings=Settings(),
        budget=RTX_4090,
        installs=replace(installs_of(), llama_server=engine),
    )
    return PreparedSet(planned, Settings())


def set_models(prepared: PreparedSet) -> tuple[ModelStatus, ...]:
    """The set a minute in: one model answering, one loading at 40%, one never used."""
    first, second, third = (
        ModelStatus(m.alias, "unloaded", m.device, 0, None, m.planned_bytes)
        for m in planned_models(prepared.planned)
    )
    return (
        replace(first, state="loaded", memory_bytes=first.planned_bytes, last_used_s=12.0),
        replace(second, state="loading", memory_bytes=GIB // 4, load_progress=0.4),
        third,
    )


def refused_by_the_model_check(path: Path, spec: ModelSpec) -> tuple[list[StepEvent], GuardRefusal]:
    """The notes and the error the engine's model check gives a generated model file."""
    checked = guard.check_model(write_llama(path, spec))
    assert not checked.usable
    return [pipeline.problem_note(p) for p in checked.problems], checkresult.refusal(checked)


BASE_GEMMA = ModelSpec(name="Gemma 3 270m", basename="gemma-3", finetune=None, size_label="270M")
"""A complete GGUF named like the base Gemma 3 270M release: the check refuses it as base-model."""


def samples(count: int) -> list[Sample]:
    """A minute of a busy server: decode and prefill rising and falling, steady VRAM."""
    out = []
    for second in range(count):
        wave = (second % 12) / 12
        out.append(
            Sample(
                1000.0 + second,
                decode_tokens_per_s=180.0 + 60 * wave,
                prefill_tokens_per_s=2400.0 + 900 * wave,
                ttft_s=0.08 + 0.04 * wave,
                spec_acceptance=None,
                vram_used_bytes=int(1.29 * GIB),
                gpu_util_percent=int(40 + 50 * wave),
                engine_cpu_percent=101.0,
                engine_rss_bytes=int(0.61 * GIB),
                requests_finished=int(second % 3 == 0),
                cached_prompt_share=0.62,
                slots_busy=1,
                slots_total=1,
                gpu_temperature_c=61,
                gpu_power_w=212.0,
            )
        )
    return out


@dataclass
class ScriptedBackend(Backend):
    paths: Paths
    tmp_path: Path
    steps: list[StepEvent] = field(default_factory=lambda: list(STEPS_DONE))
    failures: list[Exception] = field(default_factory=list)
    """Raised by the first prepare calls, one each."""
    server_failure: Exception | None = None
    """Raised by the server after its events, instead of serving on."""
    downloading: bool = False
    """After its steps prepare stays in a download (at 40%) until the app cancels it."""
    server_events: list[ServerEvent] = field(
        default_factory=lambda: [
            ServerEvent("starting", "engine started (pid 4242)", 4242),
            ServerEvent("loading", "loading the model", 4242),
            ServerEvent("ready", "serving at http://127.0.0.1:8080", 4242),
        ]
    )
    sample_script: list[Sample] = field(default_factory=list)
    options_seen: list[ServeOptions] = field(default_factory=list)
    detached: list[ServeOptions] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)
    users_chosen: list[int] = field(default_factory=list)
    """server.users as the TUI set it (the last one is the setting)."""
    sleep_chosen: list[float] = field(default_factory=list)
    """server.sleep_idle_s as the TUI set it (the last one is the setting)."""
    budget: GpuBudget | None = None
    """The card the preset table is planned for; None probes this machine."""
    preset_table_failure: Exception | None = None
    cpu_engine_builds: int = 0
    server_path: str = "/opt/llama-server"
    """The engine binary the launch names (one with the web UI's files shows its address)."""
    set_sources: tuple[str, ...] = ()
    """A served set to prepare instead of one model (its plan is the real one of SET_SOURCES)."""
    models_script: tuple[ModelStatus, ...] = ()
    """The set's models the router run shows once ready."""
    model_notes: tuple[ModelNote, ...] = ()
    """What the router run says it did to a model (a re-plan), after the models."""

    def preset_table(self, options: ServeOptions) -> presetchoice.PresetTable:
        if self.preset_table_failure is not None:
            raise self.preset_table_failure
        if self.budget is None:
            return super().preset_table(options)
        resolved = resolve(options, Settings())
        return presetchoice.preset_table(self.paths, options, resolved, self.budget, installs_of())

    def prepare(self, options: ServeOptions, emit: Emit, cancel: threading.Event) -> Prepared:
        self.options_seen.append(options)
        for event in self.steps:
            emit(event)
        if self.failures:
            raise self.failures.pop(0)
        if self.downloading:
            # The engine's download stops between reads once cancelled, and says so.
            if not cancel.wait(timeout=60):
                raise AssertionError("the app never cancelled the download")
            raise CancelledByUserError("download of Qwen3-14B-Q4_K_M.gguf cancelled")
        return prepared_for(self.tmp_path, self.server_path)

    def served_choice(self, options: ServeOptions) -> ServedChoice:
        return ModelSet(options, self.set_sources) if self.set_sources else OneModel(options)

    def prepare_set(self, chosen: ModelSet, emit: Emit, cancel: threading.Event) -> PreparedSet:
        options = chosen.options
        self.options_seen.append(options)
        for event in self.steps:
            emit(event)
        return prepared_set_for()

    @contextlib.asynccontextmanager
    async def router_run(self, prepared: PreparedSet, emit: Emit) -> AsyncIterator[ServedSetRun]:
        spec = prepared.planned.launches[0].server
        supervisor = Supervisor(spec, self.tmp_path / "engine.log", ready_timeout_s=60.0)
        yield ScriptedRouterRun(self, prepared, supervisor)

    def build_cpu_engine(self, emit: Emit) -> None:
        self.cpu_engine_builds += 1
        emit(StepEvent("engine", "running", "building the CPU engine, as asked"))

    def choose_preset(self, preset_id: str) -> None:
        self.chosen.append(preset_id)

    def users(self) -> int:
        return self.users_chosen[-1] if self.users_chosen else 1

    def choose_users(self, users: int) -> None:
        self.users_chosen.append(users)

    def sleep_idle_s(self) -> float:
        return self.sleep_chosen[-1] if self.sleep_chosen else 0.0

    def choose_sleep(self, idle_s: float) -> None:
        self.sleep_chosen.append(idle_s)

    def supervisor(self, prepared: Prepared) -> Supervisor:
        supervisor = Supervisor(
            prepared.server, self.tmp_path / "engine.log", ready_timeout_s=prepared.ready_timeout_s
        )
        supervisor.ring.extend(LOG_LINES)
        supervisor.lines_total = len(LOG_LINES)
        return supervisor

    def server_run(self, prepared: Prepared, supervisor: Supervisor) -> ServerRun:
        return ScriptedRun(self, prepared, supervisor)

    def detach(self, options: ServeOptions) -> tuple[int, Path]:
        self.detached.append(options)
        return 4343, self.tmp_path / "serve.log"


class ScriptedRun(ServerRun):
    """The real run's stop and restart over a scripted engine: its events and samples."""

    def __init__(self, backend: ScriptedBackend, prepared: Prepared, supervisor: Supervisor):
        page = runstart.chat_page(backend.paths, prepared.server)
        facts = RunFacts(
            model=prepared.model,
            gpu_index=prepared.gpu_index,
            webui_url=page.url(prepared.server),
            chat_page=page.front_page,
        )
        super().__init__(backend.paths, supervisor, facts)
        self.backend = backend

    async def events(self) -> AsyncIterator[RunItem]:
        async for item in scripted_events(
            self.backend, self.supervisor, self.backend.sample_script
        ):
            yield item


class ScriptedRouterRun(ServedSetRun):
    """The real set run's stop and restart over a scripted router: its events and models."""

    def __init__(self, backend: ScriptedBackend, prepared: PreparedSet, supervisor: Supervisor):
        planned = planned_models(prepared.planned)
        public_url = url_of(supervisor.launch)
        super().__init__(backend.paths, supervisor, planned=planned, public_url=public_url)
        self.backend = backend

    async def events(self) -> AsyncIterator[RunItem]:
        script: list[RunItem] = [ModelsSample(self.backend.models_script)]
        script += self.backend.model_notes
        async for item in scripted_events(self.backend, self.supervisor, script):
            yield item


async def scripted_events(
    backend: ScriptedBackend, supervisor: Supervisor, items: Sequence[RunItem]
) -> AsyncIterator[RunItem]:
    """The backend's server events, then ``items``, then (unless it gave up) serving until
    stopped."""
    try:
        for event in backend.server_events:
            yield event
        for item in items:
            yield item
        if backend.server_failure is not None:
            raise backend.server_failure
        if backend.server_events and backend.server_events[-1].kind == "gave-up":
            return
        # The supervisor offers a flag, not an event, to anything outside it: poll it.
        while not supervisor.stop_requested:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        yield ServerEvent("stopped", "engine stopped", 4242)
    finally:
        supervisor.log.close()


async def wait_until(pilot, predicate, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        with contextlib.suppress(NoMatches):  # a screen that is still being composed
            if predicate():
                return
        await pilot.pause(0.05)
    raise AssertionError("the app did not reach the expected state")


def preset_table_shown(app: App[None]) -> bool:
    """The preset choice is the screen and its plan table has rows."""
    return isinstance(app.screen, PresetScreen) and app.screen.query_one(DataTable).row_count > 0
