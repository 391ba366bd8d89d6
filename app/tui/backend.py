"""What the TUI asks of the engine, in one object that tests replace to script faults."""

from __future__ import annotations

import threading
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path

from lucebox.app.tui.screens.browser import HubFinder
from lucebox.engine import pipeline, runstart, servedset
from lucebox.engine.core.crashlog import write_crash_log
from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.machine.personkeys import (
    PersonKey,
    Scope,
    add_key,
    keys_path,
    read_keys,
    revoke_key,
)
from lucebox.engine.models import hubrepo
from lucebox.engine.models.presets import load_presets
from lucebox.engine.models.shortname import ModelNameError, NameMatch, match_name
from lucebox.engine.pipeline import Prepared
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.sources import presetchoice, repoplan
from lucebox.engine.plan.sources.repoplan import RepoCandidates
from lucebox.engine.run import runstate
from lucebox.engine.run.servedset.servedsetrun import ServedSetRun
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervisor import Supervisor
from lucebox.engine.servedchoice import ModelSet, ServedChoice, served_choice
from lucebox.engine.servedset import PreparedSet


class Backend:
    """What the TUI asks of the engine; tests replace it with a scripted one for faults."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    def first_run(self) -> bool:
        """No preset chosen yet: the user picks one from the plan table."""
        return not config.load_settings(self.paths).preset

    def preset_table(self, options: ServeOptions) -> presetchoice.PresetTable:
        view = pipeline.machine_view(self.paths, options)
        return presetchoice.preset_table(
            self.paths, options, view.resolved, view.budget, view.installs
        )

    def hub_finder(self, options: ServeOptions) -> HubFinder:
        """The model browser's Hub search and quant table, planned like the launch."""

        def quants(repo: str) -> RepoCandidates:
            asked = replace(options, preset=None, model=repo, quant=None)
            source = repoplan.repo_source(repo)
            if source is None:
                raise UsageError(f"{repo} is not a repo name", hint="pick a repo from the list")
            view = pipeline.machine_view(self.paths, asked)
            return repoplan.plan_quants(
                self.paths,
                source,
                asked,
                resolved=view.resolved,
                budget=view.budget,
                installs=view.installs,
            )

        def named(text: str) -> NameMatch | None:
            """What a short name names when it names presets, or has a tag (a repo at a
            quant); None: search the Hub for the text as typed."""
            presets = load_presets(self.paths)
            try:
                return match_name(text, presets, lambda _: [])
            except ModelNameError:
                return match_name(text, presets, hubrepo.repo_ids) if ":" in text else None

        return HubFinder(search=hubrepo.search, quants=quants, named=named)

    def person_keys(self) -> tuple[PersonKey, ...]:
        return read_keys(keys_path(self.paths)).keys

    def add_person_key(self, name: str, scope: Scope) -> str:
        """A new key for ``name``, returned this once (only its hash is kept)."""
        return add_key(self.paths, name, scope)[1]

    def revoke_person_key(self, name: str) -> None:
        revoke_key(self.paths, name)

    def choose_preset(self, preset_id: str) -> None:
        config.set_setting(self.paths, "preset", preset_id)

    def users(self) -> int:
        """server.users: the people served at once."""
        return config.load_settings(self.paths).users

    def choose_users(self, users: int) -> None:
        config.set_setting(self.paths, "server.users", str(users))

    def sleep_idle_s(self) -> float:
        """server.sleep_idle_s: how long idle before the engine sleeps (0: never)."""
        return config.load_settings(self.paths).sleep_idle_s

    def choose_sleep(self, idle_s: float) -> None:
        config.set_setting(self.paths, "server.sleep_idle_s", f"{idle_s:g}")

    def lock(self) -> runstate.ServeLock:
        return runstate.ServeLock(self.paths)

    def prepare(
        self, options: ServeOptions, emit: pipeline.Emit, cancel: threading.Event
    ) -> Prepared:
        return pipeline.prepare(self.paths, options, emit, cancel=cancel)

    def served_choice(self, options: ServeOptions) -> ServedChoice:
        """Whether ``options`` serve one model or a set (several --model, or models.served)."""
        return served_choice(options, config.load_settings(self.paths))

    def prepare_set(
        self, chosen: ModelSet, emit: pipeline.Emit, cancel: threading.Event
    ) -> PreparedSet:
        return servedset.prepare_set(
            self.paths, chosen.options, chosen.sources, emit, dry_run=False, cancel=cancel
        )

    def router_run(
        self, prepared: PreparedSet, emit: pipeline.Emit
    ) -> AbstractAsyncContextManager[ServedSetRun]:
        """The set's run, with lucebox's proxy on the served address while the block lasts."""
        return servedset.router_run(self.paths, prepared, emit)

    def build_cpu_engine(self, emit: pipeline.Emit) -> None:
        pipeline.build_cpu_engine(self.paths, emit)

    def supervisor(self, prepared: Prepared) -> Supervisor:
        return runstart.new_supervisor(self.paths, prepared)

    def server_run(self, prepared: Prepared, supervisor: Supervisor) -> ServerRun:
        """The run whose stop and restart every quit, stop and restart key goes through."""
        return runstart.server_run(self.paths, prepared, supervisor)

    def detach(self, options: ServeOptions) -> tuple[int, Path]:
        return runstate.start_detached(self.paths, options.to_args())

    @property
    def log_path(self) -> Path:
        return runstate.engine_log(self.paths)

    def write_crash_log(self, error: BaseException) -> Path:
        return write_crash_log(self.paths, error)
