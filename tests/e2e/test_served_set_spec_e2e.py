"""The speculation guard of a served set's models, end to end on the real CPU engine's router:
a model whose drafts are rarely accepted is switched off alone, the other model untouched,
and the set started again plans it off.

On a CPU a set member speculates only with n-gram drafts: the planner drops model drafts
there unless the user names one, and a set takes no ``--draft``. SmolLM2's greedy prose
accepts about 40% of its n-gram drafts, below the 60% break-even measured for ngram-mod on a
CPU; the generated model's greedy loops accept all of theirs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from support.servedset import THIRD_NAME, ServedSet, served_set, third_model

pytestmark = pytest.mark.slow

PROMPTS = (
    "Write a long story about a dragon and a knight.",
    "Explain how a car engine works, step by step.",
    "List ten facts about the ocean and explain each.",
    "Describe a day in the life of a baker in Paris.",
)


def _process_of(served: ServedSet, alias: str) -> psutil.Process | None:
    """The router's process serving ``alias`` now (its port is in the argv /models lists)."""
    entries = httpx.get(f"{served.url}/models", timeout=10).json()["data"]
    argv = next(e["status"].get("args") or [] for e in entries if e["id"] == alias)
    if "--port" not in argv:
        return None
    port = argv[argv.index("--port") + 1]
    for child in psutil.Process(served.status()["engine_pid"]).children():
        cmdline = child.cmdline()
        if "--port" in cmdline[:-1] and cmdline[cmdline.index("--port") + 1] == port:
            return child
    return None


def test_a_member_whose_drafts_do_not_pay_is_switched_off_alone_and_stays_off(
    built_engine_home, lucebox_home, tmp_path
):
    sources = ["smollm2", str(third_model(tmp_path))]
    settings = {"spec.calibrate_idle_s": "0"}
    with served_set(lucebox_home, sources, settings) as served:
        first = served.models()
        assert first["smollm2"]["spec"]["type"] == "ngram-mod"
        assert first[THIRD_NAME]["spec"]["type"] == "ngram-mod"
        served.ask(THIRD_NAME, max_tokens=64)
        third = _process_of(served, THIRD_NAME)
        assert third is not None
        deadline = time.monotonic() + 900
        asked = 0
        while (served.models()["smollm2"]["spec"] or {}).get("active") is not False:
            assert time.monotonic() < deadline, served.models()["smollm2"]
            served.ask("smollm2", max_tokens=200, content=PROMPTS[asked % len(PROMPTS)])
            asked += 1
            time.sleep(1.5)  # an idle moment: the guard applies its decision between requests
        spec = served.models()["smollm2"]["spec"]
        assert "below the 60% break-even measured for ngram-mod on a CPU" in spec["reason"]
        assert "speculation switched off" in spec["reason"]
        assert spec["acceptance"] < 0.5
        log = Path(served.status()["log"]).read_text(errors="replace")
        assert "smollm2: " in log and "it loads so on the next request" in log
        # The other model kept its process and its speculation.
        assert third.is_running() and _process_of(served, THIRD_NAME) == third
        assert served.router_states()[THIRD_NAME] == "loaded"
        assert served.models()[THIRD_NAME]["spec"]["active"] is True
        # The next request loads SmolLM2 without speculation.
        _, answer = served.ask("smollm2", max_tokens=4)
        assert answer["choices"][0]["message"]["content"]
        smol = _process_of(served, "smollm2")
        assert smol is not None and "--spec-type" not in smol.cmdline()
    plan = subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", "plan", "--json", *_models_argv(sources)],
        capture_output=True, text=True, env=served.env, check=True, timeout=120,
    )  # fmt: skip
    planned = {m["alias"]: m["spec"] for m in json.loads(plan.stdout)["models"]}
    assert planned["smollm2"]["type"] is None
    assert "switched off by the guard while serving" in planned["smollm2"]["reason"]
    assert planned[THIRD_NAME]["type"] == "ngram-mod"


def _models_argv(sources: list[str]) -> list[str]:
    return [arg for source in sources for arg in ("--model", source)]
