"""Which CUDA toolkit builds the CUDA engine, and fetching one from PyPI when the machine has none.

A system toolkit (nvcc) that is new enough for the card and not newer than the driver is
used as it is. Otherwise lucebox installs NVIDIA's CUDA 13.0 wheels (pinned by version and
hash in ``cuda-toolkit.txt``) into its cache with ``pip install --require-hashes --target`` and
completes them with what the wheels leave out: the unversioned library links and the ``lib64``
folder that cmake and nvcc look for, and a link-time stub of the driver library (``libcuda.so``)
built from the wheels' own ``cuda.h``. The ``-cu12`` wheels carry ptxas and libnvvm but no nvcc,
so a driver without CUDA 13 support, or a card CUDA 13 no longer builds for, cannot be served
this way: the choice then refuses and names what is needed.

Fetching, verifying and probing the toolkit share the pinned wheel set, so they stay together.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import EngineSetupError, GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import toolchain
from lucebox.engine.engines.toolchain import CudaToolkitInfo, version_tuple
from lucebox.engine.machine.gpu import GpuProbe

REQUIREMENTS_NAME = "cuda-toolkit.txt"
FETCHED_CUDA_VERSION = "13.0"
FETCHED_ARCHS = ("75", "80", "86", "87", "88", "89", "90", "100", "103", "110", "120", "121")
"""What the pinned nvcc lists in ``--list-gpu-arch``: Turing (RTX 20xx) and newer."""
MIN_DRIVER_CUDA = (13, 0)
MIN_DRIVER_RELEASE = "580"
"""The first Linux driver branch that supports CUDA 13.0."""
SYSTEM_MIN_CUDA = (11, 7)
"""The oldest toolkit ggml's CUDA backend builds with."""
FETCHED_HOSTS = ("x86_64", "aarch64")
DOWNLOAD_BYTES = {"x86_64": 527_617_427, "aarch64": 640_056_515}
"""Sum of the pinned wheels' sizes per host (from the package index)."""
RUNTIME_LIBS = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")
"""What a built engine loads at run time besides the driver; installed next to it."""
MARKER_NAME = ".lucebox-toolkit.json"
FETCHED_PREFIX = "PyPI CUDA"
_DOWNLOADING = re.compile(r"(?:Downloading|Using cached|Processing) (?:\S*/)?(\S+?\.whl)")
_DRIVER_API = re.compile(r"^\s*CUresult\s+(cu\w+)\s*\(", re.M)


class ToolkitRefusal(GuardRefusal):
    """The CUDA engine cannot be built on this machine; the message says what is needed."""


class ToolkitError(EngineSetupError):
    """The CUDA toolkit could not be fetched or completed."""


@dataclass(frozen=True)
class ToolkitChoice:
    """The toolkit that will build the CUDA engine."""

    source: Literal["system", "fetch"]
    version: str
    """CUDA version, "13.0"."""
    label: str
    """Recorded in the build options and the engine manifest, e.g. "PyPI CUDA 13.0 (pin ...)"."""
    reason: str


@dataclass(frozen=True)
class FetchedToolkit:
    """A toolkit installed from the pinned wheels into lucebox's cache."""

    root: Path
    """The toolkit root: bin/nvcc, include/, lib/ (CUDAToolkit_ROOT)."""
    cuda_version: str
    installed_bytes: int
    download_bytes: int | None


@dataclass(frozen=True)
class ToolkitProgress:
    """Download progress of the wheel set; ``fraction`` counts finished wheels by size."""

    fraction: float | None
    line: str


ToolkitCallback = Callable[[ToolkitProgress], None]


def requirements_text() -> str:
    return (
        resources.files("lucebox.engine.engines")
        .joinpath(REQUIREMENTS_NAME)
        .read_text(encoding="utf-8")
    )


def pin_id() -> str:
    """Names the pinned wheel set: a short hash of the requirements file."""
    return hashlib.sha256(requirements_text().encode()).hexdigest()[:12]


def fetched_label() -> str:
    return f"{FETCHED_PREFIX} {FETCHED_CUDA_VERSION} (pin {pin_id()})"


def is_fetched(label: str) -> bool:
    return label.startswith(FETCHED_PREFIX)


