"""Benchmark: does the mode the speculation calibration keeps decode within 5% of the best mode
`bench quick` measures at the same sampling (issue 56's CPU check)?

`lucebox serve` of a generated qwen3 target with a draft that always agrees (context 12288, the
calibration on after one idle second, 48-token probes), on the built CPU engine, in a home of its
own: the calibration measures none, the draft, n-gram lookup and n-gram in front of the draft
(its rewrite probe gives n-gram a file to copy), and keeps one. Then `bench quick --compare
spec=on,off,draft,ngram` RUNS times at the calibration's sampling; each mode's rate over the
probes, weighed as the calibration weighs them, and the kept mode's (spec=on) ratio to the
best: per run, and over each mode's best run (a busy machine only ever slows a run).

    python -m benchmarks.spec_verdict_near_best [--runs 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.speculation.measurements import store_file
from lucebox.engine.run.calibrate.probes import PROBES
from support.ggufgen import cached_gguf, qwen3_pair
from support.ports import free_port
from support.smolserver import private_engine_home

CTX = 12288
"""Holds the rewrite probe and bench's long question in the generated vocabulary, where a
character is a token."""
N_GEN = 48
CALIBRATION_S = 900.0
CLI = [sys.executable, "-m", "lucebox.app.cli"]


def _lucebox(home: Path, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, check=False, timeout=timeout_s
    )


def _stored(home: Path) -> dict[str, Any]:
    path = store_file(resolve_paths({"LUCEBOX_HOME": str(home)}))
    entries = json.loads(path.read_text())["entries"] if path.exists() else {}
    return next(iter(entries.values()), {})


def calibrate(home: Path, target: Path, draft: Path) -> dict[str, Any]:
    """Serve until the calibration has kept a mode; its store entry."""
    port = str(free_port())
    argv = [*CLI, "serve", "--model", str(target), "--draft", str(draft), "--ctx", str(CTX)]
    serve = subprocess.Popen(
        [*argv, "--port", port],
        env={**os.environ, "LUCEBOX_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + CALIBRATION_S
        while time.monotonic() < deadline and not _stored(home).get("chosen"):
            if serve.poll() is not None:
                raise RuntimeError(f"serve ended ({serve.returncode}) before a verdict")
            time.sleep(1)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    return _stored(home)


def probes_tok_s(samples: dict[str, Any]) -> float:
    """Decode over the calibration's probes as it weighs them (each by the tokens it asks for,
    capped), from `bench quick --json`'s samples."""
    timed = [(min(N_GEN, p.max_tokens), samples[p.name]["decode_tok_s"]) for p in PROBES]
    timed = [(weight, rate) for weight, rate in timed if rate]
    return sum(w for w, _ in timed) / sum(w / rate for w, rate in timed)


def bench_modes(home: Path, target: Path, draft: Path) -> dict[str, Any]:
    """Each mode's rate over the probes, and the sampling bench quick sent."""
    done = _lucebox(
        home, "bench", "quick", "--compare", "spec=on,off,draft,ngram", "--model", str(target),
        "--draft", str(draft), "--ctx", str(CTX), "--n-gen", str(N_GEN), "--json",
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench quick failed: {done.stderr[-1500:]}")
    document = json.loads(done.stdout)
    rates = {name: round(probes_tok_s(samples), 1) for name, samples in document["configs"].items()}
    return {"rates_tok_s": rates, "sampling": document["sampling"]}


def kept_ratio(rates: dict[str, float]) -> float:
    return round(rates["spec=on"] / max(rates.values()), 3)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lucebox-verdict-"))
    home = private_engine_home(folder / "home")
    for key, value in (("spec.calibrate_idle_s", "1"), ("spec.probe_max_tokens", str(N_GEN))):
        _lucebox(home, "config", "set", key, value)
    pair = qwen3_pair(agree_token="hello", extra_kv={"general.sampling.temp": 0.0}, n_ctx=CTX)
    target, draft = (cached_gguf(spec) for spec in pair)
    entry = calibrate(home, target, draft)
    _lucebox(home, "config", "set", "spec.calibrate_idle_s", "0")
    runs = [bench_modes(home, target, draft) for _ in range(args.runs)]
    rates = [run["rates_tok_s"] for run in runs]
    best = {name: max(run[name] for run in rates) for name in rates[0]}
    result = {
        "command": "python -m benchmarks.spec_verdict_near_best " + shlex.join(sys.argv[1:]),
        "path": "lucebox serve with its calibration on (nothing pinned), then bench quick with "
        "each mode forced, at the calibration's sampling",
        "load_average": os.getloadavg(),
        "sampling": entry["key"]["sampling"],
        "kept": entry["chosen"],
        "trials": {t["label"]: t["tok_s"] for t in entry["trials"]},
        "why": entry.get("why"),
        "bench_runs": [{**run, "kept_vs_best": kept_ratio(run["rates_tok_s"])} for run in runs],
        "best_of_runs": {"rates_tok_s": best, "kept_vs_best": kept_ratio(best)},
    }
    text = json.dumps(result, indent=1) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
