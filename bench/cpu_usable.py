"""Does a CPU plan leave the PC usable? Every preset planned on this machine's RAM, as
`lucebox presets` plans it: RAM left free after the plan, and how long its context takes the
CPU to read at the estimated prefill rate, against the caps (max(2 GiB, 15%) free; the read
time of ``model.cpu_read_s``).

    python -m bench.cpu_usable [--json]

Exits 1 when a plan that fits breaks a cap.
"""

from __future__ import annotations

import argparse
import json
import sys

from lucebox.engine import pipeline
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.plan import cpuread, planner, presetchoice


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    paths = resolve_paths()
    options = planner.ServeOptions()
    view = pipeline.machine_view(paths, options)
    if view.budget.is_gpu:
        print("this PC has a GPU: the CPU caps do not apply", file=sys.stderr)
        return 1
    budget, cap_s = view.budget, view.resolved.cpu_read_s
    table = presetchoice.preset_table(paths, options, view.resolved, budget, view.engine)
    cores = cpuread.cpu_cores()
    rows, broken = [], 0
    for item in table.plans:
        memory = item.plan.memory_bytes
        rate = cpuread.estimated_prefill_tok_s(item.target.facts, cores)
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
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
