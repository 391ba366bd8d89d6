"""Benchmark: the CPU one `lucebox status --json` costs (the bar: under 0.1 s).

Writes a state file as a running server does (this process stands in for the server, so the
status reads as ready with a full sample) into a temporary LUCEBOX_HOME, then runs the
installed `lucebox` console script N times and reads each run's user + system CPU time. For
comparison it also runs the full command line (`python -m lucebox.app.cli status --json`)
and a bare `python -c pass`.

    .venv/bin/python -m benchmarks.status_cost [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run import runstate
from lucebox.engine.run.sample import CacheStatus, Sample, SpecStatus


def cpu_s(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="lucebox-status-bench-"))
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    paths = resolve_paths(env)
    sample = Sample(time.time(), 88.5, 240.0, 0.05, None, None, None, 12.0, 2**28, 1)
    runstate.write_status(
        paths,
        runstate.Status(
            "ready",
            pid=os.getpid(),
            url="http://127.0.0.1:8080",
            model="smol",
            started_at=time.time(),
            ctx=4096,
            sample=sample,
            spec=SpecStatus("draft-simple", True, "as planned", 0.9, 2.7),
            cache=CacheStatus(0.4, 0, 24, 12),
        ),
    )
    script = shutil.which("lucebox", path=str(Path(sys.executable).parent))
    assert script is not None, "the lucebox console script is not installed in this venv"
    commands = {
        "lucebox status --json": [script, "status", "--json"],
        "python -m lucebox.app.cli status --json": [
            sys.executable,
            *("-m", "lucebox.app.cli", "status", "--json"),
        ],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    results = {}
    for name, argv in commands.items():
        runs = [cpu_s(argv, env) for _ in range(args.runs)]
        results[name] = {
            "cpu_s_median": round(statistics.median(runs), 4),
            "cpu_s_max": round(max(runs), 4),
        }
    shutil.rmtree(home)
    print(json.dumps({"runs": args.runs, "commands": results}, indent=1))


if __name__ == "__main__":
    main()
