"""Benchmark: what serving a vision projector does to an agent's prompt reuse (issue 44).

llama-server with a projector loaded turns off context shift and keeps no checkpoints after
image chunks; whether a text-only agent loop still reuses its prompt is measured here: the
shipped Claude Code session replayed by `lucebox bench replay --compare vision=on,off`, on a
generated text model with its generated LLaVA projector beside it (support/ggufgen.py, the ones
the vision tests serve) on the built CPU engine of the test cache, in a home of its own.

    .venv/bin/python -m benchmarks.vision_prompt_reuse [--n-gen 16] [--calls N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from support.ggufgen import ModelSpec, ProjectorSpec, write_gguf
from support.smolserver import private_engine_home

SESSION = Path(__file__).resolve().parents[1] / "assets" / "agent-session.jsonl"
CTX = 16384
"""The session's longest call fits (about 11K tokens)."""


def summary(configs: dict[str, Any]) -> dict[str, Any]:
    """Per side: TTFT totals, the prompt tokens reused from the cache, empty replies; and the
    on/off ratios."""
    sides = {}
    for name, result in configs.items():
        calls = result["calls"]
        sides[name] = {
            "calls": len(calls),
            "ttft_total_s": result["ttft_total_s"],
            "warm_ttft_total_s": result["warm_ttft_total_s"],
            "cached_tokens_total": sum(c.get("cached_tokens") or 0 for c in calls),
            "empty": result["empty"],
        }
    on, off = sides["vision=on"], sides["vision=off"]
    return {
        "sides": sides,
        "warm_ttft_ratio_on_off": round(on["warm_ttft_total_s"] / off["warm_ttft_total_s"], 3),
        "cached_tokens_ratio_on_off": round(
            on["cached_tokens_total"] / max(1, off["cached_tokens_total"]), 3
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-gen", type=int, default=16)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lucebox-vision-replay-") as folder:
        work = Path(folder)
        model = write_gguf(work / "tiny-vision.gguf", ModelSpec(n_ctx=32768))
        write_gguf(work / "mmproj-tiny-vision-F16.gguf", ProjectorSpec())  # found beside it
        home = private_engine_home(work / "home")
        argv = [sys.executable, "-m", "lucebox.app.cli", "bench", "replay", str(SESSION)]
        argv += ["--compare", "vision=on,off", "--model", str(model), "--ctx", str(CTX)]
        argv += ["--n-gen", str(args.n_gen), "--json"]
        if args.calls:
            argv += ["--calls", str(args.calls)]
        done = subprocess.run(
            argv, env={**os.environ, "LUCEBOX_HOME": str(home)}, capture_output=True, text=True
        )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    result = summary(json.loads(done.stdout)["configs"])
    result["command"] = "python -m benchmarks.vision_prompt_reuse " + " ".join(sys.argv[1:])
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
