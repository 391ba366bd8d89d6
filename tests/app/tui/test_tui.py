"""The TUI driven by Textual's pilot: scripted faults and states, and the real pipeline."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from rich.style import Style
from textual.widgets import Button, DataTable, Input, Label, Static
from textual.worker import WorkerState

from lucebox.app.tui.app import LuceboxApp
from lucebox.app.tui.backend import Backend
from lucebox.app.tui.messages import StepChanged
from lucebox.app.tui.screens.dashboard import DashboardScreen
from lucebox.app.tui.screens.quit import QuitModal
from lucebox.app.tui.screens.servedsetdashboard import ServedSetDashboardScreen
from lucebox.app.tui.screens.sleep import SleepModal
from lucebox.app.tui.screens.start import StartScreen
from lucebox.app.tui.screens.users import UsersModal
from lucebox.app.tui.widgets.chat import ChatPanel
from lucebox.app.tui.widgets.log import LogTail, log_style
from lucebox.app.tui.widgets.steps import StepRow
from lucebox.app.tui.widgets.trend import Trend, per_cell
from lucebox.engine import pipeline
from lucebox.engine.core.downloadprogress import TransferProgress
from lucebox.engine.core.errors import CancelledByUserError, GuardRefusal, TransferError, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.engines import webui
from lucebox.engine.engines.toolkit import ToolkitRefusal, choose_toolkit
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.models import checkresult, guard
from lucebox.engine.models.records import files_dir
from lucebox.engine.pipeline import ServeOptions, StepEvent
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.sample import EngineStatus
from lucebox.engine.run.servedsetmodels import ModelNote
from lucebox.engine.run.supervision.serverevent import ServerEvent
from support.ggufgen import write_llama
from support.hubserver import HubFile, serve_hub
from support.ports import free_port
from support.smolserver import private_engine_home
from tests.app.tui.scripted import (
    BASE_GEMMA,
    RTX_4090,
    SET_SOURCES,
    STEPS_DONE,
    STEPS_DOWNLOADING,
    ScriptedBackend,
    prepared_set_for,
    preset_table_shown,
    refused_by_the_model_check,
    samples,
    set_models,
    wait_until,
)
from tests.conftest import alive
from tests.engine.engines.test_build import NO_NVCC
from tests.engine.fake_nvml import FakeGpu, FakeNvml


@pytest.fixture
def backend(tmp_path) -> ScriptedBackend:
    return ScriptedBackend(resolve_paths(dict(os.environ)), tmp_path)


def app_for(backend: ScriptedBackend, options: ServeOptions | None = None) -> LuceboxApp:
    return LuceboxApp(backend, options or ServeOptions(preset="smoke"), clock=lambda: 1000.0)


def on_dashboard(app: LuceboxApp) -> bool:
    """The dashboard is the screen and its widgets are there."""
    return isinstance(app.screen, DashboardScreen) and bool(app.screen.query(LogTail))


async def test_pipeline_steps_then_dashboard_with_samples(backend):
    backend.sample_script = samples(20)
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        rows = {row.step: row.state for row in app.start_screen.query(StepRow)}
        assert rows == dict.fromkeys(rows, "done")
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        await wait_until(pilot, lambda: len(dashboard.history) == 20)
        decode = str(dashboard.query_one("#decode-value", Label).render())
        assert decode.endswith("tok/s") and decode != "—"
        points = list(dashboard.query_one("#decode-spark", Trend).values)
        assert len(points) == 60 and points[:40] == [0.0] * 40 and min(points[40:]) >= 180
        header = str(dashboard.query_one("#dash-header", Static).render())
        assert "http://127.0.0.1:8080/v1" in header and "ready" in header
        gpu_text = "\n".join(
            str(dashboard.query_one(f"#{part}", Static).render()) for part in ("vram", "gpu-live")
        )
        assert "weights" in gpu_text and "uses 1.29" in gpu_text and "61°C" in gpu_text
        assert "server is listening" in "\n".join(
            str(line) for line in dashboard.query_one(LogTail).lines
        )
        measured = EngineStatus("lucebox", "measured", "the Lucebox engine is faster here")
        dashboard.show_sample(backend.sample_script[-1], engine=measured)
        header = str(dashboard.query_one("#dash-header", Static).render())
        assert "the Lucebox engine (measured on this card)" in header
    assert backend.options_seen == [ServeOptions(preset="smoke")]


async def test_a_set_model_planned_again_is_said_in_the_set_dashboard_log(backend):
    backend.set_sources = SET_SOURCES
    backend.models_script = set_models(prepared_set_for())
    note = "smollm2 ran out of memory: planned again at a 6144-token context; it loads again"
    backend.model_notes = (ModelNote("smollm2", note),)
    app = app_for(backend, ServeOptions(models=SET_SOURCES))
    async with app.run_test(size=(120, 40)) as pilot:

        def shown() -> bool:
            screen = app.screen
            return isinstance(screen, ServedSetDashboardScreen) and any(
                note in str(line) for line in screen.query_one(LogTail).lines
            )

        await wait_until(pilot, shown)


async def test_download_progress_shows_bar_rate_and_eta(backend):
    backend.steps = list(STEPS_DOWNLOADING)
    backend.downloading = True
    app = app_for(backend)
    async with app.run_test(size=(120, 30)) as pilot:
        row = app.start_screen.query_one("#step-models", StepRow)
        await wait_until(pilot, lambda: row.state == "running")
        await pilot.pause(0.1)
        assert row.query_one(".step-rate", Label).display
        assert "40% · 48.5 MiB/s · 1 min 52 s left" in str(
            row.query_one(".step-rate", Label).render()
        )
        # Responsive while the blocking step runs: the log screen opens and closes.
        await pilot.press("l")
        assert app.screen.__class__.__name__ == "LogScreen"
        await pilot.press("escape")
        assert isinstance(app.screen, StartScreen)


async def test_download_waits_show_the_reason_the_attempt_and_the_other_writer(backend):
    retrying = TransferProgress(
        "Qwen3-14B-Q4_K_M.gguf",
        done_bytes=4 * GIB,
        total_bytes=10 * GIB,
        rate_bytes_per_s=None,
        eta_s=None,
        attempt=3,
        waiting_s=3.5,
        retry_reason="HTTP 503 Service Unavailable",
    )
    other_writer = TransferProgress(
        "Qwen3-14B-Q4_K_M.gguf", 0, None, None, None, waiting_for_pid=4242
    )
    backend.steps = list(STEPS_DONE[:3])
    backend.downloading = True
    app = app_for(backend)
    async with app.run_test(size=(120, 30)) as pilot:
        preset = app.start_screen.query_one("#step-preset", StepRow)
        await wait_until(pilot, lambda: preset.state == "done")
        row = app.start_screen.query_one("#step-models", StepRow)
        for progress, message, rate in [
            (
                other_writer,
                "waiting for pid 4242 (fetching Qwen3-14B-Q4_K_M.gguf)",
                None,
            ),
            (
                retrying,
                "downloading Qwen3-14B-Q4_K_M.gguf",
                "40% · HTTP 503 Service Unavailable · attempt 3 in 4 s",
            ),
        ]:
            row.show(pipeline.download_step(progress))
            await pilot.pause()
            assert message in str(row.query_one(".step-message", Label).render())
            shown = row.query_one(".step-rate", Label)
            assert shown.display == (rate is not None)
            if rate is not None:
                assert rate in str(shown.render())


async def test_base_model_refusal_offers_allow_base_and_retries_with_it(backend, tmp_path):
    notes, refusal = refused_by_the_model_check(tmp_path / "gemma-3-270m.gguf", BASE_GEMMA)
    assert refusal.problem_codes == ("base-model",)
    backend.steps = [*STEPS_DONE[:4], *notes]
    backend.failures = [refusal]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        failure = app.start_screen.query_one("#failure")
        await wait_until(pilot, lambda: failure.display)
        assert "refused by the model check" in str(
            app.start_screen.query_one("#failure-message", Static).render()
        )
        assert "base-model" in str(app.start_screen.query_one("#notes", Static).render())
        assert app.start_screen.query_one("#allow-base", Button).display
        # Pressed through the button itself: a click could land before the panel is laid out.
        app.start_screen.query_one("#allow-base", Button).press()
        await wait_until(pilot, lambda: on_dashboard(app))
    assert [o.allow_base for o in backend.options_seen] == [False, True]


async def test_a_refused_cuda_build_offers_the_cpu_engine_and_builds_it_on_request(backend):
    old_driver = probe_gpus(FakeNvml(gpus=[FakeGpu()], cuda=12040, driver="550.54.15"))
    with pytest.raises(ToolkitRefusal) as refused:
        choose_toolkit(old_driver, NO_NVCC, ("86",), host="x86_64")
    backend.steps = STEPS_DONE[:3]
    backend.failures = [refused.value]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        failure = app.start_screen.query_one("#failure")
        await wait_until(pilot, lambda: failure.display)
        assert "driver 580 or newer" in str(
            app.start_screen.query_one("#failure-message", Static).render()
        )
        assert app.start_screen.query_one("#cpu-engine", Button).display
        assert not app.start_screen.query_one("#allow-base", Button).display
        assert backend.cpu_engine_builds == 0
        app.start_screen.query_one("#cpu-engine", Button).press()
        await wait_until(pilot, lambda: on_dashboard(app))
    assert backend.cpu_engine_builds == 1
    assert app.exit_code == 0


async def test_a_refusal_that_allowing_base_does_not_fix_offers_no_allow_base(backend, tmp_path):
    # A base model cut short: allowing base models would not make it servable.
    model = write_llama(tmp_path / "gemma-3-270m.gguf", BASE_GEMMA)
    with model.open("r+b") as handle:
        handle.truncate(model.stat().st_size - 4096)
    checked = guard.check_model(model)
    assert {p.code for p in checked.problems} == {"base-model", "truncated"}
    backend.failures = [checkresult.refusal(checked)]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        failure = app.start_screen.query_one("#failure")
        await wait_until(pilot, lambda: failure.display)
        assert not app.start_screen.query_one("#allow-base", Button).display
        assert not app.start_screen.query_one("#cpu-engine", Button).display


OOM = EngineDeath(
    "gpu-out-of-memory",
    "the GPU ran out of memory",
    "pick a smaller preset or ask for less --ctx",
    1,
)


async def test_server_giving_up_shows_the_diagnosis_and_a_retry(backend):
    backend.server_events = [
        ServerEvent("starting", "engine started (pid 1)", 1),
        ServerEvent("exited", "engine exited (1): CUDA out of memory", 1, OOM),
        ServerEvent(
            "gave-up",
            f"gave up after 5 crashes in 600 s: gpu-out-of-memory: {OOM.sentence}",
            1,
            OOM,
        ),
    ]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        failure = app.start_screen.query_one("#failure")
        await wait_until(pilot, lambda: failure.display)
        assert app.start_screen.query_one("#step-server", StepRow).state == "failed"
        message = str(app.start_screen.query_one("#failure-message", Static).render())
        assert "smaller preset" in message
        hint = str(app.start_screen.query_one("#failure-hint", Static).render())
        assert "log (l)" in hint
        assert not app.start_screen.query_one("#allow-base", Button).display
        ready = ServerEvent("ready", "serving at http://127.0.0.1:8080", 2)
        backend.server_events = [backend.server_events[0], ready]
        await pilot.press("r")
        await wait_until(pilot, lambda: on_dashboard(app))


async def dashboard_header(
    backend, after_ready: list[ServerEvent], awaited: str
) -> tuple[str, int]:
    """The dashboard header's text and height once the events after ready show ``awaited``."""
    started, loading, ready = backend.server_events
    backend.server_events = [started, loading, ready, *after_ready]
    app = app_for(backend)
    async with app.run_test(size=(140, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        header = app.screen.query_one("#dash-header", Static)
        await wait_until(pilot, lambda: awaited in str(header.render()))
        return str(header.render()), header.size.height


async def test_the_dashboard_shows_why_the_engine_died_under_its_state(backend):
    killed = EngineDeath(
        "killed",
        "the engine was killed (SIGKILL), not by lucebox: most likely by the kernel's "
        "out-of-memory killer, for lack of host RAM",
        "close some, or serve a smaller model or context",
        -9,
    )
    after_ready = [
        ServerEvent("exited", f"engine exited (-9): {killed.sentence}", 4242, killed),
        ServerEvent("restarting", "restarting in 1 s", 4242, killed, 1),
        ServerEvent("starting", "engine started (pid 4343)", 4343, restarts=1),
        # A calibration's two trials: restarts lucebox asked for, not crashes.
        *[ServerEvent("restarting", "trial", 4343, None, 1, planned=True)] * 2,
        ServerEvent("starting", "engine started (pid 4344)", 4344, restarts=1),
    ]
    shown, height = await dashboard_header(backend, after_ready, "last exit: killed")
    assert "starting" in shown and "1 restart · 2 calibration trials" in shown
    assert "out-of-memory killer" in shown
    assert height == 3


async def test_the_dashboard_says_the_engine_sleeps_and_for_how_long(backend):
    asleep = "engine asleep (its memory freed); the next request starts it"
    shown, _ = await dashboard_header(backend, [ServerEvent("sleeping", asleep)], "sleeping")
    assert "sleeping · for " in shown and "0 restarts" in shown


async def test_first_run_chooses_a_preset_from_the_plan_table(backend):
    app = app_for(backend, ServeOptions())
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(
            pilot,
            lambda: preset_table_shown(app),
        )
        table = app.screen.query_one(DataTable)
        assert table.row_count >= 6
        ids = [str(key.value) for key in table.rows]
        assert "smoke" in ids
        # Without a GPU the CPU default (an instruct model) is chosen, and the cursor starts on it.
        assert ids[table.cursor_row] == "smollm2"
        await pilot.press("enter")
        await wait_until(pilot, lambda: on_dashboard(app))
    assert backend.chosen == ["smollm2"]
    assert backend.options_seen[0].preset == "smollm2"


async def test_quit_keeping_the_server_hands_it_to_a_background_service(backend):
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitModal))
        await pilot.press("k")
        await wait_until(pilot, lambda: bool(backend.detached))
    assert backend.detached == [ServeOptions(preset="smoke")]
    assert app.lock is None


