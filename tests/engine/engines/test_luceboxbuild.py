"""Building dflash_server: one arch, the measured configure line, offline JSON headers."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.engines import bsa, cputarget, kinds, lucebox, luceboxbuild
from lucebox.engine.engines.build import BuildOptions, parse_archs
from lucebox.engine.engines.source import SourceInfo
from tests.engine.engines.test_bsa import BSA_TARBALL, needs_bsa_tarball
from tests.engine.engines.test_build import FETCHED, H100, NO_GPU, NO_NVCC, NVCC, RTX_3090
from tests.engine.engines.test_cputarget import HASWELL, XEON_AMX
from tests.engine.engines.test_lucebox_source import (
    DEFAULT,
    DEFAULT_TARBALL,
    OLDER,
    needs_tarball,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"
SOURCE = SourceInfo(Path("/src/lucebox"), "pin", lucebox.PIN.identity, None)
OPTIONS = BuildOptions("cuda", ("86",), toolkit="system CUDA 13.0", webui=False)


@pytest.mark.parametrize(
    ("probe", "cuda", "arch", "chosen", "kit"),
    [
        (RTX_3090, NVCC, None, "86", "system CUDA 13.0"),
        (H100, NVCC, None, "90", "system CUDA 13.0"),
        (H100, NO_NVCC, None, "90", FETCHED),
        (NO_GPU, NVCC, "86", "86", "system CUDA 13.0"),
        (NO_GPU, NVCC, "8.9", "89", "system CUDA 13.0"),
    ],
)
def test_one_arch_from_the_card_or_from_arch(probe, cuda, arch, chosen, kit):
    archs = parse_archs(arch) if arch else ()
    choice = kinds.LUCEBOX.choose_build(probe, cuda, archs=archs, cpu=HASWELL)
    assert choice.options == BuildOptions(
        "cuda", (chosen,), toolkit=kit, webui=False, cpu_target="x86-64-v3"
    )
    assert f"arch {chosen}" in choice.reason


def test_no_nvidia_gpu_and_no_arch_is_refused():
    with pytest.raises(GuardRefusal, match="only on NVIDIA GPUs") as refused:
        kinds.LUCEBOX.choose_build(NO_GPU, NVCC)
    assert "--arch" in (refused.value.hint or "")


def test_one_arch_per_build_and_cuda_only():
    with pytest.raises(UsageError, match="one CUDA arch at a time"):
        kinds.LUCEBOX.choose_build(NO_GPU, NVCC, archs=("86", "89"))
    with pytest.raises(UsageError, match="CUDA only"):
        kinds.LUCEBOX.choose_build(RTX_3090, NVCC, want="cpu")


def test_the_configure_line_is_the_measured_one_and_offline(tmp_path):
    argv = luceboxbuild.configure_argv(
        SOURCE, tmp_path / "build", OPTIONS, json_config_dir=tmp_path / "json"
    )
    assert argv[:5] == ["cmake", "-S", "/src/lucebox/server", "-B", str(tmp_path / "build")]
    assert argv[5:] == [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_CUDA_ARCHITECTURES=86",
        "-DDFLASH27B_ENABLE_BSA=OFF",
        "-DDFLASH27B_FA_ALL_QUANTS=OFF",
        "-DDFLASH27B_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-Dnlohmann_json_DIR={tmp_path / 'json'}",
        *cputarget.X86_64_V3.cmake_flags,
    ]
    assert luceboxbuild.build_argv(tmp_path / "build", 16) == [
        "cmake", "--build", str(tmp_path / "build"), "--target", "dflash_server", "-j", "16",
    ]  # fmt: skip


@needs_tarball
def test_the_default_source_is_configured_with_the_same_line_from_its_own_tree(tmp_path):
    """The default source keeps every switch the line sets (its CMakeLists is read from the
    shared tarball, unpacked and checked); the line differs only in the tree it names, and
    the build key and engine id follow the source, not its folder."""
    from lucebox.engine.core.paths import resolve_paths

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = lucebox.ensure_source(paths, source_dir=tmp_path / "lucebox", tarball=DEFAULT_TARBALL)
    assert source.identity == DEFAULT.identity
    argv = luceboxbuild.configure_argv(
        source, tmp_path / "build", OPTIONS, json_config_dir=tmp_path / "json"
    )
    assert argv == [
        "cmake",
        "-S",
        str(tmp_path / "lucebox" / "server"),
        "-B",
        str(tmp_path / "build"),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_CUDA_ARCHITECTURES=86",
        "-DDFLASH27B_ENABLE_BSA=OFF",
        "-DDFLASH27B_FA_ALL_QUANTS=OFF",
        "-DDFLASH27B_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-Dnlohmann_json_DIR={tmp_path / 'json'}",
        *cputarget.X86_64_V3.cmake_flags,
    ]
    cmake_lists = (lucebox.server_dir(source) / "CMakeLists.txt").read_text()
    for switch in ("DFLASH27B_FA_ALL_QUANTS", "DFLASH27B_TESTS", "DFLASH27B_ENABLE_BSA"):
        assert switch in cmake_lists
    assert "find_package(nlohmann_json CONFIG" in cmake_lists
    assert "dflash_server" in cmake_lists
    key = luceboxbuild.build_key(source, OPTIONS)
    assert key == luceboxbuild.build_key(SOURCE, OPTIONS)
    older = SourceInfo(Path("/src/lucebox"), "pin", OLDER.identity, None)
    assert key != luceboxbuild.build_key(older, OPTIONS)
    assert (
        luceboxbuild.engine_id_for(source, OPTIONS, key) == f"lucebox-4cf58a04-cuda-sm86-{key[:8]}"
    )
    assert luceboxbuild.engine_id_for(older, OPTIONS, key).startswith("lucebox-62880e20-")


@needs_bsa_tarball
@pytest.mark.parametrize(
    ("arch", "with_bsa", "why"),
    [("86", True, ""), ("90", True, ""), ("75", False, "sm_75 is older than sm_80")],
)
def test_bsa_is_built_for_sm_80_and_newer_when_its_checked_source_is_there(
    tmp_path, arch, with_bsa, why
):
    """The whole configure line with BSA and without it: only the BSA switch differs, and
    the build key follows it (a build made before BSA came is not reused for one with it)."""
    from lucebox.engine.core.paths import resolve_paths

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = SourceInfo(tmp_path / "lucebox", "pin", lucebox.PIN.identity, None)
    options = BuildOptions("cuda", (arch,), toolkit="system CUDA 13.0", webui=False)
    without = luceboxbuild.bsa_for(source, options)
    assert not without.present
    assert without.detail.startswith("no BSA: PFlash runs the slow fallback")
    bsa.ensure(paths, source, tarball=BSA_TARBALL, online=False)
    state = luceboxbuild.bsa_for(source, options)
    assert state.present is with_bsa
    assert why in state.detail

    def line(on: bool) -> list[str]:
        return luceboxbuild.configure_argv(
            source, tmp_path / "build", options, json_config_dir=tmp_path / "json", with_bsa=on
        )[5:]

    assert line(state.present) == [
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
        f"-DDFLASH27B_ENABLE_BSA={'ON' if with_bsa else 'OFF'}",
        "-DDFLASH27B_FA_ALL_QUANTS=OFF",
        "-DDFLASH27B_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-Dnlohmann_json_DIR={tmp_path / 'json'}",
        *cputarget.X86_64_V3.cmake_flags,
    ]
    assert [a for a in line(False) if a not in line(True)] == ["-DDFLASH27B_ENABLE_BSA=OFF"]
    assert luceboxbuild.build_key(source, options, with_bsa=True) != luceboxbuild.build_key(
        source, options
    )
    manifest = luceboxbuild.manifest_for(
        paths,
        source,
        options,
        "k" * 16,
        luceboxbuild.capabilities_of("", b"", None, symmetric_only=True),
        {},
        state,
    )
    assert manifest.options["bsa"] is with_bsa
    assert manifest.options["bsa_note"] == state.detail


def test_a_fetched_toolkit_is_named_to_cmake(tmp_path):
    options = BuildOptions("cuda", ("86",), toolkit=FETCHED, webui=False)
    argv = luceboxbuild.configure_argv(
        SOURCE, tmp_path, options, json_config_dir=tmp_path, toolkit_root=Path("/tk")
    )
    assert "-DCMAKE_CUDA_COMPILER=/tk/bin/nvcc" in argv
    assert "-DCMAKE_BUILD_RPATH=$ORIGIN" in argv


def test_the_build_key_follows_arch_and_source_not_paths():
    key = luceboxbuild.build_key(SOURCE, OPTIONS)
    moved = SourceInfo(Path("/elsewhere"), "pin", lucebox.PIN.identity, None)
    assert luceboxbuild.build_key(moved, OPTIONS) == key
    other_arch = BuildOptions("cuda", ("89",), toolkit="system CUDA 13.0", webui=False)
    assert luceboxbuild.build_key(SOURCE, other_arch) != key
    assert luceboxbuild.build_key(SOURCE, OPTIONS) == key


def test_the_json_package_file_points_at_the_headers(tmp_path):
    folder = luceboxbuild.write_json_config(tmp_path, Path("/opt/json/include"))
    text = (folder / "nlohmann_jsonConfig.cmake").read_text()
    assert "add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)" in text
    assert 'INTERFACE_INCLUDE_DIRECTORIES "/opt/json/include"' in text


@needs_tarball
def test_model_archs_are_read_from_the_pinned_source(tmp_path):
    with tarfile.open(DEFAULT_TARBALL) as tar:
        member = tar.extractfile("server/src/common/backend_factory.cpp")
        assert member is not None
        text = member.read().decode()
    archs = luceboxbuild.parse_model_archs(text)
    assert archs == ("qwen35", "qwen35moe", "laguna", "qwen3", "gemma4", "deepseek4")


def test_engine_status_lists_both_kinds_and_llama_server_is_selected_for_llama(tmp_path):
    """A Lucebox engine installed beside llama-server: both listed with their kind; the
    llama-server selection never picks dflash_server (the planner chooses the kind)."""
    import json

    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.engines.registry import list_engines, select_engine
    from tests.engine.engines.test_build import H100

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    recorded = json.loads((FIXTURES / "manifest.json").read_text())
    for engine_id, kind, server in (
        ("lucebox-62880e20-cuda-sm90-9982e975", "lucebox", "dflash_server"),
        ("llama.cpp-b11434-cuda-sm90-0123abcd", "llama-server", "llama-server"),
    ):
        folder = paths.engines_dir / engine_id / "bin"
        folder.mkdir(parents=True)
        (folder / server).write_bytes(b"")
        manifest = {
            **recorded,
            "id": engine_id,
            "kind": kind,
            "server_path": str(folder / server),
            "options": {**recorded["options"], "cpu_target": "x86-64-v3"},
        }
        (folder.parent / "manifest.json").write_text(json.dumps(manifest))
    engines = list_engines(paths)
    assert sorted(e.to_json()["kind"] for e in engines) == ["llama-server", "lucebox"]
    lucebox_engine = luceboxbuild.installed(paths, cpu=XEON_AMX)
    assert lucebox_engine is not None and lucebox_engine.capabilities.features[-1] == (
        "symmetric-kv-only"
    )
    selected = select_engine(paths, H100).engine
    assert selected is not None and selected.kind == "llama-server"


def test_a_native_build_recorded_before_the_baseline_is_passed_over_on_an_amx_cpu(tmp_path):
    """The GPU machine's recorded manifest predates the CPU baseline: on a CPU with AMX it is
    never chosen (lucebox builds again), and engine status says why and what to run."""
    import json

    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.engines.registry import list_engines

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    recorded = json.loads((FIXTURES / "manifest.json").read_text())
    assert "cpu_target" not in recorded["options"]
    folder = paths.engines_dir / recorded["id"] / "bin"
    folder.mkdir(parents=True)
    (folder / "dflash_server").write_bytes(b"")
    manifest = {**recorded, "server_path": str(folder / "dflash_server")}
    (folder.parent / "manifest.json").write_text(json.dumps(manifest))
    (engine,) = list_engines(paths)
    assert engine.cpu_target == cputarget.NATIVE
    assert luceboxbuild.installed(paths, cpu=XEON_AMX) is None
    assert cputarget.fit(engine.cpu_target, XEON_AMX).runs is False
    assert luceboxbuild.installed(paths, cpu=HASWELL) == engine
