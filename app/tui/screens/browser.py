"""The model browser: search the Hub for GGUF repos, see a repo's quants planned for this
machine (fits, context, speculation), and Enter on a quant to serve it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.units import gib_text
from lucebox.engine.models.hubrepo import RepoHit
from lucebox.engine.models.shortname import NameMatch, is_short_name
from lucebox.engine.plan.sources import quantchoice
from lucebox.engine.plan.sources.repoplan import RepoCandidates


@dataclass(frozen=True)
class HubFinder:
    """What the browser asks of the engine, given by the App (blocking: run in a thread)."""

    search: Callable[[str], list[RepoHit]]
    quants: Callable[[str], RepoCandidates]
    """Every quant of a repo, planned for this machine."""
    named: Callable[[str], NameMatch | None] | None = None
    """What a short name (``qwen3.6:27b``) names: presets, or a repo at a quant; None when
    the text is a plain search."""


PRESETS = "presets"
"""Where the table lists the presets a short name names (no repo has a name without "/")."""


class ModelBrowserScreen(ModalScreen[str | None]):
    """Type a name and Enter to search; Enter on a repo lists its quants; Enter on a quant
    returns its pinned source (``hf:OWNER/REPO/FILE.gguf@COMMIT``). A short name
    (``qwen3.6:27b``) lists the presets it names (Enter returns the preset id) or its repo's
    quants."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "back", "Back")]

    def __init__(self, finder: HubFinder) -> None:
        super().__init__()
        self.finder = finder
        self.repo: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="browser"):
            yield Static("Models on the Hugging Face Hub (GGUF)", id="browser-title")
            yield Input(
                placeholder="search, e.g. qwen3, or a short name: qwen3.6:27b (Enter)",
                id="browser-search",
            )
            yield DataTable(id="browser-table", cursor_type="row", zebra_stripes=True)
            yield Static("Enter searches / opens / serves · Esc goes back", id="browser-help")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def _say(self, text: str) -> None:
        self.query_one("#browser-help", Static).update(text)

    @on(Input.Submitted)
    def search(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self._say(f"searching for {event.value.strip()} ...")
            self._search(event.value.strip())

    @work(thread=True, exclusive=True, group="browser", exit_on_error=False)
    def _search(self, text: str) -> None:
        try:
            named = self.finder.named(text) if self.finder.named and is_short_name(text) else None
            if named is not None:
                self._named(named)
                return
            hits = self.finder.search(text)
        except LuceboxError as exc:
            self.app.call_from_thread(self._say, f"{exc.message} ({exc.hint})")
            return
        self.app.call_from_thread(self._show_hits, text, hits)

    def _named(self, match: NameMatch) -> None:
        """A short name: its presets listed to pick from, or its repo's quants planned."""
        if match.source is None:
            self.app.call_from_thread(self._show_presets, match)
            return
        planned = self.finder.quants(match.source)
        self.app.call_from_thread(self._show_quants, match.source, planned)

    def _show_presets(self, match: NameMatch) -> None:
        self.repo = PRESETS
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("Preset")
        for preset_id in match.preset_ids:
            table.add_row(preset_id, key=preset_id)
        self._say(f"{match.why} · Enter serves one (the preset table marks what fits with ★)")
        table.focus()

    def _show_hits(self, text: str, hits: list[RepoHit]) -> None:
        self.repo = None
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("Repo", "Downloads", "")
        for hit in hits:
            table.add_row(
                hit.repo_id, f"{hit.downloads:,}", "gated" if hit.gated else "", key=hit.repo_id
            )
        self._say(f"{len(hits)} GGUF repos for '{text}', most downloaded first · Enter opens one")
        table.focus()

    @work(thread=True, exclusive=True, group="browser", exit_on_error=False)
    def _open(self, repo: str) -> None:
        try:
            planned = self.finder.quants(repo)
        except LuceboxError as exc:
            self.app.call_from_thread(self._say, f"{exc.message} ({exc.hint})")
            return
        self.app.call_from_thread(self._show_quants, repo, planned)

    def _show_quants(self, repo: str, planned: RepoCandidates) -> None:
        self.repo = repo
        try:
            choice = quantchoice.choose(
                planned.candidates, planned.native_ctx, asked_quant=None, asked_ctx=None
            )
            best, why = choice.chosen, choice.why
        except LuceboxError as exc:
            best, why = None, exc.message
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("", "Quant", "Size", "Bits/weight", "Context", "Speculation")
        ranked = sorted(planned.candidates, key=lambda c: -c.bits_per_weight)
        for c in ranked:
            table.add_row(
                "★" if c is best else "",
                c.quant,
                gib_text(c.size_bytes, 2),
                f"{c.bits_per_weight:.2f}",
                f"{c.ctx:,}" if c.fits else "does not fit",
                (c.spec or "none") if c.fits else "",
                key=c.source,
            )
        if best is not None:
            table.move_cursor(row=ranked.index(best))
        sidecars = ", ".join(s.file.path for s in planned.listing.layout.sidecars)
        self._say(why + (f" · listed, not served: {sidecars}" if sidecars else ""))
        table.focus()

    @on(DataTable.RowSelected)
    def choose(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if self.repo is None:
            self._say(f"planning every quant of {key} for this machine ...")
            self._open(key)
        else:
            self.dismiss(key)

    def action_back(self) -> None:
        self.dismiss(None)