async def test_quit_stopping_the_server_stops_it(backend):
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        supervisor = app.supervisor
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitModal))
        await pilot.press("s")
        await wait_until(pilot, lambda: supervisor is not None and supervisor.stop_requested)
    assert backend.detached == []


async def test_the_users_choice_plans_the_server_again_with_it(backend):
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("u")
        await wait_until(pilot, lambda: isinstance(app.screen, UsersModal))
        await pilot.press("escape")  # cancelled: nothing changes
        await wait_until(pilot, lambda: on_dashboard(app))
        assert backend.users_chosen == [] and len(backend.options_seen) == 1
        await pilot.press("u")
        await wait_until(pilot, lambda: isinstance(app.screen, UsersModal))
        await pilot.click("#users-4")
        await wait_until(pilot, lambda: len(backend.options_seen) == 2 and on_dashboard(app))
        await pilot.press("u")
        await wait_until(pilot, lambda: isinstance(app.screen, UsersModal))
        chosen = app.screen.query_one("#users-4", Button)
        assert chosen.variant == "primary"  # the setting now
    assert backend.users_chosen == [4]
    assert backend.options_seen[-1] == ServeOptions(preset="smoke", users=4)


async def test_chat_reports_a_server_that_is_not_there(backend):
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("c")
        chat = app.screen.query_one(ChatPanel)
        assert chat.display and isinstance(app.focused, Input)
        await pilot.press(*"hi", "enter")
        stats = chat.query_one("#chat-stats", Label)
        await wait_until(pilot, lambda: "failed" in str(stats.render()))


