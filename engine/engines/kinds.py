"""Engine kinds: each server lucebox can fetch, build, install and pick is one object.

``LLAMA_SERVER`` (llama.cpp's llama-server) and ``LUCEBOX`` (the Lucebox engine,
dflash_server) implement :class:`EngineKind`; callers name a kind once (``kind(name)``) and ask
it, instead of testing which engine they hold. The planner decides which kind serves a launch
(:mod:`lucebox.engine.plan.enginechoice`); this module only knows how to get each one built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lucebox.engine.core.downloadprogress import TransferProgress
from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import (
    bsa,
    build,
    install,
    lucebox,
    luceboxbuild,
    registry,
    source,
    toolchain,
)
from lucebox.engine.engines.build import BuildCallback, BuildChoice, BuildOptions
from lucebox.engine.engines.known import KnownSource, KnownSources
from lucebox.engine.engines.lucebox import ByteProgress
from lucebox.engine.engines.registry import EngineManifest, EngineSelection, KindName
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.machine.cpu import CpuInfo
from lucebox.engine.machine.gpu import GpuProbe


@dataclass(frozen=True)
class SourceFlags:
    """``engine source`` flags of one kind: a local copy of the source, and where it is served."""

    archive: str
    archive_help: str
    index: str
    index_help: str
    part_archive: str = ""
    """A local archive of an optional part of the source ("" when the kind has none)."""
    part_archive_help: str = ""


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

    @property
    def allocates_like_llama_cpp(self) -> bool:
        """Its memory is llama.cpp's layout (weights, KV per slot, compute buffers), so the
        planner's llama.cpp memory plan prices it; False: its own plan does."""
        ...

    @property
    def weighs_its_own_cards(self) -> bool:
        """Its plan chooses how to use several cards itself, so the planner does not weigh
        one card against the split for it."""
        ...

    @property
    def verifies_draft_trees(self) -> bool:
        """It verifies a draft's tokens as a tree (DDTree): a preset's published gain for
        such a draft holds only when this kind serves it."""
        ...

    @property
    def uses_builtin_chat_templates(self) -> bool:
        """It renders its families' chats with its own built-in templates and ignores the
        GGUF's."""
        ...

    @property
    def source_flags(self) -> SourceFlags:
        """The command-line flags that name where this kind's source comes from."""
        ...

    @property
    def known(self) -> KnownSources[Any]:
        """The sources lucebox knows for it, and the default a fresh install builds."""
        ...

    def ensure_source(
        self,
        paths: Paths,
        on_bytes: ByteProgress | None = None,
        *,
        archive: Path | None = None,
        index: str | None = None,
        known: KnownSource[Any] | None = None,
        part_archive: Path | None = None,
    ) -> SourceInfo:
        """The pinned source, fetched (from a local ``archive``, or ``index`` instead of the
        default place; ``on_bytes`` hears the bytes so far) and checked; ``known`` names
        another known source than the default (``engine update`` builds the newest);
        ``part_archive`` is a local copy of its optional part."""
        ...

    def source_notes(self, source: SourceInfo) -> tuple[str, ...]:
        """What a user reads about a fetched source besides its identity."""
        ...

    def check_source(self, fetched: SourceInfo) -> None:
        """Refuse a fetched source whose tree changed since it was unpacked (every build
        checks this too)."""
        ...

    def source_document(self, source: SourceInfo) -> dict[str, Any]:
        """What `engine source --json` prints for it."""
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

    @property
    def honours_response_format(self) -> bool:
        """Whether it constrains a reply to a JSON schema or object (``response_format``);
        where it does not, the front refuses such a request rather than answer free text."""
        ...

    @property
    def replays_reasoning(self) -> bool:
        """Whether it takes back a Responses reasoning item that carries its text (none is
        taken where it does not: the item is dropped)."""
        ...

    @property
    def streams_cap_as_stop(self) -> bool:
        """Whether its chat stream says ``stop`` for a reply cut at the request's
        ``max_tokens`` (the front holds the closing chunk and says ``length`` there)."""
        ...

    @property
    def calibrates_speculation(self) -> bool:
        """Whether the speculation calibration measures its modes and guards what serves
        (the calibration's trials run on this kind)."""
        ...

    @property
    def serves_kv_modes(self) -> bool:
        """Whether it has long-context modes (an exact cache or a KVFlash pool at each KV
        type) for the mode calibration to measure."""
        ...

    @property
    def seats_saved_slot(self) -> bool:
        """Whether its slot can be seated on the client's last prompt before a save (a request
        with no generation, answered from its in-memory checkpoint: run/slots.py)."""
        ...

    @property
    def serves_pflash(self) -> bool:
        """Its builds serve PFlash speculative prefill (and report its fast kernel, BSA)."""
        ...


