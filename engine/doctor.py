"""``lucebox doctor``: what this machine can do, one verdict per line with what to do next."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import GIB, gib_text
from lucebox.engine.engines import kinds, nodejs, registry, toolchain, toolkit
from lucebox.engine.machine.cpu import CpuInfo, probe_cpu
from lucebox.engine.machine.gpu import GpuProbe
from lucebox.engine.models import modelupdate, presets
from lucebox.engine.models.hubrepo import HubUnreachableError
from lucebox.engine.models.records import list_models

Verdict = Literal["ok", "warn", "missing"]

DISK_WARN_BYTES = 30 * GIB
"""Below this a 24 GB-class model and its partial download no longer fit side by side."""
RAM_WARN_BYTES = 8 * GIB


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    verdict: Verdict
    detail: str
    action: str = ""
    """What to do about a warn or missing verdict; empty when ok."""


@dataclass(frozen=True)
class DoctorReport:
    probe: GpuProbe
    checks: tuple[Check, ...]


def check_gpu(probe: GpuProbe, cpu_preset: str = "smollm2") -> list[Check]:
    """``cpu_preset`` is the preset `lucebox up` serves without a GPU (the cpu_default one)."""
    if not probe.has_gpu:
        return [
            Check(
                "gpu",
                "missing",
                probe.detail,
                "install an NVIDIA RTX card and its driver; without one lucebox serves only "
                f"small models on the CPU (preset '{cpu_preset}')",
            )
        ]
    checks = []
    for gpu in probe.gpus:
        others = sum(p.used_bytes or 0 for p in gpu.processes)
        load = "not available" if gpu.utilization_percent is None else f"{gpu.utilization_percent}%"
        detail = (
            f"GPU {gpu.index}: {gpu.name}, {gib_text(gpu.vram_free_bytes)} free of "
            f"{gib_text(gpu.vram_total_bytes)}, load {load}, compute capability "
            f"{gpu.compute_capability or 'not available'}"
        )
        if gpu.processes:
            detail += f", {len(gpu.processes)} other process(es) hold {gib_text(others)}"
        verdict: Verdict = "ok"
        action = ""
        if gpu.mig_enabled:
            verdict, action = "warn", "MIG is on: lucebox sees only what one MIG instance gets"
        elif gpu.vram_free_bytes < gpu.vram_total_bytes // 2:
            verdict = "warn"
            action = "other programs hold much of the VRAM; close them for a larger model"
        checks.append(Check(f"gpu{gpu.index}", verdict, detail, action))
    checks.append(
        Check(
            "driver",
            "ok",
            f"NVIDIA driver {probe.driver_version or 'not available'}, "
            f"CUDA {probe.cuda_driver_version or 'not available'}",
        )
    )
    return checks


def check_cuda_toolkit(
    probe: GpuProbe,
    cuda: toolchain.CudaToolkitInfo,
    fetched: toolkit.FetchedToolkit | None,
    host: str,
) -> Check:
    """The toolkit that would build the CUDA engine: the system's, the fetched one, or none."""
    wanted = tuple(sorted({g.cuda_arch for g in probe.gpus if g.cuda_arch}))
    if not wanted:
        if fetched is not None:
            return Check("cuda-toolkit", "ok", toolkit.describe(fetched))
        if cuda.tool.found:
            return Check("cuda-toolkit", "ok", f"nvcc {cuda.tool.version} at {cuda.tool.path}")
        return Check("cuda-toolkit", "ok", "not needed without an NVIDIA GPU")
    try:
        choice = toolkit.choose_toolkit(probe, cuda, wanted, host=host)
    except toolkit.ToolkitRefusal as exc:
        return Check("cuda-toolkit", "missing", exc.message, exc.hint or "")
    archs = f"builds for the GPU's arch {', '.join(wanted)}"
    if choice.source == "system":
        return Check("cuda-toolkit", "ok", f"{choice.reason}; {archs}")
    if fetched is not None:
        return Check("cuda-toolkit", "ok", f"{toolkit.describe(fetched)}; {archs}")
    return Check("cuda-toolkit", "ok", f"{choice.reason} to build the engine; {archs}")


