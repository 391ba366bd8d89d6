"""Benchmark: how far apart do two launches of the same plan decode, and why (issue 56)?

Two default launches of one pair on one H100 once decoded 1,508 and 1,832 tok/s at the same
acceptance. This serves the same options LAUNCHES times in a row (`lucebox serve --detach`,
`down` between, the idle calibration held off so nothing else runs on the card), sends CHATS
streamed chats to each (greedy, a fresh prompt each, as `engine_choice_on_auto` sends them), and
samples the GPU's clocks, power, temperature and throttle reasons every 100 ms with nvidia-smi
meanwhile. For each chat: its decode rate as the client saw it and the card's mean SM clock
while it decoded; per launch the median, and over launches the spread; the first chat of each
launch apart (warm-up), and the rates against the SM clock (clocks).

    python3 -m benchmarks.decode_spread_gpu OUT.json --serve-args "--model T --draft D"
        [--engines lucebox,llama-server] [--launches 5] [--chats 8]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.conversation_after_restart_gpu import _cli, _serve
from benchmarks.engine_choice_on_auto import chats

SAMPLED = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
"""What nvidia-smi samples; the throttle reasons as its bit mask (0x1 idle, 0x4 power cap,
0x20/0x40 thermal)."""


def _sampler(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SAMPLED}", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=path.open("w"),
        stderr=subprocess.DEVNULL,
    )


def _samples(path: Path) -> list[tuple[float, float, float, float, float, str]]:
    rows = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        try:
            at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append(
                (at, float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), parts[5])
            )
        except ValueError:
            continue
    return rows


def _during(rows: list, start: float, end: float) -> dict[str, Any]:
    inside = [r for r in rows if start <= r[0] <= end]
    if not inside:
        return {"samples": 0}
    return {
        "samples": len(inside),
        "sm_mhz": round(statistics.mean(r[1] for r in inside)),
        "mem_mhz": round(statistics.mean(r[2] for r in inside)),
        "power_w": round(statistics.mean(r[3] for r in inside), 1),
        "temp_c": max(r[4] for r in inside),
        "reasons": sorted({r[5] for r in inside}),
    }


def one_launch(engine: str, args: argparse.Namespace, samples_path: Path) -> dict[str, Any]:
    options = [*shlex.split(args.serve_args), "--engine", engine]
    started = time.time()
    url = _serve(options)
    ready_s = time.time() - started
    windows = []
    for _ in range(args.chats):
        start = time.time()
        seen = chats(url, 1, 0.0)[0]
        windows.append((start + seen["ttft_s"], start + seen["total_s"], seen))
    _cli("down", timeout_s=180)
    rows = _samples(samples_path)
    replies = [{**seen, **_during(rows, start, end)} for start, end, seen in windows]
    rates = [r["decode_tok_s"] for r in replies]
    return {
        "ready_s": round(ready_s, 1),
        "replies": replies,
        "first_tok_s": rates[0],
        "rest_median_tok_s": statistics.median(rates[1:]) if len(rates) > 1 else None,
    }


def summary(launches: list[dict[str, Any]]) -> dict[str, Any]:
    medians = [launch["rest_median_tok_s"] for launch in launches if launch["rest_median_tok_s"]]
    firsts = [launch["first_tok_s"] for launch in launches]
    replies = [r for launch in launches for r in launch["replies"][1:] if r.get("samples")]
    clocks = sorted((r["sm_mhz"], r["decode_tok_s"]) for r in replies)
    half = len(clocks) // 2
    return {
        "launch_medians_tok_s": medians,
        "across_launches_spread": round((max(medians) - min(medians)) / max(medians), 3)
        if medians
        else None,
        "first_chat_vs_rest": round(statistics.median(firsts) / statistics.median(medians), 3)
        if medians
        else None,
        "low_clock_half_tok_s": statistics.median(r for _, r in clocks[:half]) if half else None,
        "high_clock_half_tok_s": statistics.median(r for _, r in clocks[half:]) if half else None,
        "sm_mhz_range": [clocks[0][0], clocks[-1][0]] if clocks else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--serve-args", required=True)
    parser.add_argument("--engines", default="lucebox,llama-server")
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--chats", type=int, default=8)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "command": "python3 -m benchmarks.decode_spread_gpu " + shlex.join(sys.argv[1:]),
        "path": "lucebox serve --detach with the engine pinned, the idle calibration held off",
    }
    samples_path = args.out.with_suffix(".smi.csv")
    sampler = _sampler(samples_path)
    _cli("config", "set", "spec.calibrate_idle_s", "100000")
    try:
        for engine in args.engines.split(","):
            launches = [one_launch(engine, args, samples_path) for _ in range(args.launches)]
            result[engine] = {"launches": launches, "summary": summary(launches)}
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        _cli("config", "set", "spec.calibrate_idle_s", "30")
        sampler.terminate()
    print(json.dumps({e: result[e]["summary"] for e in args.engines.split(",") if e in result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
