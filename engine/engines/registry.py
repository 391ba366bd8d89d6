"""Installed engines: their manifests, what each can do, and which one lucebox uses.

An engine is a folder in ``<data>/engines/<id>/`` with ``bin/llama-server`` (and friends) and
``manifest.json``. What an engine supports is read from the engine itself (``--help`` lists
speculative and KV cache types, ``--version`` its version) and from its source
(``src/llama-arch.cpp`` lists model architectures), never typed by hand.

It stays one module past our usual size: listing, selecting and installing engines share the
manifest and its lock; each engine kind's build lives in its own module (build, luceboxbuild).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.download import download_file
from lucebox.engine.core.downloadprogress import ProgressCallback
from lucebox.engine.core.errors import EngineSetupError, TransferError, UsageError
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import cputarget, nodejs, toolkit, webui
from lucebox.engine.engines.build import (
    TARGETS,
    BuildCallback,
    BuildEvent,
    BuildOptions,
    build_engine_tree,
    build_key,
)
from lucebox.engine.engines.source import (
    SourceInfo,
    check_unpacked,
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
KindName = Literal["llama-server", "lucebox"]
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

    A build this CPU cannot run (:func:`cputarget.fit`) is never chosen by itself; one named
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
    unfit = [e for e in engines if cputarget.fit(e.cpu_target, host_cpu).runs is False]
    engines = [e for e in engines if e not in unfit]
    if not engines:
        if unfit:
            why = cputarget.fit(unfit[0].cpu_target, host_cpu).detail
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


def write_manifest(folder: Path, manifest: EngineManifest) -> None:
    write_text_atomic(folder / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=2))


def _install_binaries(bin_src: Path, staging_bin: Path) -> dict[str, str]:
    staging_bin.mkdir(parents=True)
    hashes = {}
    for item in sorted(bin_src.iterdir()):
        is_exe = item.is_file() and os.access(item, os.X_OK)
        if is_exe or item.suffix == ".so" or ".so." in item.name:
            shutil.copy2(item, staging_bin / item.name)
            hashes[item.name] = sha256_file(item)
    return hashes


def publish(paths: Paths, engine_id: str, staging: Path) -> Path:
    """Move a fully written engine folder into place (replacing an older one whole)."""
    final = paths.engines_dir / engine_id
    old = paths.engines_dir / f".{engine_id}.old-{os.getpid()}"
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def staging_dir(paths: Paths, engine_id: str) -> Path:
    staging = paths.ensure(paths.engines_dir) / f".{engine_id}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def engine_id_for(source: SourceInfo, options: BuildOptions, key: str) -> str:
    version = f"b{source.build_number}" if source.build_number else "src"
    arch = f"-sm{'_'.join(options.cuda_archs)}" if options.backend == "cuda" else ""
    return f"llama.cpp-{version}-{options.backend}{arch}-{key[:8]}"


def find_built(paths: Paths, key: str) -> EngineManifest | None:
    """An installed engine from the same source and options whose binaries are intact."""
    for engine in list_engines(paths):
        if engine.build_key != key:
            continue
        folder = Path(engine.server_path).parent
        if all((folder / name).is_file() for name in engine.binaries):
            return engine
    return None


def _find_cached(paths: Paths, source: SourceInfo, key: str) -> EngineManifest | None:
    cached = find_built(paths, key)
    if cached is not None and not cached.capabilities.swa_patterns:
        # Built by a lucebox that did not record the patterns yet: read them now.
        patterns = read_swa_patterns(source.path)
        if patterns:
            caps = dataclasses.replace(cached.capabilities, swa_patterns=patterns)
            cached = dataclasses.replace(cached, capabilities=caps)
            write_manifest(Path(cached.server_path).parent.parent, cached)
    return cached


def reuse_built(
    cached: EngineManifest, on_event: BuildCallback | None
) -> tuple[EngineManifest, bool]:
    """An engine already built for these options: said so, and returned as cached."""
    if on_event is not None:
        on_event(BuildEvent("cached", 100, f"{cached.id} is already built"))
    return cached, True


def build_and_install(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    *,
    jobs: int | None = None,
    on_event: BuildCallback | None = None,
) -> tuple[EngineManifest, bool]:
    """Build (or reuse) the engine for ``options``; returns it and whether it was cached.

    The web UI needs node and npm: without a usable node the engine is built without it
    (``webui_detail`` says why). An engine whose UI build failed before (npm unreachable)
    is rebuilt in its cached build folder, which redoes only the UI and the link.
    """
    cached = _find_cached(paths, source, build_key(source, options))
    if cached is not None and (cached.webui or not options.webui):
        return reuse_built(cached, on_event)  # no need to wait behind a build of another engine
    with one_build_at_a_time(paths, on_event):
        return _build_and_install(paths, source, options, jobs=jobs, on_event=on_event)


@contextlib.contextmanager
def one_build_at_a_time(paths: Paths, on_event: BuildCallback | None) -> Iterator[None]:
    """Builds in one LUCEBOX_HOME share a cache folder per key: a second build (another
    terminal, a test run) waits for the first and then finds its engine instead of
    configuring over a half-built tree."""
    with (paths.ensure(paths.builds_dir) / ".lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_event is not None:
                on_event(BuildEvent("wait", None, "waiting for another build of the engine"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_and_install(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    *,
    jobs: int | None,
    on_event: BuildCallback | None,
) -> tuple[EngineManifest, bool]:
    cached = _find_cached(paths, source, build_key(source, options))
    if cached is not None and (cached.webui or not options.webui):
        return reuse_built(cached, on_event)
    node = nodejs.ensure_node(paths) if options.webui else None
    if node is not None and not node.usable:
        if cached is not None:
            return reuse_built(cached, on_event)
        options = dataclasses.replace(options, webui=False)
        without_ui = _find_cached(paths, source, build_key(source, options))
        if without_ui is not None:
            return reuse_built(without_ui, on_event)
    key = build_key(source, options)
    check_unpacked(source)
    bin_dir = build_engine_tree(
        paths,
        source,
        options,
        jobs=jobs,
        on_event=on_event,
        env=node.build_env() if node is not None and node.usable else None,
    )
    if on_event is not None:
        on_event(BuildEvent("install", 100, "installing the engine"))
    engine_id = engine_id_for(source, options, key)
    staging = staging_dir(paths, engine_id)
    try:
        hashes = _install_binaries(bin_dir, staging / "bin")
        server = staging / "bin" / "llama-server"
        version, capabilities = read_engine(paths, server, source.path)
        has_ui = webui.has_webui(server)
        manifest = EngineManifest(
            id=engine_id,
            backend=options.backend,
            cuda_archs=options.cuda_archs,
            version=version,
            server_path=str(paths.engines_dir / engine_id / "bin" / "llama-server"),
            origin="build",
            capabilities=capabilities,
            source_identity=source.identity,
            build_key=key,
            options=asdict(options),
            installed_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
            binaries=hashes,
            toolkit=options.toolkit or None,
            webui=has_ui,
            webui_detail=_webui_detail(has_ui, node, bin_dir.parent / "build.log"),
            rpc="ggml-rpc-server" in hashes,
        )
        write_manifest(staging, manifest)
        publish(paths, engine_id, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest, False


def _webui_detail(has_ui: bool, node: nodejs.NodeInfo | None, build_log: Path) -> str:
    if node is None:
        return "not asked for"
    if not node.usable:
        return node.reason
    if has_ui:
        return f"built from the engine source with {node.reason}"
    try:
        log_text = build_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        log_text = ""
    return webui.why_no_webui(log_text)


def add_engine(paths: Paths, server: Path, source_dir: Path | None = None) -> EngineManifest:
    """Register a llama-server the user already has, in place (nothing is copied)."""
    server = server.expanduser().absolute()
    if not server.is_file():
        raise UsageError(f"{server} does not exist", hint="give the path of a llama-server binary")
    if not os.access(server, os.X_OK):
        raise UsageError(f"{server} is not executable", hint=f"chmod +x {server}")
    version, caps = read_engine(paths, server, source_dir)
    if not caps.spec_types and not caps.kv_cache_types:
        raise EngineError(
            f"{server} runs but its --help does not look like llama-server's",
            hint="point to the llama-server binary, not llama-cli or another tool",
        )
    backend: Literal["cpu", "cuda"] = "cuda" if _links_cuda(server) else "cpu"
    slug = re.sub(r"[^a-z0-9.]+", "-", version.lower()).strip("-")[:40]
    engine_id = f"added-{slug}-{backend}"
    manifest = EngineManifest(
        id=engine_id,
        backend=backend,
        cuda_archs=(),
        version=version,
        server_path=str(server),
        origin="add",
        capabilities=caps,
        installed_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        webui=webui.has_webui(server),
        rpc=(server.parent / "ggml-rpc-server").is_file(),
    )
    staging = staging_dir(paths, engine_id)
    try:
        staging.mkdir()
        write_manifest(staging, manifest)
        publish(paths, engine_id, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _links_cuda(server: Path) -> bool:
    siblings = list(server.parent.glob("libggml-cuda*"))
    if siblings:
        return True
    try:
        with server.open("rb") as handle:
            return b"ggml_cuda_init" in handle.read()
    except OSError:
        return False


def fetch_engine(
    paths: Paths,
    url: str,
    sha256: str,
    *,
    on_progress: ProgressCallback | None = None,
) -> EngineManifest:
    """Install a prebuilt engine tarball (``bin/llama-server`` inside) checked by sha256."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise UsageError(f"'{sha256}' is not a sha256", hint="give the 64 hex digits")
    name = Path(httpx.URL(url).path).name or "engine.tar.gz"
    downloads = paths.ensure(paths.downloads_dir)
    try:
        archive = download_file(url, downloads / name, sha256=sha256, on_progress=on_progress)
    except TransferError as exc:
        raise EngineError(exc.message, hint=exc.hint) from exc
    staging = staging_dir(paths, "fetched")
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                tar.extractall(staging, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise EngineError(f"{url} is not a readable tarball: {exc}") from exc
        servers = sorted(staging.rglob("llama-server"))
        if not servers:
            raise EngineError(f"{url} holds no llama-server", hint="check the tarball")
        bin_dir = servers[0].parent
        for tool in TARGETS:
            target = bin_dir / tool
            if target.is_file():
                target.chmod(target.stat().st_mode | stat.S_IXUSR)
        version, caps = read_engine(paths, servers[0], None)
        backend: Literal["cpu", "cuda"] = "cuda" if _links_cuda(servers[0]) else "cpu"
        engine_id = f"fetched-{sha256[:12]}-{backend}"
        relative = servers[0].relative_to(staging)
        manifest = EngineManifest(
            id=engine_id,
            backend=backend,
            cuda_archs=(),
            version=version,
            server_path=str(paths.engines_dir / engine_id / relative),
            origin="fetch",
            capabilities=caps,
            options={"url": url, "sha256": sha256},
            installed_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
            binaries={p.name: sha256_file(p) for p in bin_dir.iterdir() if p.is_file()},
            webui=webui.has_webui(servers[0]),
            rpc=(bin_dir / "ggml-rpc-server").is_file(),
        )
        write_manifest(staging, manifest)
        publish(paths, engine_id, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink(missing_ok=True)
    return manifest


def known_model_archs(paths: Paths, selection: EngineSelection) -> tuple[str, ...] | None:
    """Architectures the engine in use can load: from its manifest, else the pinned source."""
    if selection.engine is not None and selection.engine.capabilities.model_archs:
        return selection.engine.capabilities.model_archs
    source_dir = default_source_dir(paths)
    if read_source(source_dir, load_pin()) is None:
        return None
    return read_model_archs(source_dir)
