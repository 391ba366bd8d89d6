from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.doctor import (
    check_cuda_toolkit,
    check_engine,
    check_gpu,
    check_node,
    check_webui,
    run_doctor,
)
from lucebox.engine.engines import nodejs
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest
from lucebox.engine.engines.toolchain import CudaToolkitInfo, ToolInfo
from lucebox.engine.engines.toolkit import FetchedToolkit
from lucebox.engine.machine.cpu import probe_cpu
from lucebox.engine.machine.gpu import probe_gpus
from support.uibuild import old_node_only
from tests.engine.fake_nvml import GIB, FakeGpu, FakeNvml

NVCC_11 = CudaToolkitInfo(ToolInfo("nvcc", True, "/usr/bin/nvcc", "11.0", ""), ("75", "80"))
NVCC_13 = CudaToolkitInfo(ToolInfo("nvcc", True, "/usr/bin/nvcc", "13.0", ""), ("86", "90"))
NO_NVCC = CudaToolkitInfo(ToolInfo("nvcc", False, None, None, "not on PATH"), ())


def test_no_gpu_is_missing_with_what_to_do():
    (check,) = check_gpu(probe_gpus(FakeNvml(init_failure="no-driver")))
    # The preset `lucebox up` serves without a GPU: the cpu_default one, not the smoke test.
    assert check.verdict == "missing" and "'smollm2'" in check.action


def test_other_app_holding_6_gib_is_reported():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(processes=[(99999, 6 * GIB)])]))
    gpu_line, driver_line = check_gpu(probe)
    assert "1 other process(es) hold 6.0 GiB" in gpu_line.detail
    assert gpu_line.verdict == "ok"
    assert "580.159.04" in driver_line.detail and "13.0" in driver_line.detail


def test_every_gpu_is_listed_with_free_memory_and_load():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(), FakeGpu(name="NVIDIA RTX A4000")]))
    first, second = check_gpu(probe)[:2]
    assert first.name == "gpu0" and second.name == "gpu1"
    assert "NVIDIA RTX A4000" in second.detail and "free of" in second.detail
    assert "load 7%" in first.detail and "load 7%" in second.detail


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
    check = check_engine(
        resolve_paths(), probe_gpus(FakeNvml(init_failure="no-nvml")), "", probe_cpu()
    )
    assert check.verdict == "missing" and "lucebox engine build" in check.action


def test_every_check_has_an_action_unless_ok():
    report = run_doctor(resolve_paths(), probe_gpus(FakeNvml(gpus=[FakeGpu()])))
    assert report.checks
    for check in report.checks:
        assert check.verdict in {"ok", "warn", "missing"}
        assert check.verdict == "ok" or check.action


def test_node_rows_when_a_new_enough_node_is_found():
    node = nodejs.NodeInfo(
        ToolInfo("node", True, "/usr/bin/node", "20.20.2", "v20.20.2"),
        ToolInfo("npm", True, "/usr/bin/npm", "11.19.1", "11.19.1"),
        "system",
        True,
        "the system's node 20.20.2, npm 11.19.1",
    )
    node_row, npm_row = check_node(node)
    assert (node_row.name, node_row.verdict) == ("node", "ok")
    assert "20.20.2" in node_row.detail and "/usr/bin/node" in node_row.detail
    assert (npm_row.name, npm_row.verdict) == ("npm", "ok") and "11.19.1" in npm_row.detail


def test_node_rows_warn_with_the_way_out_when_node_is_old(tmp_path, monkeypatch):
    old_node_only(tmp_path, monkeypatch)
    node_row, npm_row = check_node(nodejs.probe_node(resolve_paths()))
    assert node_row.verdict == "warn" and "18.19.1 is older than 20.19" in node_row.detail
    assert nodejs.NODE_WHEEL in node_row.action
    assert npm_row.verdict == "warn" and "npm" in npm_row.detail


def test_webui_row_follows_the_selected_engine():
    paths = resolve_paths()
    no_gpu = probe_gpus(FakeNvml(init_failure="no-nvml"))
    assert check_webui(paths, no_gpu, "").verdict == "missing"
    folder = paths.engines_dir / "e"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "llama-server").write_text("", encoding="utf-8")
    manifest = EngineManifest(
        id="e",
        backend="cpu",
        cuda_archs=(),
        version="v",
        server_path=str(folder / "bin" / "llama-server"),
        origin="build",
        options={"backend": "cpu", "cpu_target": "x86-64-v3"},
        capabilities=EngineCapabilities((), (), None),
        webui=False,
        webui_detail="npm ci failed (1): FetchError: request failed",
    )
    (folder / "manifest.json").write_text(json.dumps(manifest.to_json()), encoding="utf-8")
    row = check_webui(paths, no_gpu, "")
    assert row.verdict == "warn" and "npm ci failed" in row.detail and row.action
    with_ui = dataclasses.replace(manifest, webui=True, webui_detail="")
    (folder / "manifest.json").write_text(json.dumps(with_ui.to_json()), encoding="utf-8")
    assert check_webui(paths, no_gpu, "").verdict == "ok"


def test_doctor_lists_node_npm_and_webui():
    report = run_doctor(resolve_paths(), probe_gpus(FakeNvml(init_failure="no-nvml")))
    names = [check.name for check in report.checks]
    assert {"node", "npm", "webui"} <= set(names)


def test_doctor_names_a_newer_known_build_and_the_command_that_updates():
    from lucebox.engine.doctor import check_engine_updates
    from lucebox.engine.engines import kinds
    from tests.engine.engines.test_update import installed_engine

    paths = resolve_paths()
    no_gpu = probe_gpus(FakeNvml(init_failure="no-driver"))
    newest = kinds.LLAMA_SERVER.known.newest
    installed_engine(paths, "current", newest.identity)
    assert check_engine_updates(paths, no_gpu, "current") == []
    older = kinds.LLAMA_SERVER.known.by_version("b11401")
    assert older is not None
    installed_engine(paths, "older", older.identity)
    (check,) = check_engine_updates(paths, no_gpu, "older")
    assert (check.name, check.verdict) == ("engine-update", "warn")
    assert newest.version in check.detail and "`lucebox engine update`" in check.action