def test_no_color_is_respected(backend, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert app_for(backend).no_color


def test_step_event_progress_messages_merge():
    first = StepChanged(StepEvent("models", "running", "downloading x", fraction=0.1))
    newer = StepChanged(StepEvent("models", "running", "downloading x", fraction=0.2))
    done = StepChanged(StepEvent("models", "done", "x"))
    assert newer.can_replace(first)
    assert not done.can_replace(first)


@pytest.mark.slow
async def test_up_reaches_the_dashboard_and_a_chat_reply_streams(built_engine_home, tmp_path):
    """The real pipeline: CPU engine, the Gemma 3 270M smoke preset, a streamed chat reply.

    In a home of its own: the reply is long enough for the speculation guard to judge the
    n-grams, and its switch-off is stored in the home that served."""
    home = private_engine_home(tmp_path / "home")
    app = LuceboxApp(
        Backend(resolve_paths({"LUCEBOX_HOME": str(home)})),
        ServeOptions(preset="smoke", port=free_port(), ctx=4096),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(
            pilot,
            lambda: (
                on_dashboard(app)
                and isinstance(app.screen, DashboardScreen)
                and app.screen.state == "ready"
            ),
            timeout_s=300,
        )
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen) and app.supervisor is not None
        engine_pid = app.supervisor.pid
        assert engine_pid is not None and alive(engine_pid)
        await pilot.press("c", *"Hello", "enter")
        chat = dashboard.query_one(ChatPanel)
        await wait_until(pilot, lambda: chat.messages[-1]["role"] == "assistant", timeout_s=120)
        assert chat.messages[-1]["content"].strip()
        stats = str(chat.query_one("#chat-stats", Label).render())
        assert stats.startswith("TTFT ") and stats.endswith(" tok/s"), stats
        await wait_until(
            pilot,
            lambda: dashboard.latest is not None and bool(dashboard.latest.decode_tokens_per_s),
            timeout_s=10,
        )
        await pilot.press("escape", "q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitModal))
        await pilot.press("s")
        await wait_until(pilot, lambda: not alive(engine_pid), timeout_s=60)


async def test_notes_stay_in_view_and_reach_the_dashboard_log(backend):
    key_note = StepEvent("server", "note", "API key (shown once, saved as server.api_key): k-123")
    backend.steps = [*backend.steps, key_note]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        notes = str(app.start_screen.query_one("#notes", Static).render())
        assert "Server: API key (shown once" in notes and "k-123" in notes
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        await wait_until(
            pilot, lambda: any("k-123" in str(line) for line in dashboard.query_one(LogTail).lines)
        )


async def test_switching_preset_from_the_dashboard_runs_the_pipeline_again(backend):
    backend.budget = RTX_4090
    app = app_for(backend)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        first_supervisor = app.supervisor
        await pilot.press("p")
        await wait_until(
            pilot,
            lambda: preset_table_shown(app),
        )
        table = app.screen.query_one(DataTable)
        ids = [str(key.value) for key in table.rows]
        # The 24 GB card's best preset has the cursor; take the one below the smoke test.
        table.move_cursor(row=ids.index("qwen3-4b"))
        await pilot.press("enter")
        await wait_until(
            pilot,
            lambda: on_dashboard(app) and app.supervisor is not first_supervisor,
        )
        assert first_supervisor is not None and first_supervisor.stop_requested
    assert backend.chosen == ["qwen3-4b"]
    assert [o.preset for o in backend.options_seen] == ["smoke", "qwen3-4b"]


async def test_leaving_the_first_run_choice_goes_on_with_the_automatic_pick(backend):
    app = app_for(backend, ServeOptions())
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(
            pilot,
            lambda: preset_table_shown(app),
        )
        await pilot.press("escape")
        await wait_until(pilot, lambda: on_dashboard(app))
    assert backend.chosen == []
    assert backend.options_seen == [ServeOptions()]


def test_trend_cells_keep_each_spans_largest_value():
    assert per_cell([1.0, 5.0, 2.0, 0.0], 2) == [5.0, 2.0]
    assert per_cell([3.0, 4.0], 4) == [3.0, 3.0, 4.0, 4.0]
    assert per_cell([0.0] * 59 + [9.0], 7)[-1] == 9.0


def test_log_levels_are_read_after_the_engines_timestamp():
    warning = "0.00.003.762 W srv  llama_server: security: no API key is set"
    error = "0.00.010.001 E srv  load_model: failed to load model"
    info = "0.00.953.620 I srv  llama_server: model loaded"
    assert log_style(warning) == log_style("W untimed warning") == Style(color="yellow")
    assert log_style(error) == Style(color="red", bold=True)
    assert log_style(info) == log_style("Every word here is plain")
    assert log_style("# lucebox: ready").dim


def failure_shown(app: LuceboxApp) -> bool:
    return bool(app.start_screen.query_one("#failure").display)


def failure_text(app: LuceboxApp) -> tuple[str, str]:
    screen = app.start_screen
    message = str(screen.query_one("#failure-message", Static).render())
    return message, str(screen.query_one("#failure-hint", Static).render())


def crash_log_in(hint: str) -> Path:
    (path,) = (word for word in hint.split() if word.endswith(".log"))
    return Path(path)


async def test_an_unexpected_error_in_the_pipeline_shows_the_crash_log(backend):
    backend.steps = STEPS_DONE[:4]
    backend.failures = [RuntimeError("a bug in the engine step")]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: failure_shown(app))
        assert app.start_screen.query_one("#step-models", StepRow).state == "failed"
        assert not any(row.state == "running" for row in app.start_screen.query(StepRow))
        message, hint = failure_text(app)
        assert "a bug in the engine step" in message
        log = crash_log_in(hint)
        assert "RuntimeError: a bug in the engine step" in log.read_text()
        assert "Traceback" in log.read_text()
        await pilot.press("r")
        await wait_until(pilot, lambda: on_dashboard(app))


async def test_an_unexpected_error_in_the_server_worker_shows_the_crash_log(backend):
    backend.server_failure = KeyError("slots")
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: failure_shown(app))
        assert isinstance(app.screen, StartScreen)
        assert app.start_screen.query_one("#step-server", StepRow).state == "failed"
        message, hint = failure_text(app)
        assert "KeyError" in message
        assert "KeyError: 'slots'" in crash_log_in(hint).read_text()
        assert app.supervisor is not None and app.supervisor.stop_requested


