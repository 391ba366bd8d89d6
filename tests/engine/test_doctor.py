from __future__ import annotations

from lucebox.engine.doctor import check_cuda_toolkit, check_engine, check_gpu, run_doctor
from lucebox.engine.gpu import probe_gpus
from lucebox.engine.paths import resolve_paths
from lucebox.engine.toolchain import CudaToolkitInfo, ToolInfo

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
    assert check_cuda_toolkit(h100, NVCC_13).verdict == "ok"
    old = check_cuda_toolkit(h100, NVCC_11)
    assert old.verdict == "warn" and "90" in old.detail
    assert check_cuda_toolkit(h100, NO_NVCC).verdict == "missing"
    no_gpu = probe_gpus(FakeNvml(init_failure="no-nvml"))
    assert check_cuda_toolkit(no_gpu, NO_NVCC).verdict == "ok"


def test_engine_line_without_engines():
    check = check_engine(resolve_paths(), probe_gpus(FakeNvml(init_failure="no-nvml")), "")
    assert check.verdict == "missing" and "lucebox engine build" in check.action


def test_every_check_has_an_action_unless_ok():
    report = run_doctor(resolve_paths(), probe_gpus(FakeNvml(gpus=[FakeGpu()])))
    assert report.checks
    for check in report.checks:
        assert check.verdict in {"ok", "warn", "missing"}
        assert check.verdict == "ok" or check.action
