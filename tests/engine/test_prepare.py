"""Everything before the engine starts is decided once: one plan when the engine is installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebox.engine import pipeline
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan import planner
from lucebox.engine.plan.options import ServeOptions
from support.realmodels import smol_model
from support.smolserver import private_engine_home


@pytest.mark.slow
def test_prepare_plans_once_with_the_engine_installed(built_engine_home, tmp_path, monkeypatch):
    paths = resolve_paths({"LUCEBOX_HOME": str(private_engine_home(tmp_path / "home"))})
    plans: list[str] = []
    real_plan = planner.plan_launch

    def counted(*args, **kwargs):
        plans.append("plan")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(planner, "plan_launch", counted)
    steps: list[pipeline.StepEvent] = []
    prepared = pipeline.prepare(paths, ServeOptions(model=str(smol_model())), steps.append)
    assert plans == ["plan"]
    assert Path(prepared.launch.server.model_path) == smol_model()
    assert prepared.launch.engine_kind == "llama-server"
    # The models step is done before the engine step begins, not only after the plan.
    order = [(s.step, s.state) for s in steps if s.step in ("models", "engine")]
    assert order.index(("models", "done")) < next(
        i for i, (step, _) in enumerate(order) if step == "engine"
    )
    engine_steps = [s for s in steps if s.step == "engine"]
    assert engine_steps[-1].state == "done" and "llama.cpp-b11434-cpu" in engine_steps[-1].message
