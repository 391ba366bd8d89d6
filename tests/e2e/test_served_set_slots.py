"""A served set sleeps without forgetting: on the real CPU engine's router, SmolLM2's
conversation is saved when another model's load evicts it, and when it idles out, and each
next turn is answered from the restored slot (only the new tokens evaluated)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from support.servedset import ServedSet, served_set

pytestmark = pytest.mark.slow

HISTORY = "You are a careful assistant. " + "Here is a long project note to keep in mind. " * 40
SETTINGS = {
    # SmolLM2 and the Gemma 270M do not fit together in this much: one evicts the other.
    "models.ram_mib": "600",
    "model.ctx": "2048",
    "models.idle_s": "8",
}


def turn(served: ServedSet, messages: list[dict[str, str]]) -> dict[str, Any]:
    """One turn of the conversation on SmolLM2: its reply joins ``messages``; its timings."""
    body = {"model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0}
    reply = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()
    answer = reply.json()
    messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    return dict(answer["timings"])


def said(log: Path, line: str, times: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (text := log.read_text(errors="replace")).count(line) < times:
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.2)


def test_an_evicted_or_idle_model_answers_its_next_turn_from_its_restored_slot(
    built_engine_home, lucebox_home
):
    messages = [{"role": "system", "content": HISTORY}]
    with served_set(lucebox_home, ["smollm2", "smoke"], SETTINGS) as served:
        log = Path(served.status()["log"])
        messages.append({"role": "user", "content": "What is the note about?"})
        cold = turn(served, messages)
        assert cold["prompt_n"] > 300, cold
        _, other = served.ask("smoke")  # its load evicts SmolLM2, saved first
        assert other["model"] == "smoke"
        assert served.router_states() == {"smollm2": "unloaded", "smoke": "loaded"}
        said(log, "smollm2: slot saved (", 1)

        messages.append({"role": "user", "content": "Summarise it in one line."})
        evicted = turn(served, messages)
        said(log, "smollm2: slot restored (", 1)
        # Only the reply and the new question are read: the conversation comes from the slot.
        assert evicted["cache_n"] >= cold["prompt_n"] - 4, evicted
        assert evicted["prompt_n"] < 60, evicted

        # Idle for 8 s: the proxy saves it and unloads it (the router's own sleep is off).
        served.wait_states({"smollm2": "unloaded"}, timeout_s=60)
        said(log, "smollm2: slot saved (", 2)
        messages.append({"role": "user", "content": "And in three words?"})
        idled = turn(served, messages)
        said(log, "smollm2: slot restored (", 2)
        assert idled["cache_n"] >= evicted["cache_n"] + evicted["prompt_n"] - 4, idled
        assert idled["prompt_n"] < 60, idled
    # The set's stop saves the model still loaded, its last turn with it.
    said(log, "smollm2: slot saved (", 3, timeout_s=0)
    sets = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)}).slots_dir / "sets"
    (folder,) = sets.iterdir()
    assert (folder / "smollm2.slot").is_file() and (folder / "smollm2.slot.json").is_file()
