"""Installed engines: their manifests, what each can do, and which one lucebox uses.

An engine is a folder in ``<data>/engines/<id>/`` with ``bin/llama-server`` (and friends) and
``manifest.json``. What an engine supports is read from the engine itself (``--help`` lists
speculative and KV cache types, ``--version`` its version) and from its source
(``src/llama-arch.cpp`` lists model architectures), never typed by hand.

Installing one (a build published whole, ``engine add``, ``engine fetch``) is
:mod:`lucebox.engine.engines.install`; each kind's build is its own module (build,
luceboxbuild).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from lucebox.engine.core.errors import EngineSetupError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import cputarget, toolkit
from lucebox.engine.engines.build import (
    BuildOptions,
)
from lucebox.engine.engines.kindname import KindName as KindName
from lucebox.engine.engines.source import (
    default_source_dir,
    load_pin,
    read_source,
)
from lucebox.engine.machine.cpu import CpuInfo, probe_cpu
from lucebox.engine.machine.gpu import GpuProbe
from lucebox.engine.models.modelfacts import read_swa_patterns

MANIFEST_NAME = "manifest.json"
VERSION_TIMEOUT_S = 30.0
Origin = Literal["build", "fetch", "add"]
"""The engine kinds lucebox builds and runs (:mod:`lucebox.engine.engines.kinds`)."""


class EngineError(EngineSetupError):
    """An engine cannot be installed, registered or found."""


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do, as read from the engine and its source."""

    spec_types: tuple[str, ...]
    kv_cache_types: tuple[str, ...]
    model_archs: tuple[str, ...] | None
    """None when unknown (a registered binary whose source we do not have)."""
    swa_patterns: dict[str, tuple[int, bool]] = field(default_factory=dict)
    """Default sliding-window pattern per architecture, from the engine source."""
    features: tuple[str, ...] = ()
    """Switches beyond speculation and KV types (the Lucebox engine's kvflash, ...)."""


