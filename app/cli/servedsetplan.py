"""`plan`, `serve` and `up` of a served set (several --model, or models.served)."""

from __future__ import annotations

from lucebox.app.cli.args import show_plan
from lucebox.engine import servedset
from lucebox.engine.core import units
from lucebox.engine.core.paths import Paths
from lucebox.engine.pipeline import ServeOptions, StepEvent
from lucebox.engine.plan.servedset.setplan import SetPlan, SetRefusal


def show_set_plan(
    paths: Paths, options: ServeOptions, sources: tuple[str, ...], *, as_json: bool
) -> int:
    """What `plan` and `up/serve --dry-run` print for a set, then exit 3 if refused."""

    def quiet(event: StepEvent) -> None:
        return None

    try:
        planned, refusal = servedset.prepare_set(paths, options, sources, quiet, dry_run=True), None
        set_plan = planned.planned
    except SetRefusal as exc:
        set_plan, refusal = exc.planned, exc
    return show_plan(set_plan.to_json, lambda: _print_set_plan(set_plan), refusal, as_json=as_json)


def _print_set_plan(planned: SetPlan) -> None:
    print(f"a set of {len(planned.launches)} on {planned.budget.device}")
    for launch in planned.launches:
        plan = launch.plan
        where = plan.reasons.get("split") or plan.reasons.get("device", "")
        print(
            f"  {launch.alias}: ctx {plan.ctx}, KV {plan.cache_type_k}, "
            f"{units.mib_text(plan.memory_bytes.total)}; {where}"
        )
    print(f"  models_max {planned.models_max}")
    for side in planned.sides.models:
        where = "GPU" if side.on_gpu else "RAM"
        print(
            f"  {side.role} {side.alias}: ctx {side.ctx}, {units.mib_text(side.memory_bytes)} "
            f"of {where} beside the set (it leaves {units.mib_text(planned.sides.headroom_bytes)})"
        )
    for name, why in planned.reasons.items():
        print(f"  {name}: {why}")
