"""Each person's key from the TUI: the dashboard's `k` opens the keys, a name typed makes one
(shown once, kept hashed in the keys file the front reads), ctrl+r revokes the selected one."""

from __future__ import annotations

import os

import pytest
from textual.widgets import DataTable, Input, Static

from lucebox.app.tui.app import LuceboxApp
from lucebox.app.tui.screens.dashboard import DashboardScreen
from lucebox.app.tui.screens.keys import KeysScreen
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine.personkeys import add_key, keys_path, read_keys
from lucebox.engine.plan.options import ServeOptions
from tests.app.tui.scripted import ScriptedBackend, wait_until


@pytest.fixture
def backend(tmp_path) -> ScriptedBackend:
    return ScriptedBackend(resolve_paths(dict(os.environ)), tmp_path)


async def test_keys_are_made_and_revoked_from_the_dashboard(backend):
    paths = backend.paths
    add_key(paths, "laptop", "models")
    app = LuceboxApp(backend, ServeOptions(preset="smoke"), clock=lambda: 1000.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("k")
        await wait_until(pilot, lambda: isinstance(app.screen, KeysScreen))
        table = app.screen.query_one(DataTable)
        assert [table.get_row_at(i)[:2] for i in range(table.row_count)] == [["laptop", "models"]]

        app.screen.query_one("#key-name", Input).value = "phone"
        await pilot.press("enter")
        said = str(app.screen.query_one("#key-said", Static).render())
        secret = said.rsplit(" ", 1)[-1]
        assert "the key of 'phone' (chat), shown this once" in said
        made = read_keys(keys_path(paths)).who(secret)
        assert made is not None and made.name == "phone"
        assert table.row_count == 2

        app.screen.query_one("#key-name", Input).value = "phone"  # a name taken: said why
        await pilot.press("enter")
        assert "a key named 'phone' exists" in str(app.screen.query_one("#key-said").render())

        table.move_cursor(row=1)
        await pilot.press("ctrl+r")
        assert [k.name for k in read_keys(keys_path(paths)).keys] == ["laptop"]
        assert table.row_count == 1
        await pilot.press("escape")
        assert isinstance(app.screen, DashboardScreen)
