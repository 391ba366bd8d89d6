"""`plan --prefill auto|pflash` is the launch `serve` makes: before PFlash's drafter is on disk
the plan counts the pull and the drafter's memory, and `plan` and `serve --dry-run` print the
same document before and after the drafter is pulled (from a local Hub)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from benchmarks.lucebox_models import TARGET
from lucebox.app.cli.parser import main
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import bsa, lucebox
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.plan.lucebox.luceboxplan import PREFILL_DRAFTER_BYTES, PREFILL_DRAFTER_SOURCE
from support.ggufgen import ModelSpec, cached_gguf, write_llama
from support.hubserver import HubFile, HubState, serve_hub
from tests.conftest import run_lucebox
from tests.engine.builds import lucebox_build
from tests.engine.engines.test_bsa import BSA_TARBALL

DRAFTER_REPO = "unsloth/Qwen3-0.6B-GGUF"
DRAFTER_FILE = "Qwen3-0.6B-BF16.gguf"
ENGINE_MODE = {"auto": "auto", "pflash": "always"}


def printed(capsys, command: str, *argv: str) -> tuple[int, str]:
    code = main([command, *argv, "--json"])
    return code, capsys.readouterr().out


def plan_and_dry_run(capsys, *argv: str) -> dict:
    """Both documents, checked byte for byte; the plan's, parsed."""
    plan_code, planned = printed(capsys, "plan", *argv)
    serve_code, dry = printed(capsys, "serve", *argv, "--dry-run")
    assert (plan_code, planned) == (serve_code, dry)
    assert plan_code == 0, planned
    return json.loads(planned)


@pytest.mark.parametrize("mode", ["auto", "pflash"])
def test_plan_is_the_launch_before_and_after_the_drafter_is_on_disk(
    capsys, tmp_path, monkeypatch, mode
):
    home = tmp_path / "home"
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    argv = ["--model", str(target), "--engine", "lucebox", "--prefill", mode]
    argv += ["--vram-mib", "24576", "--ctx", "65536"]

    before = plan_and_dry_run(capsys, *argv)
    assert before["fits"] and before["engine"]["kind"] == "lucebox"
    command = before["argv"]
    assert command[command.index("--prefill-compression") + 1] == ENGINE_MODE[mode]
    drafter_path = command[command.index("--prefill-drafter") + 1]
    assert drafter_path.endswith(f"/unsloth--Qwen3-0.6B-GGUF/{DRAFTER_FILE}")
    assert drafter_path.startswith(str(home))
    why = before["reasons"]["prefill"]
    assert f"not on disk yet: serve pulls {PREFILL_DRAFTER_SOURCE} first" in why
    parked = PREFILL_DRAFTER_BYTES + 512 * 2**20 - before["memory_bytes"]["weights"]
    assert before["memory_bytes"]["prefill_transient"] >= parked

    drafter = write_llama(tmp_path / DRAFTER_FILE, ModelSpec(arch="qwen3"))
    state = HubState()
    state.add(DRAFTER_REPO, DRAFTER_FILE, HubFile(drafter.read_bytes()))
    with serve_hub(state) as hub:
        env = {
            "LUCEBOX_HOME": str(home),
            "HF_HOME": str(tmp_path / "hf"),
            "HF_ENDPOINT": hub.base_url,
        }
        pulled = run_lucebox("models", "pull", PREFILL_DRAFTER_SOURCE, env={**os.environ, **env})
        assert pulled.returncode == 0, pulled.stderr

    after = plan_and_dry_run(capsys, *argv)
    command = after["argv"]
    assert command[command.index("--prefill-drafter") + 1] == drafter_path
    assert Path(drafter_path).read_bytes() == drafter.read_bytes()
    assert "not on disk" not in after["reasons"]["prefill"]
    assert after["memory_bytes"]["total"] == before["memory_bytes"]["total"]
    # Only the drafter's size, now read from its file, changes the document.
    assert {k for k in before if before[k] != after[k]} <= {"memory_bytes", "reasons", "fit_check"}


def test_the_modes_say_what_they_compress_and_the_cost_on_short_prompts(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("LUCEBOX_HOME", str(tmp_path / "home"))
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    argv = ("--model", str(target), "--engine", "lucebox", "--vram-mib", "24576")
    auto = plan_and_dry_run(capsys, *argv, "--prefill", "auto")["reasons"]["prefill"]
    always = plan_and_dry_run(capsys, *argv, "--prefill", "pflash")["reasons"]["prefill"]
    off = plan_and_dry_run(capsys, *argv)
    assert "--prefill-compression auto" in auto and "32000 tokens or more" in auto
    assert "a shorter one never" in auto
    assert "--prefill-compression always" in always and "a short prompt is compressed too" in always
    assert "even a short question waits for that before its first token" in always
    assert "--prefill-compression" not in off["argv"]  # off stays the default
    for why in (auto, always):  # no build yet: the build decides the kernel
        assert "when the build has it: sm_80 or newer" in why


@pytest.mark.skipif(not BSA_TARBALL.is_file(), reason="the pinned BSA tarball is not here")
def test_the_plan_says_pflash_is_slow_on_a_build_without_bsa(capsys, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    argv = ["--model", str(target), "--engine", "lucebox", "--vram-mib", "24576"]
    argv += ["--prefill", "auto"]
    slow = lucebox_build(paths, lucebox.PIN.short, "2026-11-01T10:00:00")
    why = plan_and_dry_run(capsys, *argv)["reasons"]["prefill"]
    assert f"no BSA: PFlash runs the slow fallback in {slow.id}" in why
    source = SourceInfo(tmp_path / "src", "pin", lucebox.PIN.identity, None)
    bsa.ensure(paths, source, tarball=BSA_TARBALL, online=False)
    fast = lucebox_build(paths, lucebox.PIN.short, "2026-11-02T10:00:00", bsa_source=source.path)
    assert fast.options["bsa"] is True
    planned = plan_and_dry_run(capsys, *argv)
    assert planned["engine"]["id"] == fast.id
    assert "slow fallback" not in planned["reasons"]["prefill"]
    assert f"{fast.id} has PFlash's fast kernel" in planned["reasons"]["prefill"]
