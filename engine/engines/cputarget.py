"""The CPU instruction set an engine build targets, and whether a CPU can run it.

Every engine build, CPU and CUDA alike (both compile ggml's CPU backend), targets a named
baseline instead of ``-march=native``. A native build on a CPU with AMX enables ggml's AMX
matmul, whose worker threads run tile instructions without the tile state set up: the engine
dies of SIGILL on the first matmul (upstream llama.cpp pull request 26954). A native build
also dies on any other CPU it is copied to (the appliance image is compiled on a builder).
AMX stays off in every target until the pinned engine carries a working AMX fix.

A build made on this PC for this PC gets the fastest target the CPU runs: ``x86-64-v4-vnni``
(AVX-512 with VNNI, BF16 and VBMI: Ice Lake server, Sapphire Rapids, Zen 4 and later) where it
has all of it, else x86-64-v3 (AVX2, FMA, F16C, BMI2: Haswell and Zen 1 onwards), else
x86-64-v2. Measured on an AMX Xeon (benchmarks/results/cpu-cpu-baseline-cost.json), v3 prefilled
25-40% slower and decoded 5-8% slower than the AVX-512 target. A build that leaves the PC (the
image) names x86-64-v3, which every x86-64 CPU of the last decade runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.core.errors import UsageError
from lucebox.engine.machine.cpu import CpuInfo

_X86_OPTIONS = (
    "SSE42",
    "AVX",
    "AVX2",
    "FMA",
    "F16C",
    "BMI2",
    "AVX_VNNI",
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX_TILE",
    "AMX_INT8",
    "AMX_BF16",
)
"""ggml's x86 instruction-set switches, every one named ON or OFF in each target's line:
v3's are the first six, the AVX-512 target's all but AMX."""


def _x86_flags(*on: str) -> tuple[str, ...]:
    return (
        "-DGGML_NATIVE=OFF",
        *(f"-DGGML_{o}={'ON' if o in on else 'OFF'}" for o in _X86_OPTIONS),
    )


@dataclass(frozen=True)
class CpuTarget:
    """One baseline: the CPU features its code needs and the cmake flags that build it."""

    name: str
    needs: tuple[str, ...]
    """``/proc/cpuinfo`` flag names the build's code uses."""
    cmake_flags: tuple[str, ...]


X86_64_V2 = CpuTarget("x86-64-v2", ("sse4_2",), _x86_flags("SSE42"))
X86_64_V3 = CpuTarget(
    "x86-64-v3",
    ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"),
    _x86_flags(*_X86_OPTIONS[:6]),
)
X86_64_V4_VNNI = CpuTarget(
    "x86-64-v4-vnni",
    (
        *X86_64_V3.needs,
        "avx512f",
        "avx512cd",
        "avx512vl",
        "avx512dq",
        "avx512bw",
        "avx512vbmi",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
    ),
    _x86_flags(*(o for o in _X86_OPTIONS if not o.startswith("AMX"))),
)
GENERIC = CpuTarget("generic", (), ("-DGGML_NATIVE=OFF",))
"""Other architectures: ggml's portable default for the family (armv8-a on aarch64)."""

TARGETS = {t.name: t for t in (X86_64_V4_VNNI, X86_64_V3, X86_64_V2, GENERIC)}
DEFAULT = X86_64_V3.name
"""What a build that leaves the PC (the appliance image) targets."""


def named(name: str) -> CpuTarget:
    """A target by the name ``--cpu-target`` gives; an unknown name is refused."""
    if name not in TARGETS:
        raise UsageError(f"{name!r} is not a CPU target", hint=f"use one of {', '.join(TARGETS)}")
    return TARGETS[name]


X86_ARCHS = frozenset({"x86_64", "amd64"})


def target(name: str) -> CpuTarget:
    """The target of that name; an unknown name (a newer manifest) needs nothing known."""
    return TARGETS.get(name, CpuTarget(name, (), ()))


def below(target_name: str | None) -> CpuTarget | None:
    """The next baseline down from ``target_name``, the one a build that died of an illegal
    instruction is rebuilt for: v3 below a native or an AVX-512 build, v2 below v3; None at
    the floor (v2, ``generic``) and for a build whose baseline is not known."""
    if target_name in (NATIVE, X86_64_V4_VNNI.name):
        return X86_64_V3
    if target_name == X86_64_V3.name:
        return X86_64_V2
    return None


def choose_target(cpu: CpuInfo) -> CpuTarget:
    """The fastest target this CPU runs: the AVX-512 one where it has every feature of it, v3
    where it has v3's (or its features are not known), v2 below that; ``generic`` off x86."""
    if cpu.arch not in X86_ARCHS:
        return GENERIC
    if cpu.features is not None and not missing_features(X86_64_V4_VNNI, cpu):
        return X86_64_V4_VNNI
    return X86_64_V2 if missing_features(X86_64_V3, cpu) else X86_64_V3


def missing_features(build: CpuTarget, cpu: CpuInfo) -> tuple[str, ...]:
    """What the build needs that this CPU lacks; () when it runs (or the CPU is not known)."""
    if cpu.features is None:
        return ()
    return tuple(f for f in build.needs if f not in cpu.features)


NATIVE = "native"
"""A build made before lucebox chose a baseline: ``-march=native`` of the PC that compiled it."""


@dataclass(frozen=True)
class CpuFit:
    """Whether an installed build runs on this CPU, and why."""

    target: str | None
    """The build's baseline, ``native`` for an old build, None when not known (added, fetched)."""
    needs: tuple[str, ...]
    missing: tuple[str, ...]
    runs: bool | None
    """None when it cannot be known from here."""
    detail: str

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "needs": list(self.needs),
            "missing": list(self.missing),
            "runs": self.runs,
            "detail": self.detail,
        }


def fit(target_name: str | None, cpu: CpuInfo) -> CpuFit:
    """Whether a build for ``target_name`` runs on ``cpu``."""
    if target_name is None:
        return CpuFit(
            None, (), (), None, "built elsewhere: the CPU features it needs are not known"
        )
    if target_name == NATIVE:
        if cpu.features is not None and "amx_tile" in cpu.features:
            return CpuFit(
                NATIVE,
                (),
                (),
                False,
                "a native build on a CPU with AMX dies of an illegal instruction in ggml's AMX "
                "matmul",
            )
        return CpuFit(NATIVE, (), (), None, "built for the CPU that compiled it (-march=native)")
    build = target(target_name)
    if cpu.features is None:
        return CpuFit(build.name, build.needs, (), None, "this CPU's features are not known")
    missing = missing_features(build, cpu)
    if missing:
        return CpuFit(
            build.name,
            build.needs,
            missing,
            False,
            f"built for {build.name}, which needs {', '.join(missing)} that this CPU lacks",
        )
    return CpuFit(build.name, build.needs, (), True, f"built for {build.name}: this CPU runs it")