def host_machine() -> str:
    """The CPU architecture, or "" where lucebox cannot fetch the toolkit (not Linux)."""
    return platform.machine() if sys.platform == "linux" else ""


def _driver_cuda(probe: GpuProbe) -> tuple[int, ...] | None:
    return version_tuple(probe.cuda_driver_version) or None


def _capability(arch: str) -> str:
    digits = arch.rstrip("af")
    return f"{digits[:-1]}.{digits[-1]}"


def _system_problem(
    system: CudaToolkitInfo, archs: tuple[str, ...], driver: tuple[int, ...] | None
) -> str | None:
    """Why the system toolkit cannot build this engine, or None when it can."""
    if not system.tool.found:
        return "no CUDA toolkit (nvcc) is installed"
    version = version_tuple(system.tool.version)
    name = f"nvcc {system.tool.version} at {system.tool.path}"
    if version and version[:2] < SYSTEM_MIN_CUDA:
        return f"{name} is too old (11.7 or newer is needed)"
    unsupported = [a for a in archs if system.archs and a.rstrip("af") not in system.archs]
    if unsupported:
        return f"{name} cannot build for compute capability {_capability(unsupported[0])}"
    if driver and version and version[0] > driver[0]:
        return f"{name} is newer than the driver's CUDA {driver[0]}.{driver[1]}"
    return None


def choose_toolkit(
    probe: GpuProbe, system: CudaToolkitInfo, archs: tuple[str, ...], *, host: str
) -> ToolkitChoice:
    """The system toolkit when it will do, else the pinned wheels; refuse when neither can.

    ``archs`` are the CMAKE_CUDA_ARCHITECTURES to build; ``host`` is the CPU architecture
    (``host_machine()``). Without a driver (building for another machine) the driver's CUDA
    version does not limit the choice.
    """
    driver = _driver_cuda(probe)
    system_problem = _system_problem(system, archs, driver)
    if system_problem is None:
        return ToolkitChoice(
            "system",
            system.tool.version or "",
            f"system CUDA {system.tool.version}",
            f"nvcc {system.tool.version} at {system.tool.path}",
        )
    too_old_cards = [a for a in archs if a.rstrip("af") not in FETCHED_ARCHS]
    if host not in FETCHED_HOSTS:
        raise ToolkitRefusal(
            f"{system_problem}, and lucebox fetches the CUDA toolkit only on Linux "
            f"({', '.join(FETCHED_HOSTS)})",
            hint="install the CUDA toolkit, or build for the CPU with --cpu",
        )
    if too_old_cards:
        capability = _capability(too_old_cards[0])
        raise ToolkitRefusal(
            f"{system_problem}, and CUDA {FETCHED_CUDA_VERSION}, the toolkit lucebox can fetch, "
            f"does not build for compute capability {capability} (it needs 7.5 or newer)",
            hint="install CUDA toolkit 12.x (the last to support this card), "
            "or build for the CPU with --cpu",
        )
    if driver is not None and driver[:2] < MIN_DRIVER_CUDA:
        have = f"{probe.driver_version or 'unknown'} (CUDA {probe.cuda_driver_version})"
        raise ToolkitRefusal(
            f"{system_problem}, and the CUDA {FETCHED_CUDA_VERSION} toolkit lucebox can fetch "
            f"needs NVIDIA driver {MIN_DRIVER_RELEASE} or newer; this machine has driver {have}",
            hint=f"update the NVIDIA driver to {MIN_DRIVER_RELEASE} or newer, or install a CUDA "
            f"{driver[0]}.x toolkit, or build for the CPU with --cpu",
        )
    size_gb = DOWNLOAD_BYTES[host] / 1e9
    return ToolkitChoice(
        "fetch",
        FETCHED_CUDA_VERSION,
        fetched_label(),
        f"{system_problem}; lucebox fetches CUDA {FETCHED_CUDA_VERSION} from PyPI "
        f"({size_gb:.1f} GB download, once)",
    )


# --- the fetched toolkit ----------------------------------------------------------------------


def install_dir(paths: Paths) -> Path:
    return paths.cache_dir / "toolkits" / f"cuda-{FETCHED_CUDA_VERSION}-{pin_id()}"