@dataclass(frozen=True)
class EngineManifest:
    """One installed engine (``manifest.json``)."""

    id: str
    backend: Literal["cpu", "cuda"]
    cuda_archs: tuple[str, ...]
    version: str
    server_path: str
    origin: Origin
    capabilities: EngineCapabilities
    source_identity: str | None = None
    build_key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    installed_at: str = ""
    binaries: dict[str, str] = field(default_factory=dict)
    """File name -> sha256 of each binary lucebox installed."""
    toolkit: str | None = None
    """The CUDA toolkit that built it ("PyPI CUDA 13.0 (pin ...)"); None when not known."""
    webui: bool = False
    """The server embeds the web UI (read from the binary)."""
    webui_detail: str = ""
    """How the UI was built, or why the engine has none."""
    rpc: bool = False
    """ggml-rpc-server sits next to the server: the engine can serve as an RPC peer."""
    kind: KindName = "llama-server"
    """Which server it is: llama.cpp's llama-server or the Lucebox engine (dflash_server)."""

    @property
    def cpu_target(self) -> str | None:
        """The CPU baseline it was built for; None for a build lucebox did not make."""
        if self.origin != "build":
            return None
        return str(self.options.get("cpu_target") or cputarget.NATIVE)

    def build_options(self, cpu_target: str) -> BuildOptions:
        """The options lucebox built it with, for the CPU baseline ``cpu_target``: the same
        engine version built again for a lower baseline."""
        options = self.options
        return BuildOptions(
            self.backend,
            tuple(options.get("cuda_archs") or ()),
            str(options.get("build_type") or "Release"),
            str(options.get("toolkit") or ""),
            bool(options.get("webui", True)),
            cpu_target,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        caps = data.pop("capabilities")
        data["cuda_archs"] = list(self.cuda_archs)
        data.update(
            spec_types=list(caps["spec_types"]),
            kv_cache_types=list(caps["kv_cache_types"]),
            model_archs=list(caps["model_archs"]) if caps["model_archs"] is not None else None,
            swa_patterns={k: list(v) for k, v in caps["swa_patterns"].items()},
            features=list(caps["features"]),
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineManifest:
        archs = data.get("model_archs")
        return cls(
            id=data["id"],
            backend=data["backend"],
            cuda_archs=tuple(data.get("cuda_archs") or ()),
            version=data["version"],
            server_path=data["server_path"],
            origin=data["origin"],
            capabilities=EngineCapabilities(
                spec_types=tuple(data.get("spec_types") or ()),
                kv_cache_types=tuple(data.get("kv_cache_types") or ()),
                model_archs=tuple(archs) if archs is not None else None,
                swa_patterns={
                    k: (int(v[0]), bool(v[1])) for k, v in (data.get("swa_patterns") or {}).items()
                },
                features=tuple(data.get("features") or ()),
            ),
            source_identity=data.get("source_identity"),
            build_key=data.get("build_key"),
            options=dict(data.get("options") or {}),
            installed_at=data.get("installed_at", ""),
            binaries=dict(data.get("binaries") or {}),
            toolkit=data.get("toolkit"),
            webui=bool(data.get("webui", False)),
            webui_detail=str(data.get("webui_detail", "")),
            rpc=bool(data.get("rpc", False)),
            kind=data.get("kind", "llama-server"),
        )


@dataclass(frozen=True)
class EngineSelection:
    engine: EngineManifest | None
    reason: str


# --- reading capabilities ---------------------------------------------------------------------


def parse_help_capabilities(help_text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Speculative types and KV cache types from ``llama-server --help``."""
    spec = re.search(r"--spec-type\s+([a-z0-9][a-z0-9,\-]*)", help_text)
    spec_types = tuple(t for t in spec.group(1).split(",") if t and t != "none") if spec else ()
    kv = re.search(r"--cache-type-k\s+TYPE.*?allowed values:\s*([^\n]+)", help_text, re.S)
    kv_types = tuple(t.strip() for t in kv.group(1).split(",") if t.strip()) if kv else ()
    return spec_types, kv_types


def parse_model_archs(llama_arch_cpp: str) -> tuple[str, ...]:
    """Architecture names from the source's ``LLM_ARCH_NAMES`` table."""
    table = re.search(r"LLM_ARCH_NAMES\s*=\s*\{(.*?)\n\};", llama_arch_cpp, re.S)
    if table is None:
        return ()
    names = re.findall(r"\{\s*LLM_ARCH_(\w+)\s*,\s*\"([^\"]+)\"\s*\}", table.group(1))
    return tuple(name for key, name in names if key != "UNKNOWN")


def read_model_archs(source_dir: Path) -> tuple[str, ...] | None:
    arch_file = source_dir / "src" / "llama-arch.cpp"
    try:
        archs = parse_model_archs(arch_file.read_text(encoding="utf-8"))
    except OSError:
        return None
    return archs or None


NO_DRIVER = "libcuda.so.1: cannot open shared object file"
"""The loader's words when a CUDA engine runs where the NVIDIA driver is not installed."""


def run_engine(server: Path, flag: str, driver_stub: Path | None) -> str:
    output = _run(server, flag, os.environ)
    if NO_DRIVER not in output:
        return output
    if driver_stub is not None:
        # A CUDA engine on a machine without the NVIDIA driver: the toolkit's stub stands in
        # for libcuda.so.1 (its calls fail, so the engine finds no device and answers).
        with tempfile.TemporaryDirectory(prefix="lucebox-driver-stub-") as folder:
            (Path(folder) / "libcuda.so.1").symlink_to(driver_stub.resolve())
            paths = [folder, os.environ.get("LD_LIBRARY_PATH")]
            env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, paths))}
            output = _run(server, flag, env)
    if NO_DRIVER in output:
        raise EngineError(
            f"{server} is a CUDA build and this machine has no NVIDIA driver (libcuda.so.1)",
            hint="install the NVIDIA driver, or a CUDA toolkit (its driver stub lets lucebox "
            "read the engine)",
        )
    return output