def check_tool(
    key: str, tool: toolchain.ToolInfo, action: str, minimum: tuple[int, ...] = ()
) -> Check:
    if not tool.found:
        return Check(key, "missing", tool.detail, action)
    detail = f"{tool.name} {tool.version or '(version unknown)'} at {tool.path}"
    if minimum and toolchain.version_tuple(tool.version) < minimum:
        wanted = ".".join(map(str, minimum))
        return Check(key, "warn", f"{detail}; {wanted} or newer is needed", action)
    return Check(key, "ok", detail)


def _existing_parent(folder: Path) -> Path:
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _cpu_preset(paths: Paths) -> str:
    found = [p.id for p in presets.load_presets(paths) if p.cpu_default]
    return found[0] if found else "smoke"


def check_disk(paths: Paths) -> Check:
    where = _existing_parent(paths.data_dir)
    usage = shutil.disk_usage(where)
    detail = f"{gib_text(usage.free)} free at {where} (models go to {paths.models_dir})"
    if usage.free < DISK_WARN_BYTES:
        return Check(
            "disk",
            "warn",
            detail,
            f"free at least {gib_text(DISK_WARN_BYTES)} for a 24 GB-class model, or point "
            "LUCEBOX_HOME to a larger disk",
        )
    return Check("disk", "ok", detail)


def check_ram() -> Check:
    memory = psutil.virtual_memory()
    detail = f"{gib_text(memory.total)} total, {gib_text(memory.available)} available"
    if memory.total < RAM_WARN_BYTES:
        return Check("ram", "warn", detail, "models that spill off the GPU will be slow")
    return Check("ram", "ok", detail)


def check_engine(paths: Paths, probe: GpuProbe, wanted_id: str, host_cpu: CpuInfo) -> Check:
    selection = registry.select_engine(paths, probe, wanted_id, host_cpu)
    engine = selection.engine
    if engine is None:
        return Check(
            "engine",
            "missing",
            selection.reason,
            "run `lucebox engine build` (or `lucebox engine fetch` / `engine add`)",
        )
    detail = f"{engine.id}: {engine.version} ({selection.reason})"
    if probe.has_gpu and engine.backend == "cpu":
        return Check(
            "engine",
            "warn",
            detail,
            "run `lucebox engine build` to build the CUDA engine for this GPU",
        )
    return Check("engine", "ok", detail)


def check_engine_updates(paths: Paths, probe: GpuProbe, wanted_id: str) -> list[Check]:
    """A warn line for each kind whose build in use has a newer known source."""
    checks = []
    for name, engine_kind in kinds.KINDS.items():
        engine = engine_kind.select(paths, probe, wanted_id).engine
        newer = kinds.newer_known(engine) if engine is not None else None
        if engine is None or newer is None:
            continue
        option = "" if engine_kind is kinds.LLAMA_SERVER else f" --engine {name}"
        checks.append(
            Check(
                "engine-update",
                "warn",
                f"{engine.id} is built from an older source than {newer.version} "
                f"({newer.date}), the newest known build of {engine_kind.title}",
                f"run `lucebox engine update{option}` (it self-tests the new build before "
                "it serves; `lucebox engine rollback` goes back)",
            )
        )
    return checks


def check_engine_cpu(paths: Paths, host_cpu: CpuInfo) -> list[Check]:
    """Each installed build against this CPU: the baseline it needs and what is missing."""
    checks = []
    for engine in registry.list_engines(paths):
        fit = registry.cpu_fit(paths, engine, host_cpu)
        needs = f" (needs {', '.join(fit.needs)})" if fit.needs else ""
        detail = f"{engine.id}: {fit.detail}{needs}"
        if fit.runs is False:
            action = f"run `{kinds.kind(engine.kind).build_command}` to build it for this CPU"
            checks.append(Check("engine-cpu", "missing", detail, action))
        elif fit.runs is None:
            checks.append(
                Check("engine-cpu", "warn", detail, "build one with `lucebox engine build`")
            )
        else:
            checks.append(Check("engine-cpu", "ok", detail))
    return checks


