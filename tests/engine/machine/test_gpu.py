from __future__ import annotations

import pytest

from lucebox.engine.machine.gpu import cuda_arch, format_cuda_version, probe_gpus
from tests.engine.fake_nvml import GIB, FakeGpu, FakeNvml


@pytest.mark.parametrize("failure", ["no-nvml", "no-driver", "error"])
def test_no_usable_nvml_is_a_result_not_an_exception(failure):
    probe = probe_gpus(FakeNvml(init_failure=failure))
    assert probe.status == failure
    assert probe.gpus == ()
    assert not probe.has_gpu
    assert "no NVIDIA GPU" in probe.detail


def test_driver_without_gpus():
    nvml = FakeNvml(gpus=[])
    probe = probe_gpus(nvml)
    assert probe.status == "no-gpu"
    assert probe.driver_version == "580.159.04"
    assert nvml.shut_down


def test_one_rtx_3090():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu()]))
    assert probe.status == "ok"
    (gpu,) = probe.gpus
    assert gpu.name == "NVIDIA GeForce RTX 3090"
    assert gpu.compute_capability == "8.6"
    assert gpu.cuda_arch == "86"
    assert gpu.vram_total_bytes == 24 * GIB
    assert gpu.vram_free_bytes == 24 * GIB - 300 * 1024**2
    assert gpu.power_limit_w == 350.0
    assert gpu.temperature_c == 41
    assert probe.cuda_driver_version == "13.0"


def test_several_gpus_keep_their_indices():
    gpus = [
        FakeGpu(),
        FakeGpu(name="NVIDIA GeForce RTX 4060", total_bytes=8 * GIB, capability=(8, 9)),
    ]
    probe = probe_gpus(FakeNvml(gpus=gpus))
    assert [g.index for g in probe.gpus] == [0, 1]
    assert [g.cuda_arch for g in probe.gpus] == ["86", "89"]
    assert probe.gpus[1].vram_total_bytes == 8 * GIB


def test_another_app_holding_6_gib_is_listed_and_not_free():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(processes=[(4242, 6 * GIB)])]))
    (gpu,) = probe.gpus
    assert gpu.vram_free_bytes == 24 * GIB - 300 * 1024**2 - 6 * GIB
    (proc,) = gpu.processes
    assert proc.pid == 4242
    assert proc.used_bytes == 6 * GIB
    assert proc.name  # psutil cannot name a foreign pid: it says "pid 4242" instead of failing


def test_mig_enabled_card():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(name="NVIDIA A100", mig=True, capability=(8, 0))]))
    assert probe.gpus[0].mig_enabled is True


def test_unsupported_queries_are_not_available_not_crashes():
    unsupported = frozenset(
        {
            "power_limit_mw",
            "power_draw_mw",
            "temperature_c",
            "utilization_percent",
            "processes",
            "compute_capability",
            "uuid",
        }
    )
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(unsupported=unsupported, mig=None)]))
    (gpu,) = probe.gpus
    assert gpu.power_limit_w is None
    assert gpu.temperature_c is None
    assert gpu.utilization_percent is None
    assert gpu.compute_capability is None and gpu.cuda_arch is None
    assert gpu.mig_enabled is None
    assert gpu.processes == ()


@pytest.mark.parametrize(
    ("capability", "arch"), [((8, 6), "86"), ((8, 9), "89"), ((9, 0), "90"), ((12, 0), "120")]
)
def test_cuda_arch(capability, arch):
    assert cuda_arch(*capability) == arch


@pytest.mark.parametrize(("encoded", "text"), [(13000, "13.0"), (12040, "12.4"), (11080, "11.8")])
def test_cuda_version(encoded, text):
    assert format_cuda_version(encoded) == text


def test_real_probe_on_this_machine_never_raises():
    # Runs the real pynvml provider: on a machine without a GPU this is "no NVIDIA GPU".
    probe = probe_gpus()
    assert probe.status in {"ok", "no-nvml", "no-driver", "no-gpu", "error"}
    assert probe.has_gpu == (probe.status == "ok")
