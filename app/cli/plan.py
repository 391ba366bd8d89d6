"""``lucebox presets`` and ``lucebox plan``: what the one planner decides, without side effects."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from lucebox.app.cli import servedsetplan
from lucebox.app.cli.args import (
    add_json,
    add_launch_options,
    print_json,
    serve_options,
    show_plan,
)
from lucebox.app.cli.handler import Command
from lucebox.engine import pipeline
from lucebox.engine.core import units
from lucebox.engine.core.errors import EXIT_OK, GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config, peers
from lucebox.engine.plan import fitcheck
from lucebox.engine.plan.flagtypes import index_list, mib_list, peer_list
from lucebox.engine.plan.launchplan import LaunchPlan, PlanRefusal
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.sources import presetchoice
from lucebox.engine.servedchoice import ModelSet, served_choice


def show_launch_plan(paths: Paths, options: ServeOptions, *, as_json: bool) -> int:
    """What `plan` and `up/serve --dry-run` print: the launch plan, then exit 3 if refused."""
    chosen = served_choice(options, config.load_settings(paths))
    if isinstance(chosen, ModelSet):
        return servedsetplan.show_set_plan(paths, chosen.options, chosen.sources, as_json=as_json)
    options = chosen.options
    quiet: Callable[[pipeline.StepEvent], None] = lambda event: None  # noqa: E731
    try:
        prepared = pipeline.prepare(paths, options, quiet, dry_run=True)
        launch_plan, refusal = prepared.launch, None
    except GuardRefusal as exc:
        if not isinstance(exc, PlanRefusal):
            raise
        launch_plan, refusal = exc.launch, exc
    launch_plan = dataclasses.replace(launch_plan, fit_check=fitcheck.fit_check(launch_plan))
    return show_plan(
        launch_plan.to_json, lambda: _print_launch_plan(launch_plan), refusal, as_json=as_json
    )


def _print_launch_plan(launch_plan: LaunchPlan) -> None:
    result = launch_plan.plan
    memory = result.memory_bytes
    print(f"{launch_plan.title} on {launch_plan.budget.device}")
    for problem in launch_plan.problems:
        print(f"  {problem.severity} {problem.code}: {problem.message}")
    for name, value in memory.to_json().items():
        why = result.reasons.get(name, "")
        print(f"  {name:<13}{units.mib_text(value):>12}  {why}")
    print(
        f"  ctx {result.ctx}, KV {result.cache_type_k}/{result.cache_type_v}, "
        f"GPU layers {'all' if result.n_gpu_layers < 0 else result.n_gpu_layers}, "
        f"slots {result.parallel}"
    )
    shown = ("ctx", "cache_type", "n_gpu_layers", "spec", "vision", "swa_full", "kvflash_pool",
             "placement", "devices", "disk_cache")  # fmt: skip
    for key in shown:
        if key in result.reasons:
            print(f"  {key}: {result.reasons[key]}")
    if launch_plan.users is not None:
        print(f"  users: {launch_plan.users.reason}")
    choice = launch_plan.engine_choice
    if choice is not None:
        print(f"  engine: {choice.reason}")
        if choice.unmeasured:
            print(f"  unmeasured: {choice.unmeasured}")
    if launch_plan.kv_modes is not None:
        print("  long-context modes, measured on this card:")
        for line in launch_plan.kv_modes.lines():
            print(f"    {line}")
    fit = launch_plan.fit_check
    if fit is not None:
        print(
            f"  llama-fit-params: model {fit['model_mib']} MiB, context {fit['context_mib']} MiB,"
            f" compute {fit['compute_mib']} MiB ({fit['difference_percent']:+.1f}% vs plan)"
        )
    print("  command: " + launch_plan.command)
    for side in launch_plan.sides.models:
        device = "GPU" if side.on_gpu else "RAM"
        print(
            f"  {side.role} model: {side.alias}, {units.mib_text(side.memory_bytes)} of {device} "
            f"beside the chat model ({units.mib_text(side.weights_bytes)} weights, "
            f"{units.mib_text(side.compute_bytes + side.cuda_context_bytes)} buffers), "
            f"port {side.port}"
        )


def cmd_presets(args: argparse.Namespace, paths: Paths) -> int:
    options = serve_options(args, paths)
    view = pipeline.machine_view(paths, options)
    budget = view.budget
    peers.check_builds(view.peers, view.engine.version)
    table = presetchoice.preset_table(paths, options, view.resolved, budget, view.installs)
    plans, best = table.plans, table.best
    if args.json:
        print_json(
            {
                "budget": {"device": budget.device, "vram_free_bytes": budget.vram_free_bytes},
                "best": best.alias if best else None,
                "presets": [
                    {
                        "id": p.alias,
                        "title": p.title,
                        "vram_tier_gib": p.preset.vram_tier_gib if p.preset else 0,
                        "fits": not p.misfit,
                        "ctx": p.plan.ctx if p.plan.fits else 0,
                        "reason": p.misfit,
                        "spec": p.speculation.spec_type,
                        "engine": p.engine_kind,
                        "smoke_test": bool(p.preset and p.preset.smoke_test),
                        "evidence": p.preset.evidence if p.preset else "",
                        **({"refusal": str(p.refusal)} if p.misfit == "refused" else {}),
                    }
                    for p in plans
                ],
            }
        )
        return EXIT_OK
    print(f"{budget.device}: {units.gib_text(budget.vram_free_bytes)} free")
    id_width = max((len(item.alias) for item in plans), default=16)
    for item in plans:
        mark = "*" if best is not None and item is best else " "
        fit = (
            f"fits, {item.plan.ctx:>7,} tokens ({item.plan.cache_type_k} KV)"
            if not item.misfit
            else f"does not fit: {item.misfit}"
            + (f" ({item.refusal.message})" if item.refusal and item.misfit == "refused" else "")
        )
        tier = item.preset.vram_tier_gib if item.preset else 0
        print(f"{mark} {item.alias:<{id_width}} {tier:>3} GB  {fit:<36} {item.title}")
    if best is not None:
        print(f"* = what `lucebox up` picks: {best.alias}")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace, paths: Paths) -> int:
    return show_launch_plan(paths, serve_options(args, paths), as_json=args.json)


def register(commands: Any, command: Command) -> None:
    presets = command("presets", "the presets and which fit this GPU", cmd_presets, commands)
    add_json(presets)
    presets.add_argument(
        "--vram-mib", type=mib_list, metavar="N[,N...]", help="plan for cards of N MiB each"
    )
    presets.add_argument("--gpus", type=index_list, metavar="0,1", help="GPUs to plan for")
    presets.add_argument("--rpc", type=peer_list, metavar="HOST:PORT[,...]", help="peers to add")
    plan = command("plan", "memory plan for a preset or model, no side effects", cmd_plan, commands)
    add_json(plan)
    add_launch_options(plan)
