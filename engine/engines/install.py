"""Installing engines: a staged build published whole, a cached build reused, one build at a
time; and llama-server's own install paths: build, ``engine add`` of a binary the user has,
``engine fetch`` of a prebuilt tarball.
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
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Literal

import httpx

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.download import download_file
from lucebox.engine.core.downloadprogress import ProgressCallback
from lucebox.engine.core.errors import TransferError, UsageError
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import nodejs, webui
from lucebox.engine.engines.build import (
    TARGETS,
    BuildCallback,
    BuildEvent,
    BuildOptions,
    build_engine_tree,
    build_key,
)
from lucebox.engine.engines.registry import (
    MANIFEST_NAME,
    EngineError,
    EngineManifest,
    list_engines,
    read_engine,
)
from lucebox.engine.engines.source import (
    SourceInfo,
    check_unpacked,
)
from lucebox.engine.engines.uibundle import BUILD_UI_FOLDER, UI_FOLDER
from lucebox.engine.models.modelfacts import read_swa_patterns


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

    def complete_build() -> EngineManifest | None:
        cached = _find_cached(paths, source, build_key(source, options))
        return cached if cached is not None and (cached.webui or not options.webui) else None

    return reuse_or_build(
        paths,
        on_event,
        complete_build,
        lambda: _build_and_install(paths, source, options, jobs=jobs, on_event=on_event),
    )


def reuse_or_build(
    paths: Paths,
    on_event: BuildCallback | None,
    find: Callable[[], EngineManifest | None],
    build: Callable[[], tuple[EngineManifest, bool]],
) -> tuple[EngineManifest, bool]:
    """The build ``find`` finds, else ``build``'s, one build at a time: every kind's
    build_and_install. ``find`` is asked again once the lock is held, for the engine a
    build this one waited for installed."""
    cached = find()
    if cached is None:
        with one_build_at_a_time(paths, on_event):
            cached = find()
            if cached is None:
                return build()
    return reuse_built(cached, on_event)


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
        _install_ui(bin_dir.parent / BUILD_UI_FOLDER, staging / UI_FOLDER)
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


def _install_ui(built: Path, installed: Path) -> None:
    """The built chat page beside the binaries: a front serves it for an engine without one
    (the build folder is a cache, and may be gone)."""
    if (built / "index.html").is_file():
        shutil.copytree(built, installed)


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
