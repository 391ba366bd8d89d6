"""A served set end to end: SmolLM2, the Gemma 3 270M smoke model and a generated third served
together by `lucebox serve` on the real CPU engine's router; a model process that hangs
(SIGSTOP mid-reply) is stopped by the run and loads again, the other models untouched. An idle
model is unloaded by lucebox's proxy (the router's own sleep is off)."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from support.servedset import THIRD_NAME, served_set, third_model

pytestmark = pytest.mark.slow


def test_requests_alternate_by_name_and_an_idle_model_is_unloaded_and_comes_back(
    built_engine_home, lucebox_home, tmp_path
):
    sources = ["smollm2", "smoke", str(third_model(tmp_path))]
    with served_set(lucebox_home, sources, {"models.idle_s": "6"}) as served:
        assert {m["state"] for m in served.models().values()} == {"unloaded"}
        for alias in ("smollm2", "smoke", THIRD_NAME, "smollm2"):
            _, answer = served.ask(alias, max_tokens=4)
            assert answer["model"] == alias and answer["choices"][0]["message"]["content"]
        loaded = served.settled_models(lambda s: "loading" not in s.values())
        for alias, model in loaded.items():
            assert model["state"] in ("loaded", "unloaded"), alias  # unloaded: idle for 6 s
            assert model["device"].startswith("CPU")
            if model["state"] == "loaded":
                # What the process holds stays within what the plan gave it.
                assert 0 < model["memory_bytes"] <= model["planned_bytes"], alias
        assert loaded["smollm2"]["last_used_s"] is not None
        served.wait_states({"smollm2": "unloaded"}, timeout_s=60)
        _, answer = served.ask("smollm2", max_tokens=4)
        assert answer["choices"][0]["message"]["content"]
        assert served.router_states()["smollm2"] == "loaded"
        unknown = served.ask("nope")[1]
        assert unknown["error"]["message"].endswith("served: smollm2, smoke, tiny-llama")
        # The front's normalizations hold for a set, per model: the context each was planned,
        # beside the router's own keys, and Anthropic message ids.
        listed = httpx.get(served.url + "/v1/models", timeout=10).json()["data"]
        contexts = {m["id"]: m["context_length"] for m in listed}
        assert set(contexts) == {"smollm2", "smoke", THIRD_NAME} and min(contexts.values()) > 0
        assert all("status" in m for m in listed)
        asked = {"model": "smoke", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        message = httpx.post(served.url + "/v1/messages", json=asked, timeout=120).json()
        assert message["id"].startswith("msg_") and message["model"] == "smoke"


def test_a_ram_budget_evicts_by_memory_not_by_count(built_engine_home, lucebox_home, tmp_path):
    # 1000 MiB hold SmolLM2 and the tiny llama together, or the Gemma 270M with the tiny one;
    # the router's count limit for this set would be 1.
    sources = ["smollm2", "smoke", str(third_model(tmp_path))]
    with served_set(lucebox_home, sources, {"models.ram_mib": "1000"}) as served:
        served.ask(THIRD_NAME)
        served.ask("smollm2")
        both = {"smollm2": "loaded", "smoke": "unloaded", THIRD_NAME: "loaded"}
        assert served.router_states() == both
        served.ask("smoke")  # evicts SmolLM2 only: the tiny one still fits beside it
        evicted = {"smollm2": "unloaded", "smoke": "loaded", THIRD_NAME: "loaded"}
        assert served.router_states() == evicted
        shown = served.settled_models(lambda states: states == evicted)
        assert {a: m["state"] for a, m in shown.items()} == evicted


def test_a_model_whose_process_hangs_is_stopped_and_loads_again(
    built_engine_home, lucebox_home, tmp_path
):
    sources = ["smollm2", str(third_model(tmp_path))]
    with served_set(lucebox_home, sources, {"server.hang_s": "3"}) as served:
        served.ask(THIRD_NAME)  # loaded beside it, and never touched by what follows
        served.ask("smollm2")
        status = served.status()
        child = _model_process(status["engine_pid"], served.url, "smollm2")
        port = child.cmdline()[child.cmdline().index("--port") + 1]
        ended: dict[str, object] = {}

        def long_reply() -> None:
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 4000,
                "ignore_eos": True,
            }
            try:
                answer = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=120)
                ended["status"] = answer.status_code
            except httpx.HTTPError as exc:
                ended["error"] = repr(exc)

        asking = threading.Thread(target=long_reply)
        asking.start()
        _until_decoding(f"http://127.0.0.1:{port}")
        child.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        asking.join(60)
        assert not asking.is_alive(), "the waiting request never ended"
        assert ended.get("status") != 200, ended
        assert time.monotonic() - stopped_at < 30
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        log = Path(status["log"])
        deadline = time.monotonic() + 15
        while "smollm2 hung: " not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        # Decoding, or still reading the prompt, at the run's last look before the stop; or
        # stopped before its first look.
        said = log.read_text(errors="replace")
        found = r"smollm2 hung: a request.* (no token|no progress|nothing) for"
        assert re.search(found, said), said[-2000:]
        _, answer = served.ask("smollm2", max_tokens=4)
        assert answer["choices"][0]["message"]["content"]
        assert served.router_states()[THIRD_NAME] == "loaded"


def _model_process(router_pid: int, url: str, alias: str) -> psutil.Process:
    """The router's process serving ``alias`` (its port is in the argv /models lists)."""
    entries = httpx.get(f"{url}/models", timeout=10).json()["data"]
    argv = next(e["status"]["args"] for e in entries if e["id"] == alias)
    port = argv[argv.index("--port") + 1]
    for child in psutil.Process(router_pid).children():
        cmdline = child.cmdline()
        if "--port" in cmdline[:-1] and cmdline[cmdline.index("--port") + 1] == port:
            return child
    raise AssertionError(f"no process of the router serves {alias} on port {port}")


def _until_decoding(child_url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        slots = httpx.get(f"{child_url}/slots", timeout=5).json()
        if any(s["is_processing"] and s["next_token"][0]["n_decoded"] > 0 for s in slots):
            return
        time.sleep(0.1)
    raise AssertionError("the long request never started decoding")
