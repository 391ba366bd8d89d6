"""A model of a served set that runs out of memory: planned again once, the others kept.

A real router cannot run out of memory on a CPU, so the router's side comes from what was
recorded of it (routerlog/: its ``/models`` answer and a child's relayed lines) and the
engine's own out-of-memory line (test_supervisor's), fed through the run's real paths: the
supervisor's line callback, the ``/models`` parsing, the set's re-plan and preset file, the
proxy's planned bytes. The failed entry is the recorded ``/models`` answer with the two fields
the pinned router adds for a child that exited on its own (server-models.cpp: ``"failed":
true`` and ``exit_code``) written in by hand: no failed answer was recorded.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lucebox.engine import servedset
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import MIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.memory.sizes import CTX_PAD
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.servedset.servedsetplan import plan_set
from lucebox.engine.run.servedset import servedsetproxy
from lucebox.engine.run.servedset.servedsetrun import ServedSetRun
from lucebox.engine.run.servedsetmodels import child_line, failed_children
from support.ports import free_port
from tests.engine.run.test_supervisor import CUDA_OOM_LINE

RECORDED = Path(__file__).parent / "routerlog"
SMOLLM2_PORT = 38637
"""The port the recorded router gave smollm2's process (models_loaded.json, proxy.log)."""


def _models(failed: set[str]) -> dict[str, Any]:
    """The recorded ``/models`` answer with ``failed`` marked as the router marks a child
    that exited on its own."""
    payload: dict[str, Any] = copy.deepcopy(
        json.loads((RECORDED / "models_loaded.json").read_text())
    )
    for entry in payload["data"]:
        if entry["id"] in failed:
            entry["status"].update(value="unloaded", failed=True, exit_code=1)
    return payload


def _prepared(ctx: int | None = None) -> servedset.PreparedSet:
    cpu = GpuBudget("CPU (no NVIDIA GPU): system RAM", 64 * 1024 * MIB, 48 * 1024 * MIB, False)
    sources = ("smollm2", "smoke")
    options = ServeOptions(models=sources, port=free_port(), ctx=ctx)
    planned = plan_set(
        resolve_paths(), options, sources,
        settings=Settings(), budget=cpu, installs=installs_of(),
    )  # fmt: skip
    return servedset.PreparedSet(planned, Settings())


@contextlib.asynccontextmanager
async def _served(
    prepared: servedset.PreparedSet, reloads: list[str]
) -> AsyncIterator[tuple[ServedSetRun, httpx.AsyncClient]]:
    """The set's run as router_run makes it (never started: no router runs here), and a
    client to a router that records what it is asked."""

    def answer(request: httpx.Request) -> httpx.Response:
        reloads.append(str(request.url))
        return httpx.Response(200, json=_models(set()))

    async with (
        servedset.router_run(resolve_paths(), prepared, lambda _: None) as run,
        httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client,
    ):
        try:
            yield run, client
        finally:
            run.supervisor.log.close()  # a run that never starts never closes it itself


def _feed_recorded(run: ServedSetRun, oom: bool) -> None:
    """The router's recorded log, then (with ``oom``) smollm2's process's last line."""
    assert run.supervisor.on_line is not None
    lines = (RECORDED / "proxy.log").read_text().splitlines()
    if oom:
        lines.append(f"[{SMOLLM2_PORT}] {CUDA_OOM_LINE}")
    for line in lines:
        run.supervisor.on_line(1, line)


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The planned bytes the proxy's gate admits by, as router_run hands them over."""
    seen: dict[str, Any] = {}
    real = servedsetproxy.start_proxy

    async def start_proxy(*args: Any) -> Any:
        seen["placements"] = args[3]
        return await real(*args)

    monkeypatch.setattr("lucebox.engine.servedset.start_proxy", start_proxy)
    return seen


def test_failed_children_and_relayed_lines_from_the_recorded_router():
    assert failed_children(_models(set())) == {}
    assert failed_children(_models({"smollm2"})) == {"smollm2": SMOLLM2_PORT}
    recorded = (RECORDED / "proxy.log").read_text().splitlines()
    assert child_line(recorded[0]) == (
        SMOLLM2_PORT,
        "0.00.194.663 I cmn          init: llama threadpool init, n_threads = 2",
    )
    assert child_line(recorded[4]) is None  # the router's own line


async def test_an_oom_failure_is_planned_again_once_and_the_other_model_kept(gated):
    paths = resolve_paths()
    prepared = _prepared()
    before = {lp.alias: lp.plan.ctx for lp in prepared.planned.launches}
    reloads: list[str] = []
    async with _served(prepared, reloads) as (run, client):
        ini_path = paths.runtime_dir / "router.ini"
        old_ini = ini_path.read_text()
        _feed_recorded(run, oom=True)
        notes = await run._after_failures(client, failed_children(_models({"smollm2"})))
        new_ctx = before["smollm2"] * 3 // 4 // CTX_PAD * CTX_PAD
        assert [n.alias for n in notes] == ["smollm2"]
        assert f"{new_ctx}-token context" in notes[0].message
        assert [url.endswith("/models?reload=1") for url in reloads] == [True]
        new_ini = ini_path.read_text()
        assert f"c = {new_ctx}" in new_ini.split("[smollm2]")[1].split("\n\n")[0]
        assert new_ini.split("[smoke]")[1] == old_ini.split("[smoke]")[1]  # smoke runs on
        planned = {m.alias: m for m in run.planned}
        assert planned["smollm2"].ctx == new_ctx and planned["smoke"].ctx == before["smoke"]
        assert gated["placements"]["smollm2"].planned_bytes == planned["smollm2"].planned_bytes
        # Still failed on the next poll: nothing more is done about the same failure.
        assert await run._after_failures(client, failed_children(_models({"smollm2"}))) == []
        # Loaded again after the reload, then out of memory again: left failed, and why.
        assert await run._after_failures(client, failed_children(_models(set()))) == []
        _feed_recorded(run, oom=True)
        again = await run._after_failures(client, failed_children(_models({"smollm2"})))
        assert "again" in again[0].message and "left failed" in again[0].message
        assert len(reloads) == 1 and ini_path.read_text() == new_ini


async def test_a_failure_that_is_not_out_of_memory_is_left_to_the_router(gated):
    reloads: list[str] = []
    async with _served(_prepared(), reloads) as (run, client):
        _feed_recorded(run, oom=False)
        assert await run._after_failures(client, failed_children(_models({"smollm2"}))) == []
        assert reloads == []


async def test_an_oom_at_a_context_the_user_asked_for_is_left_failed_with_the_numbers(gated):
    reloads: list[str] = []
    async with _served(_prepared(ctx=4096), reloads) as (run, client):
        _feed_recorded(run, oom=True)
        notes = await run._after_failures(client, failed_children(_models({"smollm2"})))
        assert "left failed" in notes[0].message
        assert "4096-token context you asked for" in notes[0].message
        assert reloads == []