async def test_an_unexpected_error_in_the_chat_shows_the_crash_log(backend, monkeypatch):
    def broken_stream(*args, **kwargs):
        raise TypeError("a bug in the chat")

    # A fault the real client does not make on demand: the chat's own code failing.
    monkeypatch.setattr("lucebox.app.tui.widgets.chat.stream_chat", broken_stream)
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("c", *"hi", "enter")
        await wait_until(pilot, lambda: failure_shown(app))
        assert isinstance(app.screen, StartScreen)
        message, hint = failure_text(app)
        assert "a bug in the chat" in message
        assert "TypeError: a bug in the chat" in crash_log_in(hint).read_text()


async def test_an_error_planning_the_preset_table_shows_on_the_preset_step(backend):
    backend.preset_table_failure = GuardRefusal("no preset can be planned", hint="see why")
    app = app_for(backend, ServeOptions())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: failure_shown(app))
        assert app.start_screen.query_one("#step-preset", StepRow).state == "failed"
        assert failure_text(app) == ("no preset can be planned", "see why")


@pytest.mark.parametrize(
    ("failure", "exit_code"),
    [
        (GuardRefusal("x.gguf was refused by the model check"), 3),
        (UsageError("no preset named 'nope'"), 2),
        (TransferError("the download stopped"), 1),
        (RuntimeError("a bug"), 1),
    ],
)
async def test_quitting_after_a_failure_exits_with_its_code(backend, failure, exit_code):
    backend.failures = [failure]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: failure_shown(app))
        await pilot.press("q")
    assert app.return_code == exit_code


