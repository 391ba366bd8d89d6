"""The agent cache profile on the real CPU engine: a hybrid model's growing session is resumed
from the cache on every call, never re-read in full. (The engine's "forcing full prompt
re-processing" line is trace-level, so the replies' own ``timings`` are the witness: each call
takes its history from the cache and processes only the new tool result.)"""

from __future__ import annotations

import itertools

import httpx
import pytest

from lucebox.engine.bench.compare import AXES, Served, run_configs
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.options import ServeOptions
from support.ggufgen import cached_gguf, qwen35_target
from support.realmodels import engine_home

pytestmark = pytest.mark.slow

TOOL_RESULT = " hello world" * 4


def growing_session(served: Served, calls: int = 10) -> list[dict]:
    """An agent's shape: each call re-sends the whole history plus one more tool result."""
    prompt = "<|im_start|>system\nYou are a coding agent.<|im_end|>\n"
    timings = []
    for call in range(calls):
        prompt += f"<|im_start|>user\ntool result {call}:{TOOL_RESULT}<|im_end|>\n"
        body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": True}
        with httpx.Client(timeout=300) as client:  # a fresh connection per call
            reply = client.post(f"{served.url}/completion", json=body)
        reply.raise_for_status()
        timings.append(reply.json()["timings"])
    return timings


def test_a_hybrid_models_growing_session_is_never_reprocessed_in_full(
    built_engine_home, monkeypatch
):
    monkeypatch.setenv("LUCEBOX_HOME", str(engine_home()))  # the served child's home too
    paths = resolve_paths()
    target = cached_gguf(qwen35_target(mtp=False))
    options = ServeOptions(model=str(target), ctx=2048)
    [(_, timings)] = run_configs(paths, options, (AXES["cache"]["on"],), growing_session)
    log = (paths.logs_dir / "engine.log").read_text(errors="replace")
    assert "--ctx-checkpoints 8" in log  # the launch the planner chose for a hybrid model
    # each call takes its whole history from the cache and reads only what is new
    for before, now in itertools.pairwise(timings):
        assert now["cache_n"] >= before["prompt_n"] + before["cache_n"] - 8, timings
        assert now["prompt_n"] <= timings[1]["prompt_n"] + 8, timings
