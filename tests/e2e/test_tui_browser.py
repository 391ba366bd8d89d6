"""The TUI's model browser against a real local HTTP server speaking the Hub's protocol: from
the preset table, "/" searches, Enter opens a repo's quants planned for this machine, Enter on
a quant serves its pinned file."""

from __future__ import annotations

import dataclasses
import os

import pytest
from textual.widgets import DataTable, Input

from lucebox.app.tui.app import LuceboxApp
from lucebox.app.tui.screens.browser import ModelBrowserScreen
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.pipeline import ServeOptions
from support.ggufgen import ModelSpec, cached_gguf
from support.hubserver import COMMIT, HubFile, HubState, serve_hub
from tests.app.tui.scripted import ScriptedBackend, preset_table_shown, wait_until

REPO = "acme/tiny-browse-GGUF"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    state = HubState()
    for quant in ("Q8_0", "Q4_0"):
        spec = dataclasses.replace(ModelSpec(basename="tiny-browse"), quant=quant)
        state.add(REPO, f"tiny-{quant}.gguf", HubFile(cached_gguf(spec).read_bytes()))
    state.add(REPO, "mmproj-tiny-F16.gguf", HubFile(b"GGUF" + b"\0" * 60))
    state.add("acme/other-GGUF", "other-Q4_0.gguf", HubFile(b"GGUF" + b"\0" * 60))
    state.downloads.update({REPO: 10, "acme/other-GGUF": 5})
    with serve_hub(state) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.base_url)
        yield served


def browser_rows(app: LuceboxApp) -> list[str]:
    if not isinstance(app.screen, ModelBrowserScreen):
        return []
    return [str(key.value) for key in app.screen.query_one(DataTable).rows]


async def test_search_open_a_repo_and_serve_the_chosen_quant(hub, tmp_path):
    backend = ScriptedBackend(resolve_paths(dict(os.environ)), tmp_path)
    app = LuceboxApp(backend, ServeOptions(), clock=lambda: 1000.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: preset_table_shown(app))
        await pilot.press("slash")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelBrowserScreen))
        app.screen.query_one(Input).value = "acme"
        await pilot.press("enter")
        await wait_until(pilot, lambda: browser_rows(app) == [REPO, "acme/other-GGUF"])
        await pilot.press("enter")  # the most downloaded, under the cursor
        await wait_until(
            pilot, lambda: browser_rows(app) and browser_rows(app)[0].startswith("hf:")
        )
        table = app.screen.query_one(DataTable)
        chosen = browser_rows(app)[table.cursor_row]
        # A tiny model fits whole: the most precise quant is chosen and the cursor is on it.
        assert chosen == f"hf:{REPO}/tiny-Q8_0.gguf@{COMMIT}"
        help_text = str(app.screen.query_one("#browser-help").render())
        assert "mmproj-tiny-F16.gguf" in help_text
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(backend.options_seen))
    assert backend.options_seen[0].model == chosen and backend.options_seen[0].preset is None
    assert backend.chosen == []  # a Hub model is not saved as the preset


async def test_a_short_name_lists_its_presets_and_enter_serves_the_one_picked(hub, tmp_path):
    backend = ScriptedBackend(resolve_paths(dict(os.environ)), tmp_path)
    app = LuceboxApp(backend, ServeOptions(), clock=lambda: 1000.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: preset_table_shown(app))
        await pilot.press("slash")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelBrowserScreen))
        app.screen.query_one(Input).value = "gemma4:31b"
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: set(browser_rows(app)) == {"gemma4-31b", "gemma4-31b-lucebox"}
        )
        help_text = str(app.screen.query_one("#browser-help").render())
        assert "names the presets" in help_text
        table = app.screen.query_one(DataTable)
        picked = browser_rows(app)[table.cursor_row]
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(backend.options_seen))
    assert backend.options_seen[0].preset == picked