async def test_quitting_after_the_server_gave_up_exits_1(backend):
    backend.server_events = [ServerEvent("gave-up", "gave up after 5 crashes in 600 s", 1)]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: failure_shown(app))
        await pilot.press("q")
    assert app.return_code == 1


async def test_quitting_after_a_retry_that_worked_exits_0(backend):
    backend.failures = [GuardRefusal("x.gguf was refused by the model check")]
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: failure_shown(app))
        await pilot.press("r")
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitModal))
        await pilot.press("s")
    assert app.return_code == 0


def _engine_with_webui(tmp_path: Path) -> str:
    """A stand-in llama-server that carries the web UI's files, as a built one does."""
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF" + b"\0" * 256 + webui.ASSET_MARKER + b"\0")
    return str(server)


async def test_the_dashboard_shows_the_web_ui_and_w_opens_it(backend, tmp_path, monkeypatch):
    backend.server_path = _engine_with_webui(tmp_path)
    monkeypatch.setenv("DISPLAY", ":0")
    app = app_for(backend)
    opened: list[str] = []
    # Launching a real browser is what this machine cannot do: record the request instead.
    monkeypatch.setattr(app, "open_url", lambda url, **_: opened.append(url))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))

        def header() -> str:
            return str(app.screen.query_one("#dash-header", Static).render())

        await wait_until(pilot, lambda: "/v1" in header())
        header_text = header()
        assert "http://127.0.0.1:8080/v1" in header_text
        assert "chat in a browser http://127.0.0.1:8080/ " in header_text
        assert app.active_bindings["w"].enabled
        await pilot.press("w")
        await pilot.pause()
        assert opened == ["http://127.0.0.1:8080/"]


