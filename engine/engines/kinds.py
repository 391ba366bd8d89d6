"""Engine kinds: each server lucebox can fetch, build, install and pick is one object.

``LLAMA_SERVER`` (llama.cpp's llama-server) and ``LUCEBOX`` (the Lucebox engine,
dflash_server) implement :class:`EngineKind`; callers name a kind once (``kind(name)``) and ask
it, instead of testing which engine they hold. The planner decides which kind serves a launch
(:mod:`lucebox.engine.plan.enginechoice`); this module only knows how to get each one built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.transfer import TransferProgress
from lucebox.engine.engines import build, lucebox, luceboxbuild, registry, source, toolchain
from lucebox.engine.engines.build import BuildCallback, BuildChoice, BuildOptions
from lucebox.engine.engines.lucebox import ByteProgress
from lucebox.engine.engines.registry import EngineManifest, EngineSelection, KindName
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.machine.cpu import CpuInfo
from lucebox.engine.machine.gpu import GpuProbe


class EngineKind(Protocol):
    """What every engine kind answers: its names, its source, its build and its install."""

    @property
    def name(self) -> KindName: ...

    @property
    def title(self) -> str:
        """How messages name it ("llama-server", "the Lucebox engine")."""
        ...

    @property
    def build_command(self) -> str:
        """The command that builds it, for hints."""
        ...

    def ensure_source(self, paths: Paths, on_bytes: ByteProgress | None = None) -> SourceInfo:
        """The pinned source, fetched (``on_bytes`` hears the bytes so far) and checked."""
        ...

    def choose_build(
        self,
        probe: GpuProbe,
        cuda: toolchain.CudaToolkitInfo,
        *,
        want: build.Backend | None = None,
        archs: tuple[str, ...] = (),
        cpu: CpuInfo | None = None,
    ) -> BuildChoice:
        """The build this machine gets (``want`` and ``archs`` from ``--cpu/--cuda/--arch``)."""
        ...

    def build_and_install(
        self,
        paths: Paths,
        source: SourceInfo,
        options: BuildOptions,
        *,
        jobs: int | None = None,
        on_event: BuildCallback | None = None,
    ) -> tuple[EngineManifest, bool]:
        """Build (or reuse) and install; returns the engine and whether it was cached."""
        ...

    def select(
        self, paths: Paths, probe: GpuProbe, wanted_id: str = "", cpu: CpuInfo | None = None
    ) -> EngineSelection:
        """The installed build of this kind a launch would use, and why."""
        ...


@dataclass(frozen=True)
class LlamaServerKind:
    name: KindName = "llama-server"
    title: str = "llama-server"
    build_command: str = "lucebox engine build"

    def ensure_source(self, paths: Paths, on_bytes: ByteProgress | None = None) -> SourceInfo:
        def report(event: TransferProgress) -> None:
            if on_bytes is not None:
                on_bytes(event.done_bytes)

        return source.ensure_source(paths, on_progress=report)

    def choose_build(
        self,
        probe: GpuProbe,
        cuda: toolchain.CudaToolkitInfo,
        *,
        want: build.Backend | None = None,
        archs: tuple[str, ...] = (),
        cpu: CpuInfo | None = None,
    ) -> BuildChoice:
        return build.choose_options(probe, cuda, want=want, archs=archs, cpu=cpu)

    def build_and_install(
        self,
        paths: Paths,
        source: SourceInfo,
        options: BuildOptions,
        *,
        jobs: int | None = None,
        on_event: BuildCallback | None = None,
    ) -> tuple[EngineManifest, bool]:
        return registry.build_and_install(paths, source, options, jobs=jobs, on_event=on_event)

    def select(
        self, paths: Paths, probe: GpuProbe, wanted_id: str = "", cpu: CpuInfo | None = None
    ) -> EngineSelection:
        return registry.select_engine(paths, probe, wanted_id, cpu)


@dataclass(frozen=True)
class LuceboxKind:
    name: KindName = "lucebox"
    title: str = "the Lucebox engine"
    build_command: str = "lucebox engine build --engine lucebox"

    def ensure_source(self, paths: Paths, on_bytes: ByteProgress | None = None) -> SourceInfo:
        return lucebox.ensure_source(paths, on_progress=on_bytes)

    def choose_build(
        self,
        probe: GpuProbe,
        cuda: toolchain.CudaToolkitInfo,
        *,
        want: build.Backend | None = None,
        archs: tuple[str, ...] = (),
        cpu: CpuInfo | None = None,
    ) -> BuildChoice:
        if want is not None:
            raise UsageError(
                "the Lucebox engine is CUDA only: --cpu and --cuda do not apply",
                hint="leave them out; --arch names the card",
            )
        return luceboxbuild.choose_options(probe, cuda, archs=archs, cpu=cpu)

    def build_and_install(
        self,
        paths: Paths,
        source: SourceInfo,
        options: BuildOptions,
        *,
        jobs: int | None = None,
        on_event: BuildCallback | None = None,
    ) -> tuple[EngineManifest, bool]:
        return luceboxbuild.build_and_install(paths, source, options, jobs=jobs, on_event=on_event)

    def select(
        self, paths: Paths, probe: GpuProbe, wanted_id: str = "", cpu: CpuInfo | None = None
    ) -> EngineSelection:
        engine = luceboxbuild.installed(paths, cpu=cpu)
        if engine is None:
            return EngineSelection(None, f"not built yet: run `{self.build_command}`")
        return EngineSelection(engine, "the newest Lucebox engine this CPU runs")


LLAMA_SERVER = LlamaServerKind()
LUCEBOX = LuceboxKind()
KINDS: dict[KindName, EngineKind] = {LLAMA_SERVER.name: LLAMA_SERVER, LUCEBOX.name: LUCEBOX}


def kind(name: KindName) -> EngineKind:
    return KINDS[name]