def check_node(node: nodejs.NodeInfo) -> list[Check]:
    """node and npm for building the web UI; optional, so never worse than warn."""
    minimum = ".".join(map(str, nodejs.NODE_MIN_VERSION))
    if node.usable:
        return [
            Check("node", "ok", f"{node.reason}; node at {node.node.path}"),
            Check("npm", "ok", f"npm {node.npm.version} at {node.npm.path}"),
        ]
    action = (
        f"`lucebox engine build` installs node from PyPI ({nodejs.NODE_WHEEL}) for the web UI, "
        f"or install node >= {minimum} with npm"
    )
    npm_detail = (
        f"npm {node.npm.version} at {node.npm.path}, unused without a new enough node"
        if node.npm.found
        else node.npm.detail
    )
    return [Check("node", "warn", node.reason, action), Check("npm", "warn", npm_detail, action)]


def check_webui(paths: Paths, probe: GpuProbe, wanted_id: str) -> Check:
    engine = registry.select_engine(paths, probe, wanted_id).engine
    if engine is None:
        return Check("webui", "missing", "no engine installed", "run `lucebox engine build`")
    if engine.webui:
        return Check("webui", "ok", f"{engine.id} serves the chat web UI at / of its address")
    return Check(
        "webui",
        "warn",
        f"{engine.id} has no web UI: {engine.webui_detail or 'it was not built with it'}",
        "run `lucebox engine build` where node and the npm registry can be reached",
    )


def check_models(paths: Paths) -> Check:
    records = list_models(paths)
    if not records:
        return Check(
            "models",
            "missing",
            f"no models in {paths.models_dir}",
            "`lucebox up` fetches one, or run `lucebox models pull SRC`",
        )
    size = sum(r.size_bytes for r in records)
    names = ", ".join(r.name for r in records[:4]) + (" ..." if len(records) > 4 else "")
    return Check("models", "ok", f"{len(records)} model(s), {gib_text(size)}: {names}")


def check_model_updates(paths: Paths) -> list[Check]:
    """A warn line for each model pulled from the Hub whose repo holds a newer revision of its
    files; one short request per repo. A Hub that does not answer makes one ok line saying the
    check could not be made (the doctor never fails for it)."""
    checks = []
    for record in (r for r in list_models(paths) if modelupdate.updatable(r)):
        try:
            found = modelupdate.check_revision(record, timeout_s=modelupdate.DOCTOR_TIMEOUT_S)
        except HubUnreachableError as exc:
            return [
                Check(
                    "model-update",
                    "ok",
                    f"could not check for newer model revisions: {exc.message}",
                )
            ]
        except LuceboxError as exc:
            checks.append(
                Check(
                    "model-update",
                    "ok",
                    f"{record.name}: could not check for a newer revision: {exc.message}",
                )
            )
            continue
        if found.newer:
            checks.append(
                Check(
                    "model-update",
                    "warn",
                    f"{record.name}: {found.repo_id} has a newer revision "
                    f"{found.newest[:12]} ({', '.join(found.changed)} changed)",
                    f"run `lucebox models update {record.name}` (guards and a load test "
                    f"first; `lucebox models rollback {record.name}` goes back)",
                )
            )
    return checks


def run_doctor(paths: Paths, probe: GpuProbe, wanted_engine_id: str = "") -> DoctorReport:
    """Run every check; blocking (runs tools), so front ends call it from a worker."""
    build_hint = "install it with your package manager (e.g. `apt install cmake g++`)"
    checks = [
        *check_gpu(probe, _cpu_preset(paths)),
        check_cuda_toolkit(
            probe,
            toolchain.probe_cuda_toolkit(),
            toolkit.fetched_toolkit(paths),
            toolkit.host_machine(),
        ),
        check_tool("cmake", toolchain.probe_cmake(), build_hint, toolchain.CMAKE_MIN_VERSION),
        check_tool("c-compiler", toolchain.probe_c_compiler(), build_hint),
        check_tool("cxx-compiler", toolchain.probe_cxx_compiler(), build_hint),
        check_disk(paths),
        check_ram(),
    ]
    checks += check_node(nodejs.probe_node(paths))
    host_cpu = probe_cpu()
    checks += [check_engine(paths, probe, wanted_engine_id, host_cpu)]
    checks += check_engine_cpu(paths, host_cpu)
    checks += check_engine_updates(paths, probe, wanted_engine_id)
    checks += [check_webui(paths, probe, wanted_engine_id), check_models(paths)]
    checks += check_model_updates(paths)
    return DoctorReport(probe, tuple(checks))