async def test_without_a_desktop_w_copies_the_web_ui_address(backend, tmp_path, monkeypatch):
    backend.server_path = _engine_with_webui(tmp_path)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    app = app_for(backend)
    opened: list[str] = []
    monkeypatch.setattr(app, "open_url", lambda url, **_: opened.append(url))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("w")
        await pilot.pause()
        assert opened == [] and app.clipboard == "http://127.0.0.1:8080/"


async def test_an_engine_without_the_ui_has_no_web_ui_key(backend):
    app = app_for(backend)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen) and dashboard.webui_url is None
        header = dashboard.query_one("#dash-header", Static)
        await wait_until(pilot, lambda: "/v1" in str(header.render()))
        assert "chat in a browser" not in str(header.render())
        assert "w" not in app.active_bindings


async def test_quitting_during_a_download_stops_it_within_a_second_and_keeps_the_partial(
    tmp_path, monkeypatch
):
    """The real pipeline pulling from a slow local Hub: q ends the download, not waits for it."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB at 512 KiB/s: 16 s, far longer than the test
    with serve_hub() as hub:
        hub.add("acme/big", "big-instruct.gguf", HubFile(body, bytes_per_s=512 * 1024))
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        paths = resolve_paths(dict(os.environ))
        app = LuceboxApp(Backend(paths), ServeOptions(model="hf:acme/big/big-instruct.gguf"))
        partial = files_dir(paths) / "acme--big" / "big-instruct.gguf.part"
        async with app.run_test(size=(100, 30)) as pilot:
            row = app.start_screen.query_one("#step-models", StepRow)
            await wait_until(
                pilot,
                lambda: (
                    "downloading" in str(row.query_one(".step-message", Label).render())
                    and partial.exists()
                    and partial.stat().st_size > 0
                ),
                timeout_s=30,
            )
            (pipeline,) = (w for w in app.workers if w.group == "pipeline")
            quit_at = time.monotonic()
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_code is not None, timeout_s=5)
        stopped_s = time.monotonic() - quit_at
        kept = partial.stat().st_size
        await asyncio.sleep(0.3)
        assert partial.stat().st_size == kept
    assert stopped_s < 1.0
    # The download's thread ended with the cancel, so nothing keeps the process alive.
    assert pipeline.state == WorkerState.ERROR
    assert isinstance(pipeline.error, CancelledByUserError)
    assert 0 < kept < len(body)
    assert app.return_code == 0


def test_speculation_line_is_loud_when_planned_speculation_does_not_run():
    from lucebox.app.tui.widgets.throughput import spec_line
    from lucebox.engine.run.sample import SpecStatus

    running = spec_line(SpecStatus("draft-mtp", True, "planned", 0.62, 1.9), 0.62)
    assert running is not None and running.plain == (
        "draft-mtp · 62% of drafts accepted · 1.9 per step"
    )
    off = spec_line(
        SpecStatus("draft-mtp", False, "0% of 300 drafted tokens accepted", 0.0, 0.0), 0
    )
    assert off is not None and off.plain.startswith("draft-mtp is OFF: 0% of 300")
    assert "red" in str(off.style)
    assert spec_line(None, None) is None


def test_speculation_line_shows_what_the_calibration_measured():
    from lucebox.app.tui.widgets.throughput import spec_line
    from lucebox.engine.run.sample import MeasuredRate, SpecStatus

    mtp = MeasuredRate(690.0, 1100.0, 1.594, 4, 1.0)
    kept = spec_line(SpecStatus("draft-mtp", True, "measured", 1.0, 2.99, mtp), 1.0)
    assert kept is not None and kept.plain == (
        "MTP 1.59x (measured) · 100% of drafts accepted · 3.0 per step"
    )
    slower = MeasuredRate(680.0, 440.0, 0.647, 4, 1.0)
    reason = "off: drafted nothing, 0.65x (measured on this card over 4 probes, ...)"
    off = spec_line(SpecStatus("draft-mtp", False, reason, None, None, slower), None)
    assert off is not None and off.plain == "MTP off: drafted nothing, 0.65x"


def test_speculation_line_shows_greedy_and_sampled_apart():
    from lucebox.app.tui.widgets.throughput import spec_line
    from lucebox.engine.run.sample import MeasuredRate, SamplingRate, SpecStatus

    mtp = MeasuredRate(690.0, 1100.0, 1.594, 4, 1.0)
    apart = (SamplingRate(False, "greedy", 1.594, 0.9), SamplingRate(True, "t0.7", None, 0.45))
    line = spec_line(SpecStatus("draft-mtp", True, "measured", 0.7, 2.5, mtp, apart), 0.7)
    assert line is not None and line.plain == (
        "MTP · greedy 1.59x measured, 90% accepted · sampled (t0.7) 45% accepted · 2.5 per step"
    )


async def test_the_sleep_choice_states_the_rule_and_starts_the_server_again_with_it(backend):
    app = app_for(backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: on_dashboard(app))
        await pilot.press("z")
        await wait_until(pilot, lambda: isinstance(app.screen, SleepModal))
        rule = str(app.screen.query_one("#sleep-detail", Static).render())
        assert "conversation is saved" in rule and "wakes the engine" in rule
        assert app.screen.query_one("#sleep-0", Button).variant == "primary"  # off by default
        await pilot.press("escape")  # cancelled: nothing changes
        await wait_until(pilot, lambda: on_dashboard(app))
        assert backend.sleep_chosen == [] and len(backend.options_seen) == 1
        await pilot.press("z")
        await wait_until(pilot, lambda: isinstance(app.screen, SleepModal))
        await pilot.click("#sleep-900")
        await wait_until(pilot, lambda: len(backend.options_seen) == 2 and on_dashboard(app))
        await pilot.press("z")
        await wait_until(pilot, lambda: isinstance(app.screen, SleepModal))
        assert app.screen.query_one("#sleep-900", Button).variant == "primary"  # the setting now
        # A custom time in minutes; one that is not a number is refused, and it stays open.
        app.screen.query_one("#sleep-custom", Input).value = "-3"
        app.screen.query_one("#sleep-custom", Input).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SleepModal)
        assert "a number" in str(app.screen.query_one("#sleep-error", Static).render())
        app.screen.query_one("#sleep-custom", Input).value = "40"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(backend.options_seen) == 3 and on_dashboard(app))
        await pilot.press("z")
        await wait_until(pilot, lambda: isinstance(app.screen, SleepModal))
        assert app.screen.query_one("#sleep-custom", Input).value == "40"
        await pilot.click("#sleep-0")
        await wait_until(pilot, lambda: len(backend.options_seen) == 4 and on_dashboard(app))
    assert backend.sleep_chosen == [900.0, 2400.0, 0.0]


def test_idle_times_read_as_people_say_them():
    from lucebox.engine.run.sleep import idle_text

    shown = [idle_text(s) for s in (0, 300, 900, 3600, 5400, 90, 2400)]
    assert shown == ["off", "5 min", "15 min", "1 h", "1 h 30 min", "90 s", "40 min"]


def test_the_sleep_choice_is_kept_in_the_config_file(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    chosen = Backend(paths)
    assert chosen.sleep_idle_s() == 0.0  # off by default
    chosen.choose_sleep(2400.0)
    assert "sleep_idle_s = 2400" in paths.config_file.read_text()
    assert Backend(paths).sleep_idle_s() == 2400.0
