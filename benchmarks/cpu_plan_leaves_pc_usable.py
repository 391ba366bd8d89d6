"""Does a CPU plan leave the PC usable? Every preset planned on this machine's RAM, as
`lucebox presets` plans it: RAM left free after the plan, and how long its context takes the
CPU to read at the estimated prefill rate, against the caps (max(2 GiB, 15%) free; the read
time of ``model.cpu_read_s``).

    python -m benchmarks.cpu_plan_leaves_pc_usable [--json] [--measure]

``--measure`` also serves the real SmolLM2-135M-Instruct on the built CPU engine, has it read
one prompt that fills an 8K context, and sets the measured prefill rate beside the estimate
the planner uses before a model has run here (and records it, as a run would).
Exits 1 when a plan that fits breaks a cap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx

from lucebox.engine import pipeline
from lucebox.engine.bench.compare import ServeConfig, serving
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.models.headerinfo import inspect_model
from lucebox.engine.models.modelfacts import facts_from_info
from lucebox.engine.plan import prefillrates
from lucebox.engine.plan.memory import cpuread
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.sources import presetchoice
from support.realmodels import smol_model
from support.smolserver import private_engine_home


def measure_prefill(model: Path, ctx: int) -> tuple[int, float]:
    """(prompt tokens, seconds) of one prompt that nearly fills ``ctx``, read by the engine."""
    home = private_engine_home(Path(tempfile.mkdtemp(prefix="cpu-usable-")))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    options = ServeOptions(model=str(model), ctx=ctx, cache="off", spec="off")
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    words = " ".join(["the quick brown fox jumps over the lazy dog"] * ((ctx - 512) // 10))
    with serving(paths, options, ServeConfig("measure"), env=env, ready_timeout_s=600) as up:
        reply = httpx.post(
            f"{up.url}/v1/chat/completions",
            headers=up.headers(),
            json={"messages": [{"role": "user", "content": words}], "max_tokens": 1},
            timeout=3600,
        ).json()
    timings = reply["timings"]
    return int(timings["prompt_n"]), float(timings["prompt_ms"]) / 1000


def _measure(cores: int) -> dict[str, object]:
    model = smol_model()
    tokens, seconds = measure_prefill(model, 8192)
    prefillrates.write_prefill(resolve_paths(), model, cores, tokens, seconds)
    info = inspect_model(model)
    facts = facts_from_info(info)
    return {
        "model": model.name,
        "prompt_tokens": tokens,
        "seconds": round(seconds, 1),
        "measured_tok_s": round(tokens / seconds, 1),
        "estimated_tok_s": round(cpuread.estimated_prefill_tok_s(facts, cores), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", action="store_true", help="measure SmolLM2's prefill here")
    args = parser.parse_args()
    paths = resolve_paths()
    options = ServeOptions()
    view = pipeline.machine_view(paths, options)
    if view.budget.is_gpu:
        print("this PC has a GPU: the CPU caps do not apply", file=sys.stderr)
        return 1
    budget, cap_s = view.budget, view.resolved.cpu_read_s
    table = presetchoice.preset_table(paths, options, view.resolved, budget, view.installs)
    cores = cpuread.cpu_cores()
    rows, broken = [], 0
    for item in table.plans:
        memory = item.plan.memory_bytes
        # The rate the planner bounded the context with: measured here, else estimated.
        measured = (
            prefillrates.read_prefill(paths, item.target.path, cores)
            if item.target.present
            else None
        )
        rate = (
            measured.tok_s
            if measured
            else cpuread.estimated_prefill_tok_s(item.target.facts, cores)
        )
        free_after = memory.available - memory.total
        read_s = item.plan.ctx / rate
        fits = not item.misfit
        ok = not fits or (free_after >= 2 * GIB and read_s <= cap_s * 1.001)
        broken += not ok
        rows.append(
            {
                "preset": item.alias,
                "fits": fits,
                "misfit": item.misfit,
                "ctx": item.plan.ctx,
                "planned_gib": round(memory.total / GIB, 2),
                "free_after_gib": round(free_after / GIB, 2),
                "prefill_tok_s_estimated": round(rate, 1),
                "read_s": round(read_s, 1),
                "ok": ok,
            }
        )
    summary = {
        "ram_total_gib": round(budget.vram_total_bytes / GIB, 2),
        "ram_available_gib": round(budget.vram_free_bytes / GIB, 2),
        "cores": cores,
        "cpu_read_s": cap_s,
        "best": table.best.alias if table.best else None,
        "presets": rows,
        "measured": _measure(cores) if args.measure else None,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"RAM {summary['ram_total_gib']} GiB, {summary['ram_available_gib']} GiB available, "
            f"{cores} cores, read cap {cap_s:g} s; up picks {summary['best']}"
        )
        for row in rows:
            verdict = (
                f"ctx {row['ctx']:>6,}  {row['planned_gib']:>5} GiB planned, "
                f"{row['free_after_gib']:>5} GiB left free, read {row['read_s']:>6} s at "
                f"~{row['prefill_tok_s_estimated']} tok/s"
                if row["fits"]
                else f"does not fit: {row['misfit']}"
            )
            print(f"{'ok ' if row['ok'] else 'BAD'} {row['preset']:<16} {verdict}")
        if summary["measured"]:
            print(f"measured: {summary['measured']}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
