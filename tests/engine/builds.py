"""Engine builds installed the way a build publishes them, without compiling: manifests made by
the install's own constructors (build keys, engine ids, luceboxbuild.manifest_for), beside a
stand-in server binary."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path

from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import build, install, lucebox, luceboxbuild, source
from lucebox.engine.engines.build import BuildOptions
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest
from lucebox.engine.engines.source import SourceInfo

LUCEBOX_OPTIONS = BuildOptions(
    "cuda", ("90",), toolkit="system CUDA 13.0", webui=False, cpu_target="generic"
)
LLAMA_OPTIONS = BuildOptions("cpu", webui=False, cpu_target="generic")
CAPABILITIES = EngineCapabilities(("dflash", "ddtree"), ("f16", "q8_0"), ("qwen35",))


def put_installed(paths: Paths, manifest: EngineManifest, installed_at: str) -> EngineManifest:
    """Put an engine folder in place the way a build publishes it (a stand-in binary)."""
    manifest = dataclasses.replace(manifest, installed_at=installed_at)
    staging = install.staging_dir(paths, manifest.id)
    server = Path(manifest.server_path)
    (staging / "bin").mkdir(parents=True)
    (staging / "bin" / server.name).write_bytes(b"")
    install.write_manifest(staging, manifest)
    install.publish(paths, manifest.id, staging)
    return manifest


def lucebox_build(
    paths: Paths, version: str, installed_at: str, *, bsa_source: Path | None = None
) -> EngineManifest:
    """A build of the known source ``version``; with Block-Sparse-Attention when
    ``bsa_source`` is an engine source holding the pinned BSA tree."""
    known = lucebox.SOURCES.by_version(version)
    assert known is not None
    src = SourceInfo(bsa_source or Path("/deps/lucebox"), "pin", known.identity, None)
    with_bsa = luceboxbuild.bsa_for(src, LUCEBOX_OPTIONS)
    key = luceboxbuild.build_key(src, LUCEBOX_OPTIONS, with_bsa=with_bsa.present)
    binaries = {luceboxbuild.SERVER: "0" * 64}
    manifest = luceboxbuild.manifest_for(
        paths, src, LUCEBOX_OPTIONS, key, CAPABILITIES, binaries, with_bsa
    )
    return put_installed(paths, manifest, installed_at)


def llama_build(paths: Paths, version: str, installed_at: str) -> EngineManifest:
    known = source.known_sources().by_version(version)
    assert known is not None
    src = SourceInfo(Path("/deps/llama.cpp"), "pin", known.identity, known.pin.build_number)
    key = build.build_key(src, LLAMA_OPTIONS)
    engine_id = install.engine_id_for(src, LLAMA_OPTIONS, key)
    manifest = EngineManifest(
        id=engine_id,
        backend="cpu",
        cuda_archs=(),
        version=f"0.6.0-dev (build {known.pin.build_number})",
        server_path=str(paths.engines_dir / engine_id / "bin" / "llama-server"),
        origin="build",
        capabilities=EngineCapabilities(("draft-simple",), ("f16",), ("llama",)),
        source_identity=src.identity,
        build_key=key,
        options=asdict(LLAMA_OPTIONS),
        binaries={"llama-server": "0" * 64},
    )
    return put_installed(paths, manifest, installed_at)
