"""What the TUI asks of the engine, in one object that tests replace to script faults."""

from __future__ import annotations

import threading
from pathlib import Path

from lucebox.engine import config, gpu, planning, presetchoice, registry, runstate, service
from lucebox.engine.crashlog import write_crash_log
from lucebox.engine.paths import Paths
from lucebox.engine.planning import ServeOptions
from lucebox.engine.runstate import ServerRun
from lucebox.engine.service import Prepared
from lucebox.engine.supervisor import Supervisor


class Backend:
    """What the TUI asks of the engine; tests replace it with a scripted one for faults."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    def first_run(self) -> bool:
        """No preset chosen yet: the user picks one from the plan table."""
        return not config.load_settings(self.paths).preset

    def preset_table(self, options: ServeOptions) -> presetchoice.PresetTable:
        settings = config.load_settings(self.paths)
        probe = gpu.probe_gpus()
        resolved = planning.resolve(options, settings)
        budget = planning.budget_for(probe, resolved.gpus)
        installed = registry.select_engine(self.paths, probe, settings.engine).engine
        engine = planning.EngineView.of(installed)
        return presetchoice.preset_table(self.paths, options, settings, budget, engine)

    def choose_preset(self, preset_id: str) -> None:
        config.set_setting(self.paths, "preset", preset_id)

    def lock(self) -> runstate.ServeLock:
        return runstate.ServeLock(self.paths)

    def prepare(
        self, options: ServeOptions, emit: service.Emit, cancel: threading.Event
    ) -> Prepared:
        return service.prepare(self.paths, options, emit, cancel=cancel)

    def build_cpu_engine(self, emit: service.Emit) -> None:
        service.build_cpu_engine(self.paths, emit)

    def supervisor(self, prepared: Prepared) -> Supervisor:
        return service.new_supervisor(self.paths, prepared)

    def server_run(self, prepared: Prepared, supervisor: Supervisor) -> ServerRun:
        """The run whose stop and restart every quit, stop and restart key goes through."""
        return service.server_run(self.paths, prepared, supervisor)

    def detach(self, options: ServeOptions) -> tuple[int, Path]:
        return runstate.start_detached(self.paths, options.to_args())

    @property
    def log_path(self) -> Path:
        return runstate.engine_log(self.paths)

    def write_crash_log(self, error: BaseException) -> Path:
        return write_crash_log(self.paths, error)