@dataclass(frozen=True)
class LlamaServerKind:
    name: KindName = "llama-server"
    title: str = "llama-server"
    build_command: str = "lucebox engine build"
    allocates_like_llama_cpp: bool = True
    weighs_its_own_cards: bool = False
    verifies_draft_trees: bool = False
    uses_builtin_chat_templates: bool = False
    source_flags: SourceFlags = SourceFlags(
        "--sdist",
        "use this local copy of the sdist",
        "--index-url",
        "package index (default: PyPI)",
    )

    @property
    def known(self) -> KnownSources[source.SourcePin]:
        return source.known_sources()

    def ensure_source(
        self,
        paths: Paths,
        on_bytes: ByteProgress | None = None,
        *,
        archive: Path | None = None,
        index: str | None = None,
        known: KnownSource[Any] | None = None,
        part_archive: Path | None = None,
    ) -> SourceInfo:
        def report(event: TransferProgress) -> None:
            if on_bytes is not None:
                on_bytes(event.done_bytes)

        pin = known.pin if known is not None else None
        return source.ensure_source(
            paths, index_url=index, sdist=archive, on_progress=report, pin=pin
        )

    def check_source(self, fetched: SourceInfo) -> None:
        source.check_unpacked(fetched)

    def source_notes(self, source: SourceInfo) -> tuple[str, ...]:
        return ()

    def source_document(self, source: SourceInfo) -> dict[str, Any]:
        return {
            "path": str(source.path),
            "origin": source.origin,
            "identity": source.identity,
            "build_number": source.build_number,
        }

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
        return install.build_and_install(paths, source, options, jobs=jobs, on_event=on_event)

    def select(
        self, paths: Paths, probe: GpuProbe, wanted_id: str = "", cpu: CpuInfo | None = None
    ) -> EngineSelection:
        return registry.select_engine(paths, probe, wanted_id, cpu)

    honours_response_format: bool = True
    replays_reasoning: bool = True
    streams_cap_as_stop: bool = False
    calibrates_speculation: bool = True
    serves_kv_modes: bool = False
    seats_saved_slot: bool = True
    serves_pflash: bool = False


@dataclass(frozen=True)
class LuceboxKind:
    name: KindName = "lucebox"
    title: str = "the Lucebox engine"
    build_command: str = "lucebox engine build --engine lucebox"
    allocates_like_llama_cpp: bool = False
    weighs_its_own_cards: bool = True
    verifies_draft_trees: bool = True
    uses_builtin_chat_templates: bool = True
    source_flags: SourceFlags = SourceFlags(
        "--tarball",
        "a local archive of the pinned commit (offline)",
        "--base-url",
        "where GitHub's archives are (default: https://github.com)",
        bsa.OFFLINE_FLAG,
        "a local archive of the pinned Block-Sparse-Attention tree, PFlash's fast kernel (offline)",
    )

    @property
    def known(self) -> KnownSources[lucebox.LuceboxPin]:
        return lucebox.SOURCES

    def ensure_source(
        self,
        paths: Paths,
        on_bytes: ByteProgress | None = None,
        *,
        archive: Path | None = None,
        index: str | None = None,
        known: KnownSource[Any] | None = None,
        part_archive: Path | None = None,
    ) -> SourceInfo:
        """The engine's tree, and Block-Sparse-Attention in it: from ``part_archive``, else
        from GitHub when the engine's tree did not come from a local ``archive`` (a PC given
        one is taken for offline); without it the engine builds without BSA."""
        pin = known.pin if known is not None else self.known.default.pin
        fetched = lucebox.ensure_source(
            paths, tarball=archive, base_url=index, on_progress=on_bytes, pin=pin
        )
        bsa.ensure(
            paths,
            fetched,
            tarball=part_archive,
            base_url=index,
            on_progress=on_bytes,
            online=archive is None,
        )
        return fetched

    def check_source(self, fetched: SourceInfo) -> None:
        lucebox.check_unpacked(fetched)
        bsa.check_unpacked(fetched)

    def source_notes(self, source: SourceInfo) -> tuple[str, ...]:
        return (bsa.check_unpacked(source).detail,)

    def source_document(self, source: SourceInfo) -> dict[str, Any]:
        return {
            "engine": self.name,
            "path": str(source.path),
            "origin": source.origin,
            "identity": source.identity,
            "commit": lucebox.pin_of(source).commit,
            "tree_sha256": lucebox.pin_of(source).tree_sha256,
            "bsa": bsa.check_unpacked(source).present,
        }

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
        selection = luceboxbuild.select(paths, wanted_id, cpu)
        if selection.engine is None:
            return EngineSelection(None, f"not built yet: run `{self.build_command}`")
        return selection

    honours_response_format: bool = False
    replays_reasoning: bool = False
    streams_cap_as_stop: bool = True
    calibrates_speculation: bool = False
    serves_kv_modes: bool = True
    seats_saved_slot: bool = False
    serves_pflash: bool = True


LLAMA_SERVER = LlamaServerKind()
LUCEBOX = LuceboxKind()
KINDS: dict[KindName, EngineKind] = {LLAMA_SERVER.name: LLAMA_SERVER, LUCEBOX.name: LUCEBOX}


def kind(name: KindName) -> EngineKind:
    return KINDS[name]


def built_from(engine: EngineManifest) -> KnownSource[Any] | None:
    """The known source an installed engine was built from; None for a checkout's build, a
    registered or fetched binary, or a source this lucebox does not know."""
    return kind(engine.kind).known.by_identity(engine.source_identity)


def newer_known(engine: EngineManifest) -> KnownSource[Any] | None:
    """The newest known source of the engine's kind when it is newer than the one the engine
    was built from; None when it is that one, or the engine's source is not a known one."""
    table = kind(engine.kind).known
    known = table.by_identity(engine.source_identity)
    if known is None or known is table.newest:
        return None
    return table.newest
