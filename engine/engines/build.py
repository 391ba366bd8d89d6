"""Build llama-server from the engine source with cmake, cached by source and options.

The build directory lives in the user cache dir under a key made of the source identity and
the options, so a second build with nothing changed reuses it; the result is installed into
the data dir with a manifest (see :mod:`lucebox.engine.engines.registry`). Engines are linked
statically so an installed engine does not depend on its build directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from lucebox.engine.core.errors import EngineSetupError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import cputarget, toolchain, toolkit
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.machine.cpu import CpuInfo, probe_cpu
from lucebox.engine.machine.gpu import GpuProbe

Backend = Literal["cpu", "cuda"]
TARGETS = ("llama-server", "llama-bench", "llama-fit-params", "ggml-rpc-server")
_PROGRESS = re.compile(r"^\[\s*(\d{1,3})%\]")
_ERROR_LINE = re.compile(r"error|Error|ERROR|fatal|No space left|not found", re.ASCII)


class BuildError(EngineSetupError):
    """cmake configure or build failed; the message carries the log path and a hint."""


@dataclass(frozen=True)
class BuildOptions:
    """What an engine is built for; part of the build cache key."""

    backend: Backend
    cuda_archs: tuple[str, ...] = ()
    build_type: str = "Release"
    toolkit: str = ""
    """The CUDA toolkit that builds it ("system CUDA 13.0", "PyPI CUDA 13.0 (pin ...)")."""
    webui: bool = True
    """Build the engine's web UI from source with npm (never fails the engine build)."""
    cpu_target: str = cputarget.DEFAULT
    """The CPU baseline its ggml CPU code is compiled for (:mod:`cputarget`), never native."""


@dataclass(frozen=True)
class BuildChoice:
    options: BuildOptions
    reason: str


@dataclass(frozen=True)
class BuildEvent:
    """Progress of a build: stage, percent of the cmake build (None while unknown), one line."""

    stage: Literal["wait", "toolkit", "configure", "build", "install", "cached"]
    percent: int | None
    line: str


BuildCallback = Callable[[BuildEvent], None]


def parse_archs(text: str) -> tuple[str, ...]:
    """ "86,89" or "8.6;9.0" -> ("86", "89"); refuses anything that is not an arch number."""
    archs = []
    for part in re.split(r"[,;\s]+", text.strip()):
        if not part:
            continue
        arch = part.replace(".", "")
        if not re.fullmatch(r"\d{2,3}[af]?", arch):
            raise UsageError(
                f"'{part}' is not a CUDA architecture",
                hint="use compute capabilities like 86,89 or 8.6,8.9",
            )
        archs.append(arch)
    if not archs:
        raise UsageError("--arch needs at least one CUDA architecture, e.g. --arch 86")
    return tuple(dict.fromkeys(archs))


def cpu_options(cpu: CpuInfo | None = None) -> BuildOptions:
    """A CPU-only build for the fastest baseline this CPU (probed when not given) runs."""
    return BuildOptions("cpu", cpu_target=cputarget.choose_target(cpu or probe_cpu()).name)


def choose_options(
    probe: GpuProbe,
    cuda: toolchain.CudaToolkitInfo,
    *,
    want: Backend | None = None,
    archs: tuple[str, ...] = (),
    host: str | None = None,
    cpu: CpuInfo | None = None,
) -> BuildChoice:
    """CUDA whenever there is an NVIDIA GPU (or it is asked for), else CPU; say why.

    The CPU code targets the fastest baseline this CPU runs (:func:`cputarget.choose_target`).

    A machine with an NVIDIA GPU never silently gets a CPU engine: when no toolkit can build
    for it, :class:`toolkit.ToolkitRefusal` says what is needed (``--cpu`` builds anyway).
    """
    gpu_archs = tuple(dict.fromkeys(g.cuda_arch for g in probe.gpus if g.cuda_arch))
    cpu_only = cpu_options(cpu)
    for_cpu = f"CPU code for {cpu_only.cpu_target}"
    if want == "cpu":
        return BuildChoice(cpu_only, f"--cpu asked for a CPU-only engine ({for_cpu})")
    if want is None and not probe.has_gpu:
        return BuildChoice(cpu_only, f"CPU: no NVIDIA GPU found ({for_cpu})")
    chosen = archs or gpu_archs
    if not chosen:
        raise UsageError(
            "no NVIDIA GPU was found to pick a CUDA architecture for",
            hint="name it with --arch, e.g. --arch 86 for an RTX 3090",
        )
    kit = toolkit.choose_toolkit(
        probe, cuda, chosen, host=toolkit.host_machine() if host is None else host
    )
    why = "from --arch" if archs else "from the GPU's compute capability"
    return BuildChoice(
        BuildOptions("cuda", chosen, toolkit=kit.label, cpu_target=cpu_only.cpu_target),
        f"CUDA for arch {', '.join(chosen)} ({why}), {kit.reason}, {for_cpu}",
    )


