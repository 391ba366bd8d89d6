"""The build tools on this machine: cmake, C/C++ compilers, the CUDA toolkit, ccache.

Each probe runs the tool's own version command once with a timeout and parses its answer;
a missing or broken tool is a value (``found=False``), not an exception.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VERSION_TIMEOUT_S = 15.0
CMAKE_MIN_VERSION = (3, 18)
"""3.14 builds the CPU engine; ggml's CUDA backend needs 3.18 (contract 1.1)."""


@dataclass(frozen=True)
class ToolInfo:
    """One build tool: where it is and which version it says it is."""

    name: str
    found: bool
    path: str | None
    version: str | None
    detail: str


@dataclass(frozen=True)
class CudaToolkitInfo:
    """nvcc and the GPU architectures it can compile for."""

    tool: ToolInfo
    archs: tuple[str, ...]
    """Compute capabilities nvcc can target, as CMAKE_CUDA_ARCHITECTURES values ("90")."""


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout + done.stderr


def probe_tool(name: str, candidates: tuple[str, ...], pattern: str) -> ToolInfo:
    """Find the first of ``candidates`` on PATH and read its version with ``pattern``."""
    for candidate in candidates:
        path = shutil.which(candidate)
        if path is None:
            continue
        output = _run([path, "--version"])
        if output is None:
            return ToolInfo(name, False, path, None, f"{path} does not run")
        match = re.search(pattern, output)
        version = match.group(1) if match else None
        first_line = output.strip().splitlines()[0] if output.strip() else ""
        return ToolInfo(name, True, path, version, first_line)
    return ToolInfo(name, False, None, None, f"none of {', '.join(candidates)} is on PATH")


def probe_cmake() -> ToolInfo:
    return probe_tool("cmake", ("cmake",), r"cmake version (\d+\.\d+(?:\.\d+)?)")


def probe_c_compiler() -> ToolInfo:
    return probe_tool("C compiler", ("cc", "gcc", "clang"), r"(\d+\.\d+(?:\.\d+)?)")


def probe_cxx_compiler() -> ToolInfo:
    return probe_tool("C++ compiler", ("c++", "g++", "clang++"), r"(\d+\.\d+(?:\.\d+)?)")


def probe_ccache() -> ToolInfo:
    return probe_tool("ccache", ("ccache",), r"version (\d+\.\d+(?:\.\d+)?)")


def cuda_homes() -> tuple[Path, ...]:
    """Where a system CUDA toolkit is by convention (it is often installed but not on PATH)."""
    named = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    return tuple(Path(root) for root in named if root)


def _nvcc_candidates() -> tuple[str, ...]:
    found = ["nvcc"]
    for root in cuda_homes():
        if (root / "bin" / "nvcc").is_file():
            found.append(str(root / "bin" / "nvcc"))
    return tuple(found)


def probe_cuda_toolkit() -> CudaToolkitInfo:
    tool = probe_tool("CUDA toolkit (nvcc)", _nvcc_candidates(), r"release (\d+\.\d+)")
    if tool.found and tool.version is None:
        # A wrapper script left behind by a removed toolkit runs but compiles nothing.
        tool = ToolInfo(tool.name, False, tool.path, None, f"{tool.path} reports no CUDA release")
    archs: tuple[str, ...] = ()
    if tool.found and tool.path:
        listing = _run([tool.path, "--list-gpu-arch"]) or ""
        archs = tuple(sorted(set(re.findall(r"compute_(\d+)", listing)), key=int))
    return CudaToolkitInfo(tool, archs)


def version_tuple(version: str | None) -> tuple[int, ...]:
    """ "3.25.1" -> (3, 25, 1); unknown -> ()."""
    if not version:
        return ()
    return tuple(int(part) for part in re.findall(r"\d+", version))
