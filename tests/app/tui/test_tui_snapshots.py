"""Snapshots of the TUI at 80x24 and 140x40 (review snapshot_report.html before updating)."""

from __future__ import annotations

import os

import pytest
from textual.pilot import Pilot

from lucebox.app.tui.app import LuceboxApp
from lucebox.app.tui.screens.dashboard import DashboardScreen
from lucebox.app.tui.screens.servedsetdashboard import ServedSetDashboardScreen
from lucebox.app.tui.screens.sleep import SleepModal
from lucebox.app.tui.screens.users import UsersModal
from lucebox.app.tui.widgets.models import ModelTable
from lucebox.app.tui.widgets.steps import StepRow
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.pipeline import ServeOptions, StepEvent
from tests.app.tui.scripted import (
    BASE_GEMMA,
    RTX_4090,
    SET_SOURCES,
    STEPS_DOWNLOADING,
    ScriptedBackend,
    prepared_set_for,
    preset_table_shown,
    refused_by_the_model_check,
    samples,
    set_models,
    wait_until,
)

SIZES = [(80, 24), (140, 40)]


@pytest.fixture
def backend(tmp_path):
    backend = ScriptedBackend(resolve_paths(dict(os.environ)), tmp_path, budget=RTX_4090)
    return backend


def app_for(backend: ScriptedBackend, options: ServeOptions | None = None) -> LuceboxApp:
    return LuceboxApp(backend, options or ServeOptions(preset="smoke"), clock=lambda: 1000.0)


async def settle(pilot: Pilot, predicate) -> None:
    """Wait for the state to snapshot, then for the screen to draw it."""
    await wait_until(pilot, predicate)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_start_up_while_downloading(backend, snap_compare, size):
    backend.steps = list(STEPS_DOWNLOADING)
    backend.downloading = True
    app = app_for(backend)

    async def run_before(pilot: Pilot) -> None:
        row = app.start_screen.query_one("#step-models", StepRow)
        await settle(pilot, lambda: row.state == "running")

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_preset_choice(backend, snap_compare, size):
    app = app_for(backend, ServeOptions())

    async def run_before(pilot: Pilot) -> None:
        await settle(
            pilot,
            lambda: preset_table_shown(app),
        )

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_with_a_minute_of_samples(backend, snap_compare, size):
    backend.sample_script = samples(60)
    app = app_for(backend)

    async def run_before(pilot: Pilot) -> None:
        await settle(
            pilot,
            lambda: (
                isinstance(app.screen, DashboardScreen)
                and app.screen.latest is not None
                and app.screen.latest.at_s == 1059.0
            ),
        )

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_failure_of_the_model_check(backend, snap_compare, size, tmp_path):
    notes, refusal = refused_by_the_model_check(tmp_path / "gemma-3-270m.gguf", BASE_GEMMA)
    # As the engine runs it: the check comes once the engine is known.
    checking = StepEvent("models", "running", "checking gemma-3-270m.gguf for this engine")
    backend.steps = [*backend.steps[:5], checking, *notes]
    backend.failures = [refusal]
    app = app_for(backend)

    async def run_before(pilot: Pilot) -> None:
        await settle(pilot, lambda: app.start_screen.query_one("#failure").display)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_of_a_served_set(backend, snap_compare, size):
    backend.set_sources = SET_SOURCES
    backend.models_script = set_models(prepared_set_for())
    app = app_for(backend, ServeOptions(models=SET_SOURCES))

    async def run_before(pilot: Pilot) -> None:
        await settle(
            pilot,
            lambda: (
                isinstance(app.screen, ServedSetDashboardScreen)
                and app.screen.query_one(ModelTable).row_count == 3
                and app.screen.models == backend.models_script
            ),
        )

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_users_choice(backend, snap_compare, size):
    app = app_for(backend)

    async def run_before(pilot: Pilot) -> None:
        await settle(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("u")
        await settle(pilot, lambda: isinstance(app.screen, UsersModal))

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sleep_choice(backend, snap_compare, size):
    app = app_for(backend)

    async def run_before(pilot: Pilot) -> None:
        await settle(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("z")
        await settle(pilot, lambda: isinstance(app.screen, SleepModal))

    assert snap_compare(app, terminal_size=size, run_before=run_before)
