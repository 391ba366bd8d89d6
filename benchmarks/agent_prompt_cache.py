"""Benchmark: the agent-loop prompt cache, by replaying the shipped Claude Code session.

Runs `lucebox bench replay assets/agent-session.jsonl --compare cache=on,off` with
SmolLM2-135M-Instruct and the built CPU engine from the test cache (support/realmodels.py), in a
lucebox home of its own, and prints the per-configuration totals and the on/off ratios. The
issue's bar: warm-call TTFT with the cache at most a third of the run without, no empty reply.

    .venv/bin/python -m benchmarks.agent_prompt_cache [--n-gen 64] [--calls N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from support.realmodels import smol_model
from support.smolserver import private_engine_home

SESSION = Path(__file__).resolve().parents[1] / "assets" / "agent-session.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-gen", type=int, default=64)
    parser.add_argument("--calls", type=int)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lucebox-replay-") as folder:
        home = private_engine_home(Path(folder))
        argv = [
            sys.executable,
            "-m",
            "lucebox.app.cli",
            "bench",
            "replay",
            str(SESSION),
            "--compare",
            "cache=on,off",
            "--model",
            str(smol_model()),
            "--n-gen",
            str(args.n_gen),
            "--json",
        ]
        if args.calls:
            argv += ["--calls", str(args.calls)]
        done = subprocess.run(
            argv, env={**os.environ, "LUCEBOX_HOME": str(home)}, capture_output=True, text=True
        )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    configs = json.loads(done.stdout)["configs"]
    on, off = configs["cache=on"], configs["cache=off"]
    print(json.dumps(configs, indent=2))
    print(
        json.dumps(
            {
                "calls": len(on["calls"]),
                "ttft_total_s": {"on": on["ttft_total_s"], "off": off["ttft_total_s"]},
                "warm_ttft_total_s": {
                    "on": on["warm_ttft_total_s"],
                    "off": off["warm_ttft_total_s"],
                },
                "warm_ttft_ratio_on_off": round(
                    on["warm_ttft_total_s"] / off["warm_ttft_total_s"], 3
                ),
                "ttft_ratio_on_off": round(on["ttft_total_s"] / off["ttft_total_s"], 3),
                "wall_ratio_on_off": round(on["wall_s"] / off["wall_s"], 3),
                "empty": {"on": on["empty"], "off": off["empty"]},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
