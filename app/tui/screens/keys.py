"""A key per person from the TUI: the keys, a new one made (shown once), one revoked."""

from __future__ import annotations

from typing import ClassVar, Protocol

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Select, Static

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.machine.personkeys import SCOPES, PersonKey, Scope


class KeyBook(Protocol):
    """Where the keys are kept (the TUI's backend, over ``personkeys``)."""

    def person_keys(self) -> tuple[PersonKey, ...]: ...

    def add_person_key(self, name: str, scope: Scope) -> str: ...

    def revoke_person_key(self, name: str) -> None: ...


class KeysScreen(Screen[None]):
    """The keys and their scopes; a name typed and Enter makes a key, ctrl+r revokes the
    selected one. A running server takes either at its next request."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("ctrl+r", "revoke", "Revoke the selected key", priority=True),
    ]

    def __init__(self, book: KeyBook) -> None:
        super().__init__()
        self.book = book

    def compose(self) -> ComposeResult:
        with Vertical(id="keys"):
            yield DataTable(id="key-table", cursor_type="row")
            with Horizontal(id="key-new"):
                yield Input(placeholder="a new key's name, then Enter", id="key-name")
                yield Select(
                    [(s, s) for s in SCOPES], value="chat", allow_blank=False, id="key-scope"
                )
            yield Static("", id="key-said")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("name", "scope", "made")
        self.show_keys()
        self.query_one("#key-name", Input).focus()

    def show_keys(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for key in self.book.person_keys():
            table.add_row(key.name, key.scope, key.created_at, key=key.name)

    @on(Input.Submitted, "#key-name")
    def make_key(self, event: Input.Submitted) -> None:
        scope = self.query_one("#key-scope", Select).value
        chosen: Scope = next((s for s in SCOPES if s == scope), "chat")
        try:
            secret = self.book.add_person_key(event.value.strip(), chosen)
        except LuceboxError as exc:
            self.say(f"{exc.message}: {exc.hint}" if exc.hint else exc.message)
            return
        event.input.clear()
        self.show_keys()
        self.say(f"the key of '{event.value.strip()}' ({chosen}), shown this once: {secret}")

    def action_revoke(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            self.say("no key to revoke")
            return
        name = str(table.get_row_at(table.cursor_row)[0])
        self.book.revoke_person_key(name)
        self.show_keys()
        self.say(f"revoked the key of '{name}': its next request is refused")

    def say(self, text: str) -> None:
        self.query_one("#key-said", Static).update(text)
