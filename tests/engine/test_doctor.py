from __future__ import annotations

from pathlib import Path

from lucebox.engine.doctor import check_cuda_toolkit, check_engine, check_gpu, run_doctor
from lucebox.engine.gpu import probe_gpus
from lucebox.engine.paths import resolve_paths
from lucebox.engine.toolchain import CudaToolkitInfo, ToolInfo
from lucebox.engine.toolkit import FetchedToolkit

from .fake_nvml import GIB, FakeGpu, FakeNvml

NVCC_11 = CudaToolkitInfo(ToolInfo("nvcc", True, "/usr/bin/nvcc", "11.0", ""), ("75", "80"))
NVCC_13 = CudaToolkitInfo(ToolInfo("nvcc", True, "/usr/bin/nvcc", "13.0", ""), ("86", "90"))
NO_NVCC = CudaToolkitInfo(ToolInfo("nvcc", False, None, None, "not on PATH"), ())


def test_no_gpu_is_missing_with_what_to_do():
    (check,) = check_gpu(probe_gpus(FakeNvml(init_failure="no-driver")))
    assert check.verdict == "missing" and "smoke" in check.action


def test_other_app_holding_6_gib_is_reported():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(processes=[(99999, 6 * GIB)])]))
    gpu_line, driver_line = check_gpu(probe)
    assert "1 other process(es) hold 6.0 GiB" in gpu_line.detail
    assert gpu_line.verdict == "ok"
    assert "580.159.04" in driver_line.detail and "13.0" in driver_line.detail


def test_busy_and_mig_cards_warn():
    busy = probe_gpus(FakeNvml(gpus=[FakeGpu(processes=[(99999, 16 * GIB)])]))
    assert check_gpu(busy)[0].verdict == "warn"
    mig = probe_gpus(FakeNvml(gpus=[FakeGpu(mig=True)]))
    assert "MIG" in check_gpu(mig)[0].action


def test_cuda_toolkit_against_the_gpu_arch():
    h100 = probe_gpus(FakeNvml(gpus=[FakeGpu(capability=(9, 0))]))
    system = check_cuda_toolkit(h100, NVCC_13, None, "x86_64")
    assert system.verdict == "ok" and "nvcc 13.0" in system.detail and "90" in system.detail
    too_old = check_cuda_toolkit(h100, NVCC_11, None, "x86_64")
    assert too_old.verdict == "ok" and "fetches CUDA 13.0 from PyPI" in too_old.detail
    fetched = FetchedToolkit(
        Path("/cache/toolkits/cuda-13.0/site/nvidia/cu13"), "13.0", 841_000_000, None
    )
    line = check_cuda_toolkit(h100, NO_NVCC, fetched, "x86_64")
    assert line.verdict == "ok"
    assert line.detail.startswith("fetched into the cache (13.0, 0.8 GB)")
    old_driver = probe_gpus(FakeNvml(gpus=[FakeGpu()], cuda=12040, driver="550.54.15"))
    refused = check_cuda_toolkit(old_driver, NO_NVCC, None, "x86_64")
    assert refused.verdict == "missing" and "580" in refused.detail and "--cpu" in refused.action
    no_gpu = probe_gpus(FakeNvml(init_failure="no-nvml"))
    assert check_cuda_toolkit(no_gpu, NO_NVCC, None, "x86_64").detail == (
        "not needed without an NVIDIA GPU"
    )
    assert check_cuda_toolkit(no_gpu, NO_NVCC, fetched, "x86_64").detail.startswith("fetched")


def test_engine_line_without_engines():
    check = check_engine(resolve_paths(), probe_gpus(FakeNvml(init_failure="no-nvml")), "")
    assert check.verdict == "missing" and "lucebox engine build" in check.action


def test_every_check_has_an_action_unless_ok():
    report = run_doctor(resolve_paths(), probe_gpus(FakeNvml(gpus=[FakeGpu()])))
    assert report.checks
    for check in report.checks:
        assert check.verdict in {"ok", "warn", "missing"}
        assert check.verdict == "ok" or check.action