def build_key(source: SourceInfo, options: BuildOptions) -> str:
    """Cache key: the exact source, the options and every cmake flag (paths left out)."""
    flags = configure_argv(source, Path("."), options, use_ccache=False)[5:]
    fields = asdict(options)
    if not options.toolkit:
        # A CPU build names no toolkit; leaving the field out keeps CPU keys, and so the
        # engines already built with them, unchanged.
        del fields["toolkit"]
    payload = json.dumps({"source": source.identity, **fields, "flags": flags}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def configure_argv(
    source: SourceInfo,
    build_dir: Path,
    options: BuildOptions,
    *,
    use_ccache: bool,
    toolkit_root: Path | None = None,
) -> list[str]:
    """The cmake configure command; ``toolkit_root`` points it at a fetched CUDA toolkit."""
    argv = [
        "cmake",
        "-S",
        str(source.path),
        "-B",
        str(build_dir),
        f"-DCMAKE_BUILD_TYPE={options.build_type}",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        # ON would download the web UI from the Hub at build time; BUILD_UI builds it with npm.
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        f"-DLLAMA_BUILD_UI={'ON' if options.webui else 'OFF'}",
        # Every engine can serve as or use an RPC peer; RDMA would link the build machine's
        # libibverbs when present, which a home PC's engine does not need.
        "-DGGML_RPC=ON",
        "-DGGML_RPC_RDMA=OFF",
        f"-DGGML_CCACHE={'ON' if use_ccache else 'OFF'}",
        *cputarget.target(options.cpu_target).cmake_flags,
    ]
    if source.build_number is not None:
        # Without these, cmake asks git, which finds the enclosing lucebox checkout and stamps
        # lucebox's commit into the engine's --version.
        argv.append(f"-DLLAMA_BUILD_NUMBER={source.build_number}")
        argv.append(f"-DLLAMA_BUILD_COMMIT={source.identity.rsplit(':', 1)[-1][:12]}")
    if options.backend == "cuda":
        argv += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(options.cuda_archs)}"]
    return argv + toolkit.cmake_flags(options.toolkit, toolkit_root)


def build_argv(build_dir: Path, jobs: int) -> list[str]:
    return [
        "cmake",
        "--build",
        str(build_dir),
        "--config",
        "Release",
        "-j",
        str(jobs),
        "--target",
        *TARGETS,
    ]


def parse_progress(line: str) -> int | None:
    """cmake's "[ 42%] Building ..." -> 42."""
    match = _PROGRESS.match(line)
    return int(match.group(1)) if match else None


def overall_percent(shown: int | None, found: int | None) -> int | None:
    """The build's percent after a line that says ``found`` (None: it says none), the last
    shown being ``shown``. cmake counts each target of ``--target`` from 0 again (the first
    takes nearly all the time): the percent never goes back, and says 99 until the build
    ends."""
    if found is None:
        return None
    return min(99, max(shown or 0, found))


def estimate_left_s(elapsed_s: float, percent: int) -> float | None:
    """Seconds left at the pace so far; None before 5% (the first steps say little)."""
    if percent < 5 or percent >= 100:
        return None
    return elapsed_s * (100 - percent) / percent


def diagnose(tail: Iterable[str]) -> str:
    """A hint for the usual causes of a failed build, from the last lines of its log."""
    text = "\n".join(tail)
    if "No space left on device" in text:
        return "the disk is full: free space in the cache dir and build again"
    if re.search(r"CMAKE_(CXX|C)_COMPILER", text) or "No CMAKE_C" in text:
        return "no working C/C++ compiler: install one (e.g. `apt install g++`)"
    if "Unsupported gpu architecture" in text or "unsupported gpu architecture" in text:
        return "the CUDA toolkit is too old for this GPU's architecture: install a newer one"
    if "CUDA Toolkit not found" in text or "No CMAKE_CUDA_COMPILER" in text:
        return "the CUDA toolkit was not found by cmake: install it, or build with --cpu"
    if "CMake 3." in text and "or higher is required" in text:
        return "cmake is too old: install a newer cmake"
    if "Killed signal terminated program" in text or "virtual memory exhausted" in text:
        return "the compiler ran out of memory: build again with fewer jobs (--jobs 1)"
    return "see the log for the first error"


