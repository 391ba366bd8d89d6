"""The CUDA toolkit choice, and the pinned wheel set really fetched from PyPI and configured."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import toolkit
from lucebox.engine.engines.build import BuildOptions, choose_options, configure_argv, run_logged
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest
from lucebox.engine.engines.source import SourceInfo, ensure_source
from lucebox.engine.engines.toolchain import CudaToolkitInfo, ToolInfo
from lucebox.engine.engines.toolkit import ToolkitRefusal, choose_toolkit
from lucebox.engine.machine.gpu import probe_gpus
from support import realmodels
from tests.engine.engines.test_cputarget import HASWELL
from tests.engine.fake_nvml import FakeGpu, FakeNvml

CUDA_13_ARCHS = toolkit.FETCHED_ARCHS
CUDA_12_ARCHS = ("50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90")


def nvcc(version: str, archs: tuple[str, ...]) -> CudaToolkitInfo:
    return CudaToolkitInfo(ToolInfo("nvcc", True, "/usr/local/cuda/bin/nvcc", version, ""), archs)


ABSENT = CudaToolkitInfo(ToolInfo("nvcc", False, None, None, "not on PATH"), ())
SYSTEM_13 = nvcc("13.0", CUDA_13_ARCHS)
SYSTEM_12 = nvcc("12.4", CUDA_12_ARCHS)
TOO_OLD = nvcc("11.0", ("35", "50", "60", "70", "75", "80"))

# NVML's integer CUDA driver version: 13000 = CUDA 13.0 (driver 580), 12040 = 12.4 (driver 550).
DRIVERS = {13020: "590.44.01", 13000: "580.159.04", 12040: "550.54.15"}


def machine(cuda: int | None, capability: tuple[int, int] | None):
    """A probe of one card with that compute capability and driver; None: no driver/GPU."""
    if cuda is None:
        return probe_gpus(FakeNvml(init_failure="no-driver"))
    gpus = [FakeGpu(capability=capability)] if capability else []
    return probe_gpus(FakeNvml(gpus=gpus, cuda=cuda, driver=DRIVERS[cuda]))


# driver CUDA x card arch x system toolkit -> "system", "fetch" or a piece of the refusal.
TABLE = [
    (13000, (8, 6), ABSENT, "fetch"),
    (13020, (8, 6), ABSENT, "fetch"),
    (13000, (8, 6), SYSTEM_13, "system"),
    (13000, (8, 6), SYSTEM_12, "system"),
    (13000, (8, 6), TOO_OLD, "fetch"),
    (13000, (9, 0), TOO_OLD, "fetch"),
    (13000, (12, 0), SYSTEM_12, "fetch"),
    (13000, (12, 0), ABSENT, "fetch"),
    (13000, (7, 5), ABSENT, "fetch"),
    (13000, (6, 1), ABSENT, "compute capability 6.1"),
    (13000, (6, 1), SYSTEM_12, "system"),
    (13000, (6, 1), SYSTEM_13, "compute capability 6.1"),
    (12040, (8, 6), ABSENT, "driver 580 or newer; this machine has driver 550.54.15 (CUDA 12.4)"),
    (12040, (8, 6), SYSTEM_12, "system"),
    (12040, (8, 6), SYSTEM_13, "newer than the driver's CUDA 12.4"),
    (12040, (8, 6), TOO_OLD, "driver 580 or newer"),
    (12040, (12, 0), SYSTEM_12, "driver 580 or newer"),
    (None, None, ABSENT, "fetch"),
    (None, None, SYSTEM_13, "system"),
]


@pytest.mark.parametrize(("cuda", "capability", "system", "expected"), TABLE)
def test_toolkit_choice(cuda, capability, system, expected):
    probe = machine(cuda, capability)
    archs = (f"{capability[0]}{capability[1]}",) if capability else ("86",)
    if expected in ("system", "fetch"):
        choice = choose_toolkit(probe, system, archs, host="x86_64")
        assert choice.source == expected
        assert choice.reason
        if expected == "fetch":
            assert choice.version == "13.0" and toolkit.is_fetched(choice.label)
            assert "0.5 GB download" in choice.reason
        else:
            assert choice.label == f"system CUDA {system.tool.version}"
    else:
        with pytest.raises(ToolkitRefusal, match=re.escape(expected)) as refused:
            choose_toolkit(probe, system, archs, host="x86_64")
        assert "--cpu" in (refused.value.hint or "")
        assert refused.value.exit_code == 3


def test_no_fetch_off_linux():
    with pytest.raises(ToolkitRefusal, match="only on Linux"):
        choose_toolkit(machine(13000, (8, 6)), ABSENT, ("86",), host="")


def test_a_gpu_never_gets_a_silent_cpu_engine():
    old_driver = machine(12040, (8, 6))
    with pytest.raises(ToolkitRefusal, match="NVIDIA driver 580"):
        choose_options(old_driver, ABSENT, host="x86_64")
    assert choose_options(old_driver, ABSENT, want="cpu", host="x86_64").options.backend == "cpu"
    choice = choose_options(machine(13000, (8, 6)), ABSENT, host="x86_64", cpu=HASWELL)
    assert choice.options == BuildOptions(
        "cuda", ("86",), toolkit=toolkit.fetched_label(), cpu_target="x86-64-v3"
    )
    assert "fetches CUDA 13.0 from PyPI" in choice.reason
    no_gpu = choose_options(machine(None, None), ABSENT, host="x86_64")
    assert no_gpu.options.backend == "cpu"


def test_pin_is_hashed_for_both_linux_hosts():
    lines = toolkit.requirements_text()
    pins = re.findall(r"^([a-z0-9-]+)==([\d.]+) \\$", lines, re.M)
    assert {name for name, _ in pins} == {
        "nvidia-cuda-nvcc",
        "nvidia-cuda-crt",
        "nvidia-nvvm",
        "nvidia-cuda-runtime",
        "nvidia-cuda-cccl",
        "nvidia-cublas",
    }
    assert all(version.startswith("13.") for _, version in pins)
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", lines)) == 2 * len(pins)


def test_configure_points_cmake_at_a_fetched_toolkit(tmp_path):
    options = BuildOptions("cuda", ("86",), toolkit=toolkit.fetched_label())
    source = SourceInfo(Path("/src"), "pin", "x", 11434)
    argv = configure_argv(source, tmp_path, options, use_ccache=False, toolkit_root=tmp_path)
    assert f"-DCUDAToolkit_ROOT={tmp_path}" in argv
    assert f"-DCMAKE_CUDA_COMPILER={tmp_path / 'bin' / 'nvcc'}" in argv
    assert "-DCMAKE_BUILD_RPATH=$ORIGIN" in argv
    system = BuildOptions("cuda", ("86",), toolkit="system CUDA 13.0")
    assert not any(
        "CUDAToolkit_ROOT" in a or "RPATH" in a
        for a in configure_argv(source, tmp_path, system, use_ccache=False)
    )


@pytest.mark.slow
def test_fetch_from_pypi_and_configure_cmake_against_it(tmp_path, monkeypatch):
    """The pinned wheels installed into a fresh cache, completed, and cmake configured with them."""
    paths = resolve_paths()
    seen: list[toolkit.ToolkitProgress] = []
    fetched = toolkit.ensure_toolkit(
        paths, on_progress=seen.append, pip_cache_dir=realmodels.test_cache_dir() / "pip"
    )
    assert fetched.root.is_relative_to(paths.cache_dir)
    assert toolkit.fetched_toolkit(paths) == fetched
    assert seen[-1].line == toolkit.describe(fetched)
    again: list[toolkit.ToolkitProgress] = []
    assert toolkit.ensure_toolkit(paths, on_progress=again.append) == fetched
    assert [p.line for p in again] == [toolkit.describe(fetched)]
    assert seen[0].fraction == 0.0 and seen[-1].fraction == 1.0
    wheels = [p.line for p in seen if p.line.startswith("downloading ")]
    assert len(wheels) == 6 and "nvidia_cublas" in wheels[-1]
    fractions = [p.fraction for p in seen if p.fraction is not None]
    assert fractions == sorted(fractions)
    assert 0.7e9 < fetched.installed_bytes < 1.2e9
    assert re.fullmatch(r"fetched into the cache \(13\.0, \d\.\d GB\)", toolkit.describe(fetched))
    version = subprocess.run(
        [str(fetched.root / "bin" / "nvcc"), "--version"], capture_output=True, text=True
    )
    assert "release 13.0" in version.stdout
    stub = fetched.root / "lib" / "stubs" / "libcuda.so"
    dynamic = subprocess.run(
        ["readelf", "-d", "--dyn-syms", str(stub)], capture_output=True, text=True
    )
    assert "[libcuda.so.1]" in dynamic.stdout
    for symbol in ("cuMemCreate", "cuGetErrorString", "cuDeviceGetAttribute"):
        assert re.search(rf"\b{symbol}\b", dynamic.stdout)

    source = ensure_source(paths)
    # cmake finds no system toolkit on PATH or through CUDA_HOME, only the one it is pointed at;
    # as root, a private mount namespace also empties /usr/local/cuda for the configure run.
    path = ":".join(p for p in os.environ["PATH"].split(":") if "cuda" not in p.lower())
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    options = BuildOptions("cuda", ("86",), toolkit=toolkit.fetched_label())
    build_dir = tmp_path / "build"
    argv = configure_argv(source, build_dir, options, use_ccache=False, toolkit_root=fetched.root)
    if os.geteuid() == 0 and shutil.which("unshare") and Path("/usr/local/cuda").exists():
        (tmp_path / "empty").mkdir()
        hide = f'mount --bind {tmp_path / "empty"} /usr/local/cuda && exec "$@"'
        argv = ["unshare", "-m", "sh", "-c", hide, "sh", *argv]
    run_logged(argv, tmp_path / "configure.log", "configure", None)
    cache = (build_dir / "CMakeCache.txt").read_text()
    for key in (
        "CMAKE_CUDA_COMPILER:STRING",
        "CUDA_cudart_LIBRARY:FILEPATH",
        "CUDA_cublas_LIBRARY:FILEPATH",
        "CUDA_cuda_driver_LIBRARY:FILEPATH",
    ):
        value = re.search(rf"^{re.escape(key)}=(.*)$", cache, re.M)
        assert value and Path(value.group(1)).is_relative_to(fetched.root), key
    assert "CUDA compiler identification is NVIDIA 13.0" in (tmp_path / "configure.log").read_text()


def test_runtime_libraries_go_next_to_the_engine(tmp_path):
    lib = tmp_path / "toolkit" / "lib"
    lib.mkdir(parents=True)
    for name in toolkit.RUNTIME_LIBS:
        (lib / name).write_bytes(name.encode())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "libcudart.so.13").write_bytes(b"from an older build")
    toolkit.install_runtime_libs(tmp_path / "toolkit", bin_dir)
    for name in toolkit.RUNTIME_LIBS:
        assert (bin_dir / name).read_bytes() == name.encode()


def test_manifest_records_the_toolkit():
    manifest = EngineManifest(
        id="llama.cpp-b11434-cuda-sm86-0123abcd",
        backend="cuda",
        cuda_archs=("86",),
        version="b11434",
        server_path="/engines/x/bin/llama-server",
        origin="build",
        options={"backend": "cpu", "cpu_target": "x86-64-v3"},
        capabilities=EngineCapabilities((), (), None),
        toolkit=toolkit.fetched_label(),
    )
    data = json.loads(json.dumps(manifest.to_json()))
    assert data["toolkit"].startswith("PyPI CUDA 13.0 (pin ")
    assert EngineManifest.from_json(data) == manifest
    del data["toolkit"]
    assert EngineManifest.from_json(data).toolkit is None
