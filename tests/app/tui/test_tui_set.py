"""The TUI serving a set: SmolLM2 and the Gemma 3 270M smoke model on the real CPU engine's
router, driven by Textual's pilot; `lucebox status --json` read beside it, as a user would."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from lucebox.app.tui.app import LuceboxApp
from lucebox.app.tui.backend import Backend
from lucebox.app.tui.messages import ModelsSampled
from lucebox.app.tui.screens.quit import QuitModal
from lucebox.app.tui.screens.servedsetdashboard import ServedSetDashboardScreen
from lucebox.app.tui.widgets.models import ModelTable
from lucebox.app.tui.widgets.steps import StepRow
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.pipeline import ServeOptions
from support.ports import free_port
from support.servedset import home_with_engine
from tests.app.tui.scripted import wait_until
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow


async def status_models() -> dict[str, dict[str, object]]:
    """`lucebox status --json`'s models by alias (the state file the run keeps)."""
    done = await asyncio.to_thread(run_lucebox, "status", "--json")
    assert done.returncode == 0, done.stderr
    return {m["alias"]: m for m in json.loads(done.stdout)["models"]}


def shown_states(table: ModelTable) -> dict[str, str]:
    """Each row's state cell as the table shows it (the state word first)."""
    return {str(key.value): str(table.get_cell(key, "state")).split()[0] for key in table.rows}


async def test_up_serves_a_set_and_loads_and_unloads_a_model_by_key(
    built_engine_home, lucebox_home
):
    home_with_engine(lucebox_home)  # the built CPU engine, linked in
    options = ServeOptions(models=("smollm2", "smoke"), port=free_port())
    app = LuceboxApp(Backend(resolve_paths(dict(os.environ))), options)
    seen: list[object] = []
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        await wait_until(
            pilot,
            lambda: (
                isinstance(app.screen, ServedSetDashboardScreen)
                and bool(app.screen.query(ModelTable))
                and app.screen.query_one(ModelTable).row_count == 2
                and app.screen.state == "ready"
            ),
            timeout_s=300,
        )
        rows = {row.step: row.state for row in app.start_screen.query(StepRow)}
        assert rows == dict.fromkeys(rows, "done")
        dashboard = app.screen
        table = dashboard.query_one(ModelTable)
        assert shown_states(table) == {"smollm2": "unloaded", "smoke": "unloaded"}
        assert f"127.0.0.1:{options.port}/v1" in str(dashboard.query_one("#dash-header").render())
        assert {a: m["state"] for a, m in (await status_models()).items()} == {
            "smollm2": "unloaded",
            "smoke": "unloaded",
        }

        await pilot.press("down", "o")  # the second row: the Gemma 270M
        await wait_until(pilot, lambda: shown_states(table)["smoke"] == "loaded", timeout_s=120)
        loading = [
            m
            for message in seen
            if isinstance(message, ModelsSampled)
            for m in message.sample.models
            if m.alias == "smoke" and m.state == "loading"
        ]
        assert any(m.load_progress is not None for m in loading), loading
        models = await status_models()
        assert (models["smoke"]["state"], models["smollm2"]["state"]) == ("loaded", "unloaded")
        assert models["smoke"]["memory_bytes"] > 0  # type: ignore[operator]

        await pilot.press("u")
        await wait_until(pilot, lambda: shown_states(table)["smoke"] == "unloaded", timeout_s=60)
        assert (await status_models())["smoke"]["state"] == "unloaded"

        # The router refuses to unload what is not running: said, and the set stays served.
        await pilot.press("u")
        await wait_until(pilot, lambda: any("not running" in n.message for n in app._notifications))
        assert isinstance(app.screen, ServedSetDashboardScreen)

        router_pid = app.supervisor.pid if app.supervisor else None
        assert router_pid is not None and alive(router_pid)
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitModal))
        await pilot.press("s")
        await wait_until(pilot, lambda: not alive(router_pid), timeout_s=60)