def run_logged(
    argv: list[str],
    log: Path,
    stage: Literal["configure", "build"],
    on_event: BuildCallback | None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run one cmake step, appending its output to ``log`` and reporting progress."""
    tail: deque[str] = deque(maxlen=400)
    shown: int | None = None
    with log.open("a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(argv)}\n")
        log_file.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env={**(os.environ if env is None else env), "CLICOLOR_FORCE": "0"},
            )
        except FileNotFoundError as exc:
            raise BuildError(
                f"{argv[0]} is not installed", hint="install cmake (e.g. `apt install cmake`)"
            ) from exc
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                log_file.write(raw)
                log_file.flush()  # so `tail -f` on the log follows the build
                tail.append(line)
                percent = overall_percent(shown, parse_progress(line))
                shown = shown if percent is None else percent
                if on_event is not None:
                    on_event(BuildEvent(stage, percent, line))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()
        code = proc.wait()
    if code != 0:
        errors = [line for line in tail if _ERROR_LINE.search(line)][-8:] or list(tail)[-8:]
        raise BuildError(
            f"cmake {stage} failed (exit {code}); full log: {log}\n  " + "\n  ".join(errors),
            hint=diagnose(tail),
        )


def default_jobs() -> int:
    # One job per core; more only thrashes a 2-core machine's memory on the CUDA sources.
    return max(1, os.cpu_count() or 1)


def configured_for(build_dir: Path) -> Path | None:
    cache = build_dir / "CMakeCache.txt"
    try:
        text = cache.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", text, re.M)
    return Path(match.group(1)).resolve() if match else None


def build_engine_tree(
    paths: Paths,
    source: SourceInfo,
    options: BuildOptions,
    *,
    jobs: int | None = None,
    on_event: BuildCallback | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Configure and build; returns the folder holding the built binaries.

    ``env`` is the build's environment (the web UI build finds node and npm on its PATH).
    """
    key = build_key(source, options)
    build_dir = paths.ensure(paths.builds_dir) / key
    if configured_for(build_dir) not in (None, source.path.resolve()):
        # Same source and options from another folder (a fresh clone): cmake refuses to reuse
        # a cache made for a different source path, so start this build folder over. Moved
        # aside first: a removal cut short must not leave a half-deleted tree (the UI's
        # node_modules) that the next build would take as installed.
        trash = build_dir.with_name(f".{key}.old-{os.getpid()}")
        build_dir.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    build_dir.mkdir(exist_ok=True)
    log = build_dir / "build.log"
    log.write_text(
        f"# lucebox engine build {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        f"# source: {source.identity}\n# options: {asdict(options)}\n",
        encoding="utf-8",
    )
    toolkit_root = _fetch_toolkit(paths, options, on_event)
    use_ccache = toolchain.probe_ccache().found
    if not (build_dir / "CMakeCache.txt").exists() or not (build_dir / "Makefile").exists():
        run_logged(
            configure_argv(
                source, build_dir, options, use_ccache=use_ccache, toolkit_root=toolkit_root
            ),
            log,
            "configure",
            on_event,
            env,
        )
    run_logged(build_argv(build_dir, jobs or default_jobs()), log, "build", on_event, env)
    bin_dir = build_dir / "bin"
    missing = [t for t in TARGETS if not (bin_dir / t).is_file()]
    if missing:
        raise BuildError(f"the build finished without {', '.join(missing)}; full log: {log}")
    if toolkit_root is not None:
        toolkit.install_runtime_libs(toolkit_root, bin_dir)
    return bin_dir


def _fetch_toolkit(
    paths: Paths, options: BuildOptions, on_event: BuildCallback | None
) -> Path | None:
    """The fetched CUDA toolkit's root when the options name it (installed on first use)."""
    if not toolkit.is_fetched(options.toolkit):
        return None

    def report(progress: toolkit.ToolkitProgress) -> None:
        if on_event is not None:
            percent = int(progress.fraction * 100) if progress.fraction is not None else None
            on_event(BuildEvent("toolkit", percent, progress.line))

    return toolkit.ensure_toolkit(paths, on_progress=report).root
