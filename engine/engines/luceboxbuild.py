"""Build ``dflash_server`` (the Lucebox engine) for one CUDA arch, cached like llama.cpp's build.

The configure line is the one measured on the H100 (CUDA 13.0): Release, one numeric arch
(CUDA 13 rejects the source's default list, which starts at sm_60), Block-Sparse-Attention
on only for sm_80 and newer with its pinned source present and checked (:mod:`bsa`), the
all-quant-pairs flash-attention kernels off (a third
of the build time; the engine then serves only symmetric K/V cache types), static ggml so the
installed binary needs no build tree. nlohmann-json comes from the system headers or from a
PyPI wheel that ships them, through a small CMake package file lucebox writes, and FetchContent
is disconnected: configure never reaches out to the network.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import bsa, cputarget, lucebox, toolchain, toolkit
from lucebox.engine.engines.build import (
    BuildCallback,
    BuildChoice,
    BuildError,
    BuildEvent,
    BuildOptions,
    configured_for,
    default_jobs,
    run_logged,
)
from lucebox.engine.engines.install import (
    find_built,
    publish,
    reuse_or_build,
    staging_dir,
    write_manifest,
)
from lucebox.engine.engines.registry import (
    EngineCapabilities,
    EngineManifest,
    EngineSelection,
    cpu_fit,
    list_engines,
    run_engine,
)
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.machine.cpu import CpuInfo, probe_cpu
from lucebox.engine.machine.gpu import GpuProbe

SERVER = "dflash_server"
JSON_REQUIREMENT = (
    "nlohmann-json==3.12.0 "
    "--hash=sha256:5f6132720fb25d0d70bf0742f8397b49a540dcc193e7312a914f6aa49f054810\n"
)
"""The header-only JSON library from PyPI, used when the system has no headers."""
SYSTEM_INCLUDE_DIRS = (Path("/usr/include"), Path("/usr/local/include"))
SYMMETRIC_KV_TYPES = ("f16", "bf16", "q4_0", "q8_0", "tq3_0")
"""K=V pairs that keep a flash-attention kernel with DFLASH27B_FA_ALL_QUANTS=OFF."""
_FLAG = re.compile(r"^\s+(--[a-z][a-z0-9-]*)", re.M)
_KV_TYPES = re.compile(r"--cache-type-k <type>\s+KV cache K type \(([^)]*)\)")
_ARCH = re.compile(r'if \(arch == "([a-z0-9_]+)"\)')
FEATURE_FLAGS = ("--prefill-compression", "--draft-device", "--target-split-mode")
"""Flags its ``--help`` lists that a plan depends on, kept as features without the dashes
(the draft on a second card; tensor parallel, which 62880e20 does not have)."""
HIDDEN_FEATURES = {b"--kvflash": "kvflash", b"DFLASH_SAMPLED_VERIFY": "sampled-verify"}
"""Flags and switches the binary parses but its usage text leaves out."""


def choose_options(
    probe: GpuProbe,
    cuda: toolchain.CudaToolkitInfo,
    *,
    archs: tuple[str, ...] = (),
    host: str | None = None,
    cpu: CpuInfo | None = None,
) -> BuildChoice:
    """One arch: ``--arch`` or the GPU's; no NVIDIA GPU and no ``--arch`` is refused.

    Its vendored ggml compiles CPU code too, for the same baseline as llama-server's build.
    """
    if archs:
        if len(archs) != 1:
            raise UsageError(
                f"the Lucebox engine is built for one CUDA arch at a time, not {','.join(archs)}",
                hint="build once per arch, e.g. --arch 86",
            )
        chosen, why = archs[0], "from --arch"
    else:
        gpu_archs = list(dict.fromkeys(g.cuda_arch for g in probe.gpus if g.cuda_arch))
        if not gpu_archs:
            raise GuardRefusal(
                "the Lucebox engine runs only on NVIDIA GPUs (CUDA), and this machine has none",
                hint="serve with llama-server, or build for a named card with --arch, "
                "e.g. --arch 86 for an RTX 3090",
            )
        chosen, why = gpu_archs[0], "from the GPU's compute capability"
        if len(gpu_archs) > 1:
            why += f" (GPU 0; the others need their own build with --arch: {gpu_archs[1:]})"
    kit = toolkit.choose_toolkit(
        probe, cuda, (chosen,), host=toolkit.host_machine() if host is None else host
    )
    cpu_target = cputarget.choose_target(cpu or probe_cpu()).name
    return BuildChoice(
        BuildOptions("cuda", (chosen,), toolkit=kit.label, webui=False, cpu_target=cpu_target),
        f"CUDA for arch {chosen} ({why}), {kit.reason}, CPU code for {cpu_target}",
    )


def bsa_for(source: SourceInfo, options: BuildOptions) -> bsa.BsaState:
    """Whether this build gets Block-Sparse-Attention: its card is sm_80+ and the source
    holds the pinned BSA tree (hashed again now; a changed one is refused)."""
    (arch,) = options.cuda_archs
    if not bsa.arch_supports(arch):
        return bsa.BsaState(False, f"{bsa.SLOW_FALLBACK} (sm_{arch} is older than sm_80)")
    return bsa.check_unpacked(source)


def configure_argv(
    source: SourceInfo,
    build_dir: Path,
    options: BuildOptions,
    *,
    json_config_dir: Path,
    toolkit_root: Path | None = None,
    with_bsa: bool = False,
) -> list[str]:
    """The cmake configure command (paths other than the source's are left out of the key);
    ``with_bsa`` from :func:`bsa_for`."""
    (arch,) = options.cuda_archs
    argv = [
        "cmake",
        "-S",
        str(lucebox.server_dir(source)),
        "-B",
        str(build_dir),
        f"-DCMAKE_BUILD_TYPE={options.build_type}",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
        f"-DDFLASH27B_ENABLE_BSA={'ON' if with_bsa else 'OFF'}",
        "-DDFLASH27B_FA_ALL_QUANTS=OFF",
        "-DDFLASH27B_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-Dnlohmann_json_DIR={json_config_dir}",
        *cputarget.target(options.cpu_target).cmake_flags,
    ]
    return argv + toolkit.cmake_flags(options.toolkit, toolkit_root)


def build_argv(build_dir: Path, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build_dir), "--target", SERVER, "-j", str(jobs)]


def build_key(source: SourceInfo, options: BuildOptions, *, with_bsa: bool = False) -> str:
    flags = configure_argv(
        source, Path("."), options, json_config_dir=Path("."), with_bsa=with_bsa
    )[5:]
    payload = json.dumps(
        {"engine": "lucebox", "source": source.identity, **asdict(options), "flags": flags},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# --- nlohmann-json ----------------------------------------------------------------------------


def system_json_include() -> Path | None:
    for folder in SYSTEM_INCLUDE_DIRS:
        if (folder / "nlohmann" / "json.hpp").is_file():
            return folder
    return None


def json_config_text(include_dir: Path) -> str:
    """A CMake package file for header-only nlohmann-json found at ``include_dir``."""
    return (
        "# Written by lucebox: nlohmann-json's headers, for find_package(nlohmann_json).\n"
        "if(NOT TARGET nlohmann_json::nlohmann_json)\n"
        "  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)\n"
        "  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES\n"
        f'    INTERFACE_INCLUDE_DIRECTORIES "{include_dir}")\n'
        "endif()\n"
        "set(nlohmann_json_FOUND TRUE)\n"
    )


def ensure_json_headers(paths: Paths, log: Path) -> Path:
    """The include dir holding ``nlohmann/json.hpp``: the system's, else the PyPI wheel's,
    installed into the cache with pip (hash-checked; PIP_FIND_LINKS serves an offline PC)."""
    found = system_json_include()
    if found is not None:
        return found
    folder = paths.cache_dir / "nlohmann-json"
    include = folder / "site" / "nlohmann_json" / "include"
    if (include / "nlohmann" / "json.hpp").is_file():
        return include
    folder.mkdir(parents=True, exist_ok=True)
    requirements = folder / "requirements.txt"
    requirements.write_text(JSON_REQUIREMENT, encoding="utf-8")
    argv = toolkit.pip_install_argv(requirements, folder / "site", None)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, errors="replace")
    with log.open("a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0 or not (include / "nlohmann" / "json.hpp").is_file():
        raise BuildError(
            f"nlohmann-json is neither installed nor could it be fetched from PyPI; log: {log}",
            hint="install it (e.g. `apt install nlohmann-json3-dev`) and build again",
        )
    return include


def write_json_config(build_dir: Path, include_dir: Path) -> Path:
    folder = build_dir / "lucebox-nlohmann-json"
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "nlohmann_jsonConfig.cmake", json_config_text(include_dir))
    return folder


# --- capabilities -----------------------------------------------------------------------------


def parse_help(help_text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The flags and the K cache types ``dflash_server --help`` lists."""
    flags = tuple(dict.fromkeys(_FLAG.findall(help_text)))
    kv = _KV_TYPES.search(help_text)
    kv_types = tuple(t.strip() for t in kv.group(1).split(",") if t.strip()) if kv else ()
    return flags, kv_types


def parse_model_archs(backend_factory_cpp: str) -> tuple[str, ...]:
    """The target architectures the engine dispatches on (``src/common/backend_factory.cpp``)."""
    return tuple(dict.fromkeys(_ARCH.findall(backend_factory_cpp)))


def hidden_features(binary: bytes) -> tuple[str, ...]:
    return tuple(name for needle, name in HIDDEN_FEATURES.items() if needle in binary)


def capabilities_of(
    help_text: str, binary: bytes, source_server_dir: Path | None, *, symmetric_only: bool
) -> EngineCapabilities:
    """What a built dflash_server can do: spec types and KV types from its ``--help``,
    hidden switches from its bytes, model architectures from its source."""
    flags, kv_types = parse_help(help_text)
    if symmetric_only:
        kv_types = tuple(t for t in kv_types if t in SYMMETRIC_KV_TYPES)
    spec_types = tuple(
        name for flag, name in (("--draft", "dflash"), ("--ddtree", "ddtree")) if flag in flags
    )
    features = [f.removeprefix("--") for f in flags if f in FEATURE_FLAGS]
    features += hidden_features(binary)
    if symmetric_only:
        features.append("symmetric-kv-only")
    archs: tuple[str, ...] | None = None
    if source_server_dir is not None:
        factory = source_server_dir / "src" / "common" / "backend_factory.cpp"
        try:
            archs = parse_model_archs(factory.read_text(encoding="utf-8")) or None
        except OSError:
            archs = None
    return EngineCapabilities(spec_types, kv_types, archs, features=tuple(features))


def read_capabilities(
    paths: Paths, server: Path, source_server_dir: Path | None, *, symmetric_only: bool
) -> EngineCapabilities:
    help_text = run_engine(server, "--help", toolkit.driver_stub(paths))
    if "--ddtree" not in help_text:
        raise BuildError(f"{server} --help does not look like dflash_server's:\n{help_text[:400]}")
    return capabilities_of(
        help_text, server.read_bytes(), source_server_dir, symmetric_only=symmetric_only
    )


# --- build and install ------------------------------------------------------------------------


def engine_id_for(source: SourceInfo, options: BuildOptions, key: str) -> str:
    """``lucebox-<commit short>-cuda-sm<arch>-<key>``: builds of two sources sit side by side."""
    pin = lucebox.pin_of(source)
    return f"lucebox-{pin.short}-cuda-sm{options.cuda_archs[0]}-{key[:8]}"


def build_tree(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    *,
    jobs: int | None,
    on_event: BuildCallback | None,
    with_bsa: bool = False,
) -> Path:
    """Configure (once) and build ``dflash_server``; returns the build folder."""
    key = build_key(source, options, with_bsa=with_bsa)
    build_dir = paths.ensure(paths.builds_dir) / key
    if configured_for(build_dir) not in (None, lucebox.server_dir(source).resolve()):
        # The same tree unpacked elsewhere: cmake will not reuse a cache made for another path.
        shutil.rmtree(build_dir)
    build_dir.mkdir(exist_ok=True)
    log = build_dir / "build.log"
    log.write_text(
        f"# lucebox engine build (lucebox) {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        f"# source: {source.identity}\n# options: {asdict(options)}\n",
        encoding="utf-8",
    )
    toolkit_root = None
    if toolkit.is_fetched(options.toolkit):
        toolkit_root = toolkit.ensure_toolkit(paths).root
    json_dir = write_json_config(build_dir, ensure_json_headers(paths, log))
    if not (build_dir / "CMakeCache.txt").is_file() or not (build_dir / "Makefile").is_file():
        argv = configure_argv(
            source,
            build_dir,
            options,
            json_config_dir=json_dir,
            toolkit_root=toolkit_root,
            with_bsa=with_bsa,
        )
        run_logged(argv, log, "configure", on_event)
    run_logged(build_argv(build_dir, jobs or default_jobs()), log, "build", on_event)
    if not (build_dir / SERVER).is_file():
        raise BuildError(f"the build finished without {SERVER}; full log: {log}")
    if toolkit_root is not None:
        toolkit.install_runtime_libs(toolkit_root, build_dir)
    return build_dir


def build_and_install(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    *,
    jobs: int | None = None,
    on_event: BuildCallback | None = None,
) -> tuple[EngineManifest, bool]:
    """Build (or reuse) dflash_server for ``options``; returns it and whether it was cached."""
    with_bsa = bsa_for(source, options)
    key = build_key(source, options, with_bsa=with_bsa.present)
    return reuse_or_build(
        paths,
        on_event,
        lambda: find_built(paths, key),
        lambda: (_build_and_install(paths, source, options, key, with_bsa, jobs, on_event), False),
    )


def manifest_for(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    key: str,
    capabilities: EngineCapabilities,
    binaries: dict[str, str],
    with_bsa: bsa.BsaState,
) -> EngineManifest:
    """The manifest of the build of ``source`` for ``options`` (build key ``key``) installed
    with ``binaries`` (file name -> sha256), which can do ``capabilities``; ``with_bsa``
    says whether PFlash has its fast kernel."""
    engine_id = engine_id_for(source, options, key)
    pin = lucebox.pin_of(source)
    return EngineManifest(
        id=engine_id,
        kind="lucebox",
        backend="cuda",
        cuda_archs=options.cuda_archs,
        version=f"luce-dflash {pin.short} ({pin.date})",
        server_path=str(paths.engines_dir / engine_id / "bin" / SERVER),
        origin="build",
        capabilities=capabilities,
        source_identity=source.identity,
        build_key=key,
        options={
            **asdict(options),
            "bsa": with_bsa.present,
            "bsa_note": with_bsa.detail,
            "fa_all_quants": False,
        },
        installed_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        binaries=binaries,
        toolkit=options.toolkit or None,
    )


def _build_and_install(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    key: str,
    with_bsa: bsa.BsaState,
    jobs: int | None,
    on_event: BuildCallback | None,
) -> EngineManifest:
    lucebox.check_unpacked(source)
    build_dir = build_tree(
        paths, source, options, jobs=jobs, on_event=on_event, with_bsa=with_bsa.present
    )
    if on_event is not None:
        on_event(BuildEvent("install", 100, "installing the engine"))
    engine_id = engine_id_for(source, options, key)
    staging = staging_dir(paths, engine_id)
    try:
        bin_dir = staging / "bin"
        bin_dir.mkdir(parents=True)
        hashes = {}
        for item in [build_dir / SERVER, *build_dir.glob("lib*.so*")]:
            shutil.copy2(item, bin_dir / item.name)
            hashes[item.name] = sha256_file(item)
        status_page = build_dir / "share" / "status.html"
        if status_page.is_file():
            (bin_dir / "share").mkdir()
            shutil.copy2(status_page, bin_dir / "share" / "status.html")
        capabilities = read_capabilities(
            paths, bin_dir / SERVER, lucebox.server_dir(source), symmetric_only=True
        )
        manifest = manifest_for(paths, source, options, key, capabilities, hashes, with_bsa)
        write_manifest(staging, manifest)
        publish(paths, engine_id, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def select(paths: Paths, wanted_id: str = "", cpu: CpuInfo | None = None) -> EngineSelection:
    """The installed Lucebox engine a launch uses, and why: the one ``engine.id`` names (this
    CPU may not run it: doctor says so), else the newest build of the default known source,
    else the newest build this CPU runs; no engine (reason "") when none is installed."""
    engines = [e for e in list_engines(paths) if e.kind == "lucebox"]
    named = [e for e in engines if wanted_id and e.id == wanted_id]
    if named:
        return EngineSelection(named[0], f"engine.id = {wanted_id} in config.toml")
    cpu = cpu or probe_cpu()
    runs = [e for e in engines if cpu_fit(paths, e, cpu).runs is not False]
    default = lucebox.SOURCES.default
    of_default = [e for e in runs if e.source_identity == default.identity]
    if of_default:
        chosen = max(of_default, key=lambda e: e.installed_at)
        return EngineSelection(chosen, f"built from the default source {default.version}")
    if runs:
        chosen = max(runs, key=lambda e: e.installed_at)
        why = f"the newest this CPU runs; none from the default source {default.version}"
        return EngineSelection(chosen, why)
    return EngineSelection(None, "")


def installed(paths: Paths, cpu: CpuInfo | None = None) -> EngineManifest | None:
    """The Lucebox engine a launch uses when ``engine.id`` names none (:func:`select`)."""
    return select(paths, cpu=cpu).engine
