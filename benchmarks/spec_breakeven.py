"""Benchmark: the break-even acceptance of each speculation mode in the pinned engine.

For each mode, decode speed with speculation against the same target without it, in two
worlds built from the same shapes (support/ggufgen.py): ``agree`` models, whose drafts the target
always accepts (``ModelSpec.agree_token``: every layer still computes on random weights), and
``random`` models, whose drafts it almost never accepts. Modes: the MTP head inside a hybrid
qwen35 target (draft lengths 3 and 6), a DFlash draft (15), a small same-tokenizer draft model
(``draft-simple``, 6) and n-gram speculation (``ngram-mod``).

Speed is tokens per CPU-second of the engine on one thread (prompt excluded): the dev machines
are 2 cores shared by many jobs, where wall-clock decode speed of the same request varied 100x
between runs, while the engine's CPU time per token hardly depends on who else runs. The
wall-clock ratio is reported beside it. With --threads above 1 the basis is wall time (idle
threads spin, which CPU time would count).

From the two runs of a mode it derives the break-even acceptance: with ``k`` drafted tokens per
verification step, step times ``t_none`` (all rejected) and ``t_all`` (all accepted), and
``t_base`` per plain token, speculation pays off above the acceptance ``a`` where
``(1 + a k) / (t_none + a (t_all - t_none)) = 1 / t_base``. Step counts come from the engine's
``llamacpp:spec_decode_num_drafts_total``.

    nice -n 10 .venv/bin/python -m benchmarks.spec_breakeven [--scale 8] [--layers 8]
        [--vocab 32000] [--quant Q8_0|Q4_0|F16] [--head-dim 128] [--threads 1] [--n-predict 128]
        [--repeats 3] [--server PATH] [--json]

Uses the CPU engine built in the test cache (support/realmodels.py) unless --server names one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from lucebox.engine.models.headerinfo import inspect_model
from support.engineserver import RunningServer, running_server, spec_args
from support.ggufgen import (
    HybridSpec,
    cached_gguf,
    dflash_for,
    draft_model_for,
    qwen35_target,
    widen,
)
from support.realmodels import engine_home

PROMPT = (
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\n"
    "hello world the model test hello world the model test"
)
MODES = ("mtp-3", "mtp-6", "dflash-15", "draft-simple-6", "ngram-mod")


@dataclass(frozen=True)
class Run:
    decode_cost_s: float
    """The decode's CPU time on one thread (prompt excluded), which contention hardly changes;
    with more threads its wall time, since their spinning would count as CPU time."""
    decode_tokens_per_s: float
    """Wall-clock speed as the engine reports it: on a shared 2-core machine, noisy."""
    drafted: int
    accepted: int
    steps: int
    predicted: int

    @property
    def tokens_per_s(self) -> float:
        return (self.predicted - 1) / self.decode_cost_s


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def completion_cpu_s(server: RunningServer, n_predict: int) -> tuple[float, dict[str, Any]]:
    before = cpu_s(server.pid)
    reply = server.complete(PROMPT, n_predict)
    return cpu_s(server.pid) - before, reply


def measure(server: RunningServer, n_predict: int, repeats: int, *, cpu: bool) -> Run:
    """The median of ``repeats`` greedy completions, after a warm-up that also prices the
    prompt (a one-token completion), which is taken off each run's CPU time."""
    server.complete(PROMPT, 8)
    prompt_cpu_s = statistics.median(completion_cpu_s(server, 1)[0] for _ in range(3))
    runs = []
    for _ in range(repeats):
        before = server.counters().get("spec_decode_num_drafts_total", 0.0)
        used_s, reply = completion_cpu_s(server, n_predict)
        after = server.counters().get("spec_decode_num_drafts_total", 0.0)
        timings = reply["timings"]
        runs.append(
            Run(
                decode_cost_s=max(used_s - prompt_cpu_s, 1e-6)
                if cpu
                else timings["predicted_ms"] / 1000,
                decode_tokens_per_s=timings["predicted_per_second"],
                drafted=timings.get("draft_n", 0),
                accepted=timings.get("draft_n_accepted", 0),
                steps=int(after - before),
                predicted=timings["predicted_n"],
            )
        )
    runs.sort(key=lambda run: run.decode_cost_s)
    return runs[len(runs) // 2]


def mode_args(mode: str, files: dict[str, Path]) -> list[str]:
    if mode.startswith("mtp-"):
        return spec_args("draft-mtp", draft_max=int(mode.removeprefix("mtp-")))
    if mode.startswith("dflash-"):
        return spec_args("draft-dflash", files["dflash"], int(mode.removeprefix("dflash-")))
    if mode.startswith("draft-simple-"):
        return spec_args("draft-simple", files["draft"], int(mode.removeprefix("draft-simple-")))
    return spec_args(mode)


def models(target: HybridSpec) -> dict[str, Path]:
    return {
        "target": cached_gguf(target),
        "dflash": cached_gguf(dflash_for(target)),
        "draft": cached_gguf(draft_model_for(target)),
    }


def break_even(base: Run, none: Run, every: Run) -> float | None:
    """Acceptance (accepted / drafted) above which the mode decodes faster than none; above 1
    or None: it never does."""
    if not (none.steps and every.steps and every.drafted):
        return None
    t_base = base.decode_cost_s / (base.predicted - 1)
    t_none = none.decode_cost_s / none.steps
    t_all = every.decode_cost_s / every.steps
    k = every.drafted / every.steps
    denominator = k - (t_all - t_none) / t_base
    if denominator <= 0:
        return None
    return max(0.0, (t_none / t_base - 1) / denominator)


def server_path(given: Path | None) -> Path:
    if given is not None:
        return given
    done = subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", "engine", "path"],
        capture_output=True,
        text=True,
        check=True,
        env={"LUCEBOX_HOME": str(engine_home()), "PATH": "/usr/bin:/bin"},
    )
    return Path(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=8, help="width factor over the tiny model")
    parser.add_argument("--layers", type=int, default=8, help="trunk layers of the target")
    parser.add_argument(
        "--head-dim",
        type=int,
        default=16,
        help="attention head width (128: the real models' heads, where attention costs as much "
        "per token as it does there)",
    )
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--quant", default="Q8_0", help="weight type: Q8_0, Q4_0 or F16")
    parser.add_argument("--threads", type=int, default=1, help="engine threads (-t)")
    parser.add_argument("--n-predict", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--server", type=Path, help="a llama-server to measure instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so the running engine is stopped rather than orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engine = server_path(args.server)
    cpu = args.threads == 1
    quant = None if args.quant.upper() == "F16" else args.quant.upper()
    shape = widen(
        qwen35_target(
            n_layer=args.layers, vocab_size=args.vocab, quant=quant, head_dim=args.head_dim
        ),
        args.scale,
    )
    assert isinstance(shape, HybridSpec)
    worlds = {
        "random": models(shape),
        "agree": models(dataclasses.replace(shape, agree_token="hello")),
    }
    sizes = {name: inspect_model(path).weights_bytes for name, path in worlds["random"].items()}
    results: dict[str, dict[str, Run]] = {}
    for world, files in worlds.items():
        with running_server(engine, files["target"], threads=args.threads) as server:
            results.setdefault("none", {})[world] = measure(
                server, args.n_predict, args.repeats, cpu=cpu
            )
        for mode in args.modes.split(","):
            extra = mode_args(mode, files)
            with running_server(engine, files["target"], extra, threads=args.threads) as server:
                results.setdefault(mode, {})[world] = measure(
                    server, args.n_predict, args.repeats, cpu=cpu
                )
    report: dict[str, Any] = {
        "quant": args.quant,
        "head_dim": args.head_dim,
        "threads": args.threads,
        "basis": "cpu" if cpu else "wall",
        "weights_bytes": sizes,
        "n_predict": args.n_predict,
        "modes": {},
    }
    for mode, by_world in results.items():
        if mode == "none":
            continue
        row: dict[str, Any] = {}
        for world, run in by_world.items():
            base = results["none"][world]
            row[world] = {
                "tok_s": round(run.tokens_per_s, 1),
                "base_tok_s": round(base.tokens_per_s, 1),
                "ratio": round(run.tokens_per_s / base.tokens_per_s, 2),
                "wall_ratio": round(run.decode_tokens_per_s / base.decode_tokens_per_s, 2),
                "acceptance": round(run.accepted / run.drafted, 3) if run.drafted else None,
                "drafted": run.drafted,
                "steps": run.steps,
            }
        even = break_even(results["none"]["random"], by_world["random"], by_world["agree"])
        row["break_even_acceptance"] = None if even is None else round(even, 3)
        report["modes"][mode] = row
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.quant} weights bytes: {sizes}; {args.n_predict} tokens, median of {args.repeats}")
    unit = "CPU-second" if cpu else "second"
    print(f"speed ratio with speculation / without, (tokens per {unit}: with/without)")
    print(f"{'mode':<16}{'all accepted':>40}{'none accepted':>40}{'break-even':>12}")
    for mode, row in report["modes"].items():
        cells = []
        for world in ("agree", "random"):
            cell = row[world]
            cells.append(
                f"{cell['ratio']:.2f}x ({cell['tok_s']}/{cell['base_tok_s']}, "
                f"acc {cell['acceptance']})"
            )
        even = row["break_even_acceptance"]
        shown = "never" if even is None or even > 1 else f"{even:.2f}"
        print(f"{mode:<16}{cells[0]:>40}{cells[1]:>40}{shown:>12}")


if __name__ == "__main__":
    main()
