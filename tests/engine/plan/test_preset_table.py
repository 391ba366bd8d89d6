"""The preset table is the plan: every row of `lucebox presets` (and of the TUI's first-run
picker) equals what `lucebox plan --preset ID` prints for the same card, which is what
`up/serve --preset ID --dry-run` print and launch (both run ``show_launch_plan``). Each side is
made here by the functions those commands call, in this process, on scripted cards
(``--vram-mib``)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from lucebox.engine import pipeline
from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.machine import config
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.presets import find_preset, load_presets
from lucebox.engine.models.records import stored_path
from lucebox.engine.plan.launchplan import LaunchPlan, PlanRefusal
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.sources import presetchoice

CARDS_GIB: tuple[tuple[int, ...], ...] = ((8,), (12,), (16,), (24,), (32,), (48,), (80,), (24, 24))
"""The cards bench/plan_snapshots.py writes every plan for: one card of each size, and two."""


def _label(cards_gib: tuple[int, ...]) -> str:
    return "+".join(map(str, cards_gib)) + "gib"


def _options(cards_gib: tuple[int, ...]) -> ServeOptions:
    return ServeOptions(vram_mib=tuple(gib * 1024 for gib in cards_gib))


def _table(paths: Paths, options: ServeOptions) -> presetchoice.PresetTable:
    """What `lucebox presets` (and the TUI's picker) plan."""
    view = pipeline.machine_view(paths, options)
    return presetchoice.preset_table(paths, options, view.resolved, view.budget, view.installs)


def _plan(paths: Paths, options: ServeOptions) -> LaunchPlan:
    """What `lucebox plan` and `up/serve --dry-run` print (a refused plan too)."""
    try:
        return pipeline.prepare(paths, options, lambda _: None, dry_run=True).launch
    except PlanRefusal as refused:
        return refused.launch


@pytest.mark.parametrize("cards_gib", CARDS_GIB, ids=_label)
def test_every_row_is_the_plan_of_its_preset(cards_gib):
    paths = resolve_paths()
    options = _options(cards_gib)
    table = _table(paths, options)
    assert [row.alias for row in table.plans] == [p.id for p in load_presets(paths)]
    for row in table.plans:
        launch = _plan(paths, replace(options, preset=row.alias))
        shown = (row.plan.ctx, row.plan.cache_type_k, row.plan.cache_type_v, row.engine_kind)
        served = (
            launch.plan.ctx,
            launch.plan.cache_type_k,
            launch.plan.cache_type_v,
            launch.engine_kind,
        )
        assert shown == served, row.alias
        assert row.to_json() == launch.to_json(), row.alias
        assert row.misfit == launch.misfit, row.alias


LEAVES = re.compile(r"served: it leaves (\d+) tokens(?: with (\w+) KV)? \((\d+)(?: with (\w+) KV)?")
WOULD_LEAVE = re.compile(r"would leave (\d+) tokens with (\w+) KV instead of (\d+) with (\w+)")


@pytest.mark.parametrize("cards_gib", CARDS_GIB, ids=_label)
def test_the_vision_reason_quotes_the_contexts_each_choice_serves(cards_gib):
    """A served projector's reason quotes the context served and the one --vision off serves;
    one left out quotes what --vision on would serve and the context served."""
    paths = resolve_paths()
    options = _options(cards_gib)
    quoted = 0
    for preset in load_presets(paths):
        asked = replace(options, preset=preset.id)
        launch = _plan(paths, asked)
        reason = launch.vision.reason
        assert launch.plan.reasons.get("vision", reason) == reason
        if (leaves := LEAVES.search(reason)) is not None:
            other = _plan(paths, replace(asked, vision="off")).plan
            ctx, kv, ctx_without, kv_without = leaves.groups()
            assert (int(ctx), kv or launch.plan.cache_type_k) == (
                launch.plan.ctx,
                launch.plan.cache_type_k,
            ), preset.id
            assert (int(ctx_without), kv_without or launch.plan.cache_type_k) == (
                other.ctx,
                other.cache_type_k,
            ), preset.id
            quoted += 1
        elif (would := WOULD_LEAVE.search(reason)) is not None:
            other = _plan(paths, replace(asked, vision="on")).plan
            ctx_with, kv_with, ctx, kv = would.groups()
            assert (int(ctx), kv) == (launch.plan.ctx, launch.plan.cache_type_k), preset.id
            assert (int(ctx_with), kv_with) == (other.ctx, other.cache_type_k), preset.id
            quoted += 1
        elif "costs no context" in reason:
            other = _plan(paths, replace(asked, vision="off")).plan
            assert launch.plan.ctx >= other.ctx, preset.id
            assert launch.plan.cache_type_k == other.cache_type_k, preset.id
    assert quoted or cards_gib != (24,)  # where vision costs context, the test bites


def test_a_preset_whose_plan_refuses_is_a_row_that_does_not_fit_with_why():
    """With model.vision on, a preset without a projector is refused by `plan`; so is one
    whose projector file here is not a projector (before planning): the table shows both as
    rows that do not fit with the refusal, and picks neither."""
    paths = resolve_paths()
    config.set_setting(paths, "model.vision", "on")
    gemma = find_preset(paths, "gemma3-12b")
    assert gemma.projector is not None
    not_projector = stored_path(paths, parse_source(gemma.projector.source))
    not_projector.parent.mkdir(parents=True, exist_ok=True)
    not_projector.write_bytes(b"not a GGUF")
    options = _options((24,))
    table = _table(paths, options)
    rows = {row.alias: row for row in table.plans}

    with pytest.raises(GuardRefusal) as raised:
        _plan(paths, replace(options, preset="gemma3-12b"))
    row = rows["gemma3-12b"]
    assert row.misfit == "refused" and row.refusal is not None
    assert row.refusal.message == raised.value.message
    assert "is not a vision projector" in row.refusal.message

    text_only = rows["qwen3-14b"]
    launch = _plan(paths, replace(options, preset="qwen3-14b"))
    assert launch.refusal is not None and "vision is on" in launch.refusal.message
    assert text_only.misfit == "refused" and text_only.to_json() == launch.to_json()
    assert table.best is None or table.best.refusal is None
