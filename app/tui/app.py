"""The App of `lucebox up`: runs the pipeline and the server in workers, switches the screens.

Workers only post messages (:mod:`lucebox.app.tui.messages`); screens post requests and this
App, which owns the options, the server and the one-server lock, acts on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

from textual import on, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState

from lucebox.app.tui.backend import Backend
from lucebox.app.tui.messages import (
    AllowBaseRequested,
    CpuEngineRequested,
    KeysRequested,
    MetricsSampled,
    ModelLoadRequested,
    ModelsSampled,
    ModelUnloadRequested,
    PipelinePrepared,
    PresetPickRequested,
    QuitRequested,
    RestartRequested,
    RetryRequested,
    ServerChanged,
    SleepPickRequested,
    StepChanged,
    StopRequested,
    UsersPickRequested,
)
from lucebox.app.tui.screens.dashboard import DashboardScreen
from lucebox.app.tui.screens.dashboardbase import ServingScreen
from lucebox.app.tui.screens.keys import KeysScreen
from lucebox.app.tui.screens.presets import PresetScreen
from lucebox.app.tui.screens.servedsetdashboard import ServedSetDashboardScreen
from lucebox.app.tui.screens.sleep import SleepModal
from lucebox.app.tui.screens.start import Failure, StartScreen
from lucebox.app.tui.screens.users import UsersModal
from lucebox.engine.core.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    CancelledByUserError,
    GuardRefusal,
    LuceboxError,
)
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines.toolkit import ToolkitRefusal
from lucebox.engine.models import checkresult
from lucebox.engine.pipeline import Prepared, StepEvent, StepName
from lucebox.engine.plan.launch import url_of
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run import runstate
from lucebox.engine.run.servedset.servedsetrun import ServedSetRun
from lucebox.engine.run.servedsetmodels import ModelNote, ModelsSample
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from lucebox.engine.servedchoice import ModelSet, OneModel, ServedChoice
from lucebox.engine.servedset import PreparedSet

PIPELINE_STOP_WAIT_S = 1.0
"""How long quitting waits for the pipeline to stop (a download stops within one read)."""
WORKER_STEPS: dict[str, StepName] = {"presets": "preset"}
"""The checklist step a failing worker's group stands for; the pipeline's is the step it was on,
and every other group's (server, chat, models, quit) is the server."""


