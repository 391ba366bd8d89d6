"""The engine's own estimate of a launch: llama-fit-params run on the same flags, set beside
the plan's memory so the two can be compared (``plan`` prints both)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from lucebox.engine.core.units import MIB
from lucebox.engine.plan.launch import engine_environ
from lucebox.engine.plan.launchplan import LaunchPlan

FIT_TIMEOUT_S = 120.0


def fit_check(launch: LaunchPlan) -> dict[str, Any] | None:
    """Ask the built engine's llama-fit-params for its estimate of the same launch."""
    tool = Path(launch.engine.server_path).with_name("llama-fit-params")
    if launch.engine.id is None or not tool.is_file() or not launch.target.present:
        return None
    argv = [str(tool), "-m", str(launch.target.path), "--fit-print", "on"]
    argv += launch.plan.server_flags()
    # The target alone (the draft is not its business), without the server's own flags.
    for server_only in ("--fit", "--cache-ram", "--ctx-checkpoints"):
        argv = _without_flag(argv, server_only)
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=FIT_TIMEOUT_S,
            check=False,
            env=engine_environ(launch.server, os.environ),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [
        line.split()
        for line in done.stdout.splitlines()
        if re.match(r"^\S+( \d+){3}\s*$", line.strip())
    ]
    if not rows:
        return None
    device_rows = [r for r in rows if r[0] != "Host"] or rows
    model_mib, context_mib, compute_mib = (sum(int(r[i]) for r in device_rows) for i in (1, 2, 3))
    engine_total = (model_mib + context_mib + compute_mib) * MIB
    memory = launch.plan.memory_bytes
    ours = memory.weights + memory.kv + memory.compute
    return {
        "device": ",".join(r[0] for r in device_rows),
        "model_mib": model_mib,
        "context_mib": context_mib,
        "compute_mib": compute_mib,
        "difference_percent": round(100 * (ours - engine_total) / max(engine_total, 1), 1),
    }


def _without_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (llama-fit-params does not take every flag)."""
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item == flag:
            skip = True
        else:
            out.append(item)
    return out