def _root_of(site: Path) -> Path:
    return site / "nvidia" / "cu13"


def fetched_toolkit(paths: Paths) -> FetchedToolkit | None:
    """The pinned toolkit when it is completely installed in the cache."""
    folder = install_dir(paths)
    try:
        marker = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    root = _root_of(folder / "site")
    if marker.get("pin") != pin_id() or not (root / "bin" / "nvcc").is_file():
        return None
    return FetchedToolkit(
        root, marker["cuda_version"], int(marker["installed_bytes"]), marker.get("download_bytes")
    )


def pip_install_argv(requirements: Path, target: Path, pip_cache_dir: Path | None) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--require-hashes",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--target",
        str(target),
        "-r",
        str(requirements),
    ]
    # Without a cache dir pip would keep a second copy of the 0.5 GB of wheels in ~/.cache/pip.
    argv += ["--cache-dir", str(pip_cache_dir)] if pip_cache_dir else ["--no-cache-dir"]
    return argv


def _size_in(line: str) -> int:
    """pip's "Downloading x.whl (423.1 MB)" -> bytes (0 when it names no size)."""
    match = re.search(r"\(([\d.]+) (kB|MB|GB)\)", line)
    if match is None:
        return 0
    return int(float(match.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[match.group(2)])


def _run_pip(argv: list[str], total_bytes: int | None, on_progress: ToolkitCallback | None) -> None:
    """Run pip, reporting each wheel it starts on (pip shows no byte counts without a terminal)."""
    tail: list[str] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
    except OSError as exc:
        raise ToolkitError(f"cannot run pip: {exc}") from exc
    with proc:
        assert proc.stdout is not None
        done_bytes = current_bytes = 0
        try:
            for raw in proc.stdout:
                line = raw.strip()
                tail = [*tail[-20:], line]
                match = _DOWNLOADING.search(line)
                if match is None or on_progress is None:
                    continue
                done_bytes += current_bytes
                current_bytes = _size_in(line)
                fraction = min(done_bytes / total_bytes, 1.0) if total_bytes else None
                on_progress(ToolkitProgress(fraction, f"downloading {match.group(1)}"))
        except BaseException:
            proc.kill()
            raise
    if proc.returncode != 0:
        errors = [t for t in tail if "ERROR" in t] or tail[-3:]
        raise ToolkitError(
            f"pip could not install the CUDA toolkit wheels: {' / '.join(errors)}",
            hint="check the network and the free disk space in the cache dir, "
            "or install the CUDA toolkit yourself",
        )


def _complete(root: Path) -> None:
    """Add what the wheels leave out and cmake and nvcc look for.

    The wheels hold versioned libraries only (libcublas.so.13) and a lib/ folder where nvcc
    looks in lib64/; the driver library is the driver's, so linking needs a stub of it.
    """
    lib = root / "lib"
    for versioned in sorted(lib.glob("lib*.so.*")):
        link = lib / versioned.name.split(".so.")[0]
        link = link.with_name(link.name + ".so")
        if not link.exists():
            link.symlink_to(versioned.name)
    if not (root / "lib64").exists():
        (root / "lib64").symlink_to("lib")
    _build_driver_stub(root)


def _build_driver_stub(root: Path) -> None:
    """lib/stubs/libcuda.so with every driver entry point cuda.h declares (soname libcuda.so.1).

    The engine links against it and at run time loads the driver's real libcuda.so.1.
    """
    include = root / "include"
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise ToolkitError(
            "no C compiler to complete the CUDA toolkit with",
            hint="install one (e.g. `apt install gcc g++`)",
        )
    try:
        header = subprocess.run(
            [compiler, "-E", "-P", f"-I{include}", str(include / "cuda.h")],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolkitError(f"cannot read the toolkit's cuda.h: {exc}") from exc
    names = sorted(set(_DRIVER_API.findall(header)))
    if not names:
        raise ToolkitError(f"{include / 'cuda.h'} declares no driver functions")
    stubs = root / "lib" / "stubs"
    stubs.mkdir(exist_ok=True)
    source = stubs / "libcuda-stub.c"
    source.write_text("".join(f"int {name}(void) {{ return 999; }}\n" for name in names))
    try:
        subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcuda.so.1",
                "-o",
                str(stubs / "libcuda.so"),
                str(source),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolkitError(f"cannot build the driver stub libcuda.so: {exc}") from exc


def driver_stub(paths: Paths) -> Path | None:
    """A driver stub (libcuda.so) that lets a CUDA engine start where no NVIDIA driver is
    installed, to read its ``--version`` and ``--help``: the fetched toolkit's, else a system
    toolkit's. Its entry points all fail, so the engine finds no CUDA device and goes on."""
    fetched = fetched_toolkit(paths)
    homes = [fetched.root] if fetched else []
    homes += toolchain.cuda_homes()
    stubs = [home / lib / "stubs" / "libcuda.so" for home in homes for lib in ("lib", "lib64")]
    return next((stub for stub in stubs if stub.is_file()), None)


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def ensure_toolkit(
    paths: Paths,
    *,
    on_progress: ToolkitCallback | None = None,
    pip_cache_dir: Path | None = None,
) -> FetchedToolkit:
    """Install the pinned wheel set into the cache (once) and return where it is.

    It is installed into a staging folder and moved into place only when complete, so an
    interrupted fetch is never taken for a toolkit.
    """
    existing = fetched_toolkit(paths)
    if existing is not None:
        if on_progress is not None:
            on_progress(ToolkitProgress(1.0, describe(existing)))
        return existing
    folder = install_dir(paths)
    paths.ensure(folder.parent)
    staging = folder.parent / f".{folder.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    total_bytes = DOWNLOAD_BYTES.get(host_machine())
    try:
        staging.mkdir()
        requirements = staging / REQUIREMENTS_NAME
        requirements.write_text(requirements_text(), encoding="utf-8")
        site = staging / "site"
        if on_progress is not None:
            on_progress(ToolkitProgress(0.0, f"fetching CUDA {FETCHED_CUDA_VERSION} from PyPI"))
        _run_pip(pip_install_argv(requirements, site, pip_cache_dir), total_bytes, on_progress)
        root = _root_of(site)
        if not (root / "bin" / "nvcc").is_file():
            raise ToolkitError(f"the CUDA wheels installed no nvcc under {root}")
        _complete(root)
        installed_bytes = _tree_bytes(site)
        marker = {
            "pin": pin_id(),
            "cuda_version": FETCHED_CUDA_VERSION,
            "installed_bytes": installed_bytes,
            "download_bytes": total_bytes,
        }
        write_text_atomic(staging / MARKER_NAME, json.dumps(marker, indent=2))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    fetched = fetched_toolkit(paths)
    if fetched is None:
        raise ToolkitError(f"the CUDA toolkit in {folder} is incomplete", hint="fetch it again")
    if on_progress is not None:
        on_progress(ToolkitProgress(1.0, describe(fetched)))
    return fetched


def install_runtime_libs(toolkit_root: Path, bin_dir: Path) -> None:
    """Put the CUDA runtime libraries the engine loads next to its binaries (RUNPATH $ORIGIN).

    The installed engine then runs with only the driver, whatever happens to the cache.
    """
    for name in RUNTIME_LIBS:
        target = bin_dir / name
        target.unlink(missing_ok=True)
        source = toolkit_root / "lib" / name
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def cmake_flags(toolkit_name: str, toolkit_root: Path | None) -> list[str]:
    """cmake flags for a build with a fetched toolkit: the engine finds the CUDA runtime
    libraries installed next to it, and cmake finds the toolkit (its paths are kept out of the
    build key); none for the system's toolkit or a CPU build."""
    if not is_fetched(toolkit_name):
        return []
    flags = ["-DCMAKE_BUILD_RPATH=$ORIGIN"]
    if toolkit_root is not None:
        flags += [
            f"-DCUDAToolkit_ROOT={toolkit_root}",
            f"-DCMAKE_CUDA_COMPILER={toolkit_root / 'bin' / 'nvcc'}",
        ]
    return flags


def describe(fetched: FetchedToolkit) -> str:
    """ "fetched into the cache (13.0, 0.8 GB)"."""
    return (
        f"fetched into the cache ({fetched.cuda_version}, {fetched.installed_bytes / 1e9:.1f} GB)"
    )