class LuceboxApp(App[None]):
    """`lucebox up`: runs the pipeline, then the dashboard of the served model or set."""

    CSS_PATH = "lucebox.tcss"
    TITLE = "lucebox"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True)
    ]

    def __init__(
        self,
        backend: Backend,
        options: ServeOptions,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.options = options
        """What the user asked for (a detached serve gets these)."""
        self.chosen: ServedChoice = OneModel(options)
        """One model or a set: decided from ``options`` on mount and whenever they change."""
        self.clock = clock
        self.prepared: Prepared | PreparedSet | None = None
        """What the pipeline prepared: one model's launch, or a served set's plans."""
        self.supervisor: Supervisor | None = None
        self.server: ServerRun | None = None
        self.lock: runstate.ServeLock | None = None
        self.step_now: StepName = "gpu"
        """The pipeline step the last progress event came from."""
        self.exit_code = EXIT_OK
        """What quitting now exits with: the failure on show, else 0."""
        self.pipeline_cancel = threading.Event()
        """Set to stop the pipeline run in progress (its download stops between reads)."""
        self.start_screen = StartScreen(backend.log_path)
        self.dashboard: ServingScreen | None = None

    async def on_mount(self) -> None:
        await self.push_screen(self.start_screen)
        self.choose(self.options)
        chosen = self.chosen
        named = isinstance(chosen, ModelSet) or chosen.options.model or chosen.options.preset
        if not named and self.backend.first_run():
            self.pick_preset()
        else:
            self.start_pipeline()

    def choose(self, options: ServeOptions) -> None:
        """Take ``options`` as what the user asks for, and decide once: one model or a set."""
        self.options = options
        self.chosen = self.backend.served_choice(options)

    # pipeline -----------------------------------------------------------------------------------

    def start_pipeline(self, *, cpu_engine_first: bool = False) -> None:
        self.start_screen.reset()
        self.step_now = "gpu"
        self.exit_code = EXIT_OK
        # A run still going (another preset was chosen) stops its download first.
        self.pipeline_cancel.set()
        self.pipeline_cancel = threading.Event()
        self.prepare_pipeline(self.pipeline_cancel, cpu_engine_first)

    @work(thread=True, exclusive=True, group="pipeline", exit_on_error=False)
    def prepare_pipeline(self, cancel: threading.Event, cpu_engine_first: bool = False) -> None:
        def emit(event: StepEvent) -> None:
            if not cancel.is_set():
                self.post_message(StepChanged(event))

        if self.lock is None:
            self.lock = self.backend.lock()
        if cpu_engine_first:
            self.backend.build_cpu_engine(emit)
        chosen = self.chosen
        prepared = (
            self.backend.prepare_set(chosen, emit, cancel)
            if isinstance(chosen, ModelSet)
            else self.backend.prepare(chosen.options, emit, cancel)
        )
        if not cancel.is_set():
            self.post_message(PipelinePrepared(prepared))

    def on_step_changed(self, message: StepChanged) -> None:
        self.step_now = message.event.step
        self.start_screen.show_step(message.event)
        if message.event.state == "note" and self.dashboard is not None:
            self.dashboard.show_note(message.event.message)

    @on(Worker.StateChanged)
    def handle_worker_error(self, event: Worker.StateChanged) -> None:
        """Every worker's failure ends here, on the failure panel: a lucebox error with its
        message and hint, anything else as a bug with the path of its full traceback."""
        worker, error = event.worker, event.worker.error
        if event.state != WorkerState.ERROR or isinstance(error, CancelledByUserError | None):
            return  # a cancelled download is the user's own quit or change of preset
        step = (
            self.step_now
            if worker.group == "pipeline"
            else WORKER_STEPS.get(worker.group, "server")
        )
        if isinstance(error, LuceboxError):
            refused_base = isinstance(error, GuardRefusal) and checkresult.allow_base_serves(error)
            failure = Failure(
                step,
                error.message,
                error.hint,
                error.exit_code,
                refused_base,
                cpu_engine_offered=isinstance(error, ToolkitRefusal),
            )
        else:
            log = self.backend.write_crash_log(error)
            hint = f"a bug in lucebox; the full traceback is in {log}"
            failure = Failure(step, f"unexpected error: {error!r}", hint, EXIT_FAILURE)
        if worker.group == "models" and isinstance(error, LuceboxError):
            # A load or unload the router refused leaves the set served: said, not failed.
            self.notify(str(error), title="Models", severity="error")
            return
        if worker.group == "server":
            self.stop_server()
        self.show_failure(failure)

    def show_failure(self, failure: Failure) -> None:
        self.exit_code = failure.exit_code
        self.dashboard = None
        if self.screen is not self.start_screen:
            self.switch_screen(self.start_screen)
        self.start_screen.show_failure(failure)

    def on_pipeline_prepared(self, message: PipelinePrepared) -> None:
        self.prepared = message.prepared
        self.start_screen.show_step(StepEvent("server", "running", "starting the engine"))
        self.run_server(message.prepared)

    @work(exclusive=True, group="server", exit_on_error=False)
    async def run_server(self, prepared: Prepared | PreparedSet) -> None:
        if isinstance(prepared, PreparedSet):
            async with self.backend.router_run(prepared, self.post_step) as run:
                await self.follow_run(run)
            return
        supervisor = self.backend.supervisor(prepared)
        await self.follow_run(self.backend.server_run(prepared, supervisor))

    def post_step(self, event: StepEvent) -> None:
        self.post_message(StepChanged(event))

    async def follow_run(self, run: ServerRun) -> None:
        self.server, self.supervisor = run, run.supervisor
        async for item in run.events():
            if isinstance(item, ServerEvent):
                self.post_message(ServerChanged(item))
            elif isinstance(item, ModelsSample):
                self.post_message(ModelsSampled(item))
            elif isinstance(item, ModelNote):
                self.post_step(StepEvent("server", "note", item.message))
            else:
                status = run.status
                self.post_message(
                    MetricsSampled(item, status.spec, status.queue, status.kv_modes, status.engine)
                )

    def new_dashboard(self, prepared: Prepared | PreparedSet) -> ServingScreen:
        log_path, notes = self.backend.log_path, self.start_screen.notes
        if isinstance(prepared, Prepared):
            page_url = self.server.status.webui_url if self.server is not None else None
            return DashboardScreen(
                prepared, log_path=log_path, notes=notes, clock=self.clock, webui_url=page_url
            )
        models = self.server.status.models if self.server is not None else ()
        url = url_of(prepared.planned.launches[0].server)  # the proxy's: the served address
        return ServedSetDashboardScreen(
            prepared, models, url=url, log_path=log_path, notes=notes, clock=self.clock
        )

    async def on_server_changed(self, message: ServerChanged) -> None:
        event = message.event
        if event.kind == "ready" and self.dashboard is None and self.prepared is not None:
            self.start_screen.show_step(StepEvent("server", "done", event.message))
            self.dashboard = self.new_dashboard(self.prepared)
            await self.push_screen(self.dashboard)
        if event.kind == "gave-up":
            hint = "the log (l) has the engine's own words; Retry (r) starts it again"
            self.show_failure(Failure("server", event.message, hint, EXIT_FAILURE))
            return
        if self.dashboard is not None:
            self.dashboard.show_event(event)
            if self.supervisor is not None:
                self.dashboard.show_log(self.supervisor, now=True)
        else:
            self.start_screen.show_step(StepEvent("server", "running", event.message))

    def on_metrics_sampled(self, message: MetricsSampled) -> None:
        if isinstance(self.dashboard, DashboardScreen):
            self.dashboard.show_sample(
                message.sample, message.spec, message.queue, message.kv_modes, message.engine
            )
            if self.supervisor is not None:
                self.dashboard.show_log(self.supervisor)

    def on_models_sampled(self, message: ModelsSampled) -> None:
        if isinstance(self.dashboard, ServedSetDashboardScreen):
            self.dashboard.show_models(message.sample.models, message.sample.gpus)
            if self.supervisor is not None:
                self.dashboard.show_log(self.supervisor)

    # requests from the screens --------------------------------------------------------------------

    @on(RetryRequested)
    def retry(self) -> None:
        self.start_pipeline()

    @on(AllowBaseRequested)
    def allow_base_and_retry(self) -> None:
        self.choose(replace(self.options, allow_base=True))
        self.start_pipeline()

    @on(CpuEngineRequested)
    def build_cpu_engine_and_go_on(self) -> None:
        self.start_pipeline(cpu_engine_first=True)

    @on(PresetPickRequested)
    def preset_pick_requested(self) -> None:
        self.pick_preset()

    @on(KeysRequested)
    def show_keys(self) -> None:
        self.push_screen(KeysScreen(self.backend))

    @on(RestartRequested)
    def restart_server(self) -> None:
        if self.server is not None and self.prepared is not None:
            if self.workers_in("server"):
                self.server.restart()
            else:
                self.run_server(self.prepared)

    @on(StopRequested)
    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()

    @on(ModelLoadRequested)
    def load_requested(self, message: ModelLoadRequested) -> None:
        self.load_model(message.alias)

    @on(ModelUnloadRequested)
    def unload_requested(self, message: ModelUnloadRequested) -> None:
        self.unload_model(message.alias)

    @on(QuitRequested)
    def quit_requested(self, message: QuitRequested) -> None:
        if message.keep_serving:
            self.keep_serving()
        else:
            self.stop_and_exit()

    # actions ------------------------------------------------------------------------------------

    @work(group="models", exit_on_error=False)
    async def load_model(self, alias: str) -> None:
        """Through lucebox's proxy: a model that needs room evicts as a request would."""
        if isinstance(self.server, ServedSetRun):
            await self.server.load(alias)

    @work(group="models", exit_on_error=False)
    async def unload_model(self, alias: str) -> None:
        if isinstance(self.server, ServedSetRun):
            await self.server.unload(alias)

    @work(thread=True, exclusive=True, group="presets", exit_on_error=False)
    def pick_preset(self) -> None:
        """Plan every preset for this card (blocking: GPU probe, headers), then ask."""
        table = self.backend.preset_table(self.options)
        finder = self.backend.hub_finder(self.options)
        self.call_from_thread(self.push_screen, PresetScreen(table, finder), self.preset_chosen)

    def preset_chosen(self, preset_id: str | None) -> None:
        if preset_id is None:
            # Leaving the first-run choice goes on with the preset lucebox picks itself.
            if self.prepared is None and not self.workers_in("pipeline"):
                self.start_pipeline()
            return
        if "/" in preset_id:  # a model found on the Hub: its pinned file, not a preset
            self.choose(replace(self.options, preset=None, model=preset_id, models=()))
        else:
            self.backend.choose_preset(preset_id)
            self.choose(replace(self.options, preset=preset_id, model=None, models=()))
        self.plan_again()

    @on(UsersPickRequested)
    def users_pick_requested(self) -> None:
        current = self.options.users or self.backend.users()
        self.push_screen(UsersModal(current), self.users_chosen)

    def users_chosen(self, users: int | None) -> None:
        if users is None or users == (self.options.users or self.backend.users()):
            return
        self.backend.choose_users(users)
        self.choose(replace(self.options, users=users))
        self.plan_again()

    @on(SleepPickRequested)
    def sleep_pick_requested(self) -> None:
        self.push_screen(SleepModal(self.backend.sleep_idle_s()), self.sleep_chosen)

    def sleep_chosen(self, idle_s: float | None) -> None:
        if idle_s is None or idle_s == self.backend.sleep_idle_s():
            return
        # The run reads it when it starts: the server starts again with it.
        self.backend.choose_sleep(idle_s)
        self.plan_again()

    def plan_again(self) -> None:
        """Stop what serves and run the pipeline again with the options chosen now."""
        self.stop_server()
        self.dashboard = None
        self.prepared = None
        if self.screen is not self.start_screen:
            self.switch_screen(self.start_screen)
        self.start_pipeline()

    def workers_in(self, group: str) -> bool:
        return any(w.group == group and not w.is_finished for w in self.workers)

    @work(exclusive=True, group="quit", exit_on_error=False)
    async def keep_serving(self) -> None:
        await self.shut_down()
        pid, log = self.backend.detach(self.options)
        self.exit(message=f"lucebox serves in the background (pid {pid}); log: {log}")

    @work(exclusive=True, group="quit", exit_on_error=False)
    async def stop_and_exit(self) -> None:
        await self.shut_down()
        self.exit(return_code=self.exit_code)

    async def shut_down(self) -> None:
        """Stop a download and the engine, wait until they are gone; release the lock."""
        self.pipeline_cancel.set()
        self.stop_server()
        for worker in list(self.workers):
            if worker.group == "server":
                with contextlib.suppress(WorkerFailed, WorkerCancelled):
                    await worker.wait()
        # A download stops within a read; a build does not, so the wait is bounded. Polled:
        # waiting on the worker with a timeout would cancel it and leave its thread running.
        deadline_s = time.monotonic() + PIPELINE_STOP_WAIT_S
        while self.workers_in("pipeline") and time.monotonic() < deadline_s:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def on_unmount(self) -> None:
        self.pipeline_cancel.set()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    async def action_quit(self) -> None:
        self.stop_and_exit()


def make_app(paths: Paths, options: ServeOptions, backend: Backend | None = None) -> LuceboxApp:
    return LuceboxApp(backend or Backend(paths), options)