def _run(server: Path, flag: str, env: Mapping[str, str]) -> str:
    try:
        done = subprocess.run(
            [str(server), flag],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
            errors="replace",
            env=env,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise EngineError(f"{server} does not run: {exc}") from exc
    return done.stdout + done.stderr


def read_version(server: Path, driver_stub: Path | None) -> str:
    """``version: 0.6.0-dev (build 11434, commit unknown)`` -> ``0.6.0-dev (build 11434, ...)``.

    ``driver_stub`` lets a CUDA engine answer on a machine without the NVIDIA driver."""
    output = run_engine(server, "--version", driver_stub)
    match = re.search(r"version:\s*(.+)", output)
    if match is None:
        raise EngineError(
            f"{server} did not print a llama.cpp version",
            hint="point to a llama-server binary from llama.cpp",
        )
    return match.group(1).strip()


def read_capabilities(
    server: Path, source_dir: Path | None, driver_stub: Path | None
) -> EngineCapabilities:
    spec_types, kv_types = parse_help_capabilities(run_engine(server, "--help", driver_stub))
    archs = read_model_archs(source_dir) if source_dir is not None else None
    patterns = read_swa_patterns(source_dir) if source_dir is not None else {}
    return EngineCapabilities(spec_types, kv_types, archs, patterns)


def read_engine(
    paths: Paths, server: Path, source_dir: Path | None
) -> tuple[str, EngineCapabilities]:
    """A llama-server's version and capabilities, read by running it (on a machine without the
    NVIDIA driver too, through a CUDA toolkit's driver stub)."""
    stub = toolkit.driver_stub(paths)
    return read_version(server, stub), read_capabilities(server, source_dir, stub)


# --- the installed set ------------------------------------------------------------------------


ILLEGAL_INSTRUCTION_MARK = "died-of-illegal-instruction"
"""Written into a build's folder when it died of an illegal instruction on this PC."""


def mark_died_of_illegal_instruction(paths: Paths, engine_id: str) -> None:
    """Remember that this build died of an illegal instruction here, so that no later choice
    picks it again (a CPU or a VM can report a feature it does not run)."""
    folder = paths.engines_dir / engine_id
    if folder.is_dir():
        (folder / ILLEGAL_INSTRUCTION_MARK).write_text("", encoding="utf-8")


def cpu_fit(paths: Paths, engine: EngineManifest, cpu: CpuInfo) -> cputarget.CpuFit:
    """Whether ``engine`` runs on this CPU: its baseline's fit, unless it already died of an
    illegal instruction on this PC."""
    fit = cputarget.fit(engine.cpu_target, cpu)
    if (paths.engines_dir / engine.id / ILLEGAL_INSTRUCTION_MARK).is_file():
        return replace(
            fit,
            runs=False,
            detail="it died of an illegal instruction on this PC (the CPU or its VM lacks a "
            "feature it reports), so lucebox uses a build for a lower baseline",
        )
    return fit


def list_engines(paths: Paths) -> list[EngineManifest]:
    """Every installed engine whose manifest reads and whose server binary exists."""
    engines: list[EngineManifest] = []
    if not paths.engines_dir.is_dir():
        return engines
    for manifest_file in sorted(paths.engines_dir.glob(f"*/{MANIFEST_NAME}")):
        try:
            manifest = EngineManifest.from_json(json.loads(manifest_file.read_text("utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-removed or foreign folder is not an engine
        if Path(manifest.server_path).is_file():
            engines.append(manifest)
    return engines


def select_engine(
    paths: Paths, probe: GpuProbe, wanted_id: str = "", host_cpu: CpuInfo | None = None
) -> EngineSelection:
    """The llama-server ``lucebox up`` would use, and why (the planner chooses the kind).

    A build this CPU cannot run (:func:`cpu_fit`) is never chosen by itself; one named
    by ``engine.id`` still is, and ``doctor`` says what is wrong with it. An ``engine.id`` that
    names another kind's build (the Lucebox engine's) leaves this choice to the rules below.
    """
    installed = list_engines(paths)
    engines = [e for e in installed if e.kind == "llama-server"]
    if wanted_id in {e.id for e in installed if e.kind != "llama-server"}:
        wanted_id = ""
    if wanted_id:
        for engine in engines:
            if engine.id == wanted_id:
                return EngineSelection(engine, f"engine.id = {wanted_id} in config.toml")
        return EngineSelection(None, f"engine {wanted_id} from config.toml is not installed")
    host_cpu = host_cpu or probe_cpu()
    unfit = [e for e in engines if cpu_fit(paths, e, host_cpu).runs is False]
    engines = [e for e in engines if e not in unfit]
    if not engines:
        if unfit:
            why = cpu_fit(paths, unfit[0], host_cpu).detail
            return EngineSelection(
                None, f"{unfit[0].id} cannot run on this CPU ({why}): run `lucebox engine build`"
            )
        return EngineSelection(None, "no engine installed: run `lucebox engine build`")
    gpu_archs = {g.cuda_arch for g in probe.gpus if g.cuda_arch}
    if gpu_archs:
        matching = [e for e in engines if e.backend == "cuda" and gpu_archs & set(e.cuda_archs)]
        if matching:
            chosen = max(matching, key=lambda e: e.installed_at)
            return EngineSelection(
                chosen, f"CUDA engine built for the GPU's arch {chosen.cuda_archs}"
            )
    cpu = [e for e in engines if e.backend == "cpu"]
    if cpu:
        chosen = max(cpu, key=lambda e: e.installed_at)
        why = "no CUDA engine for this GPU" if gpu_archs else "no NVIDIA GPU"
        return EngineSelection(chosen, f"CPU engine ({why})")
    chosen = max(engines, key=lambda e: e.installed_at)
    return EngineSelection(chosen, "the newest installed engine")


def known_model_archs(paths: Paths, selection: EngineSelection) -> tuple[str, ...] | None:
    """Architectures the engine in use can load: from its manifest, else the pinned source."""
    if selection.engine is not None and selection.engine.capabilities.model_archs:
        return selection.engine.capabilities.model_archs
    source_dir = default_source_dir(paths)
    if read_source(source_dir, load_pin()) is None:
        return None
    return read_model_archs(source_dir)
