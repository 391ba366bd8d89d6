"""A served set end to end: SmolLM2, the Gemma 3 270M smoke model and a generated third served
together by `lucebox serve` on the real CPU engine's router."""

from __future__ import annotations

import pytest

from tests.servedset import THIRD_NAME, served_set, third_model

pytestmark = pytest.mark.slow


def test_requests_alternate_by_name_and_an_idle_model_sleeps_and_comes_back(
    built_engine_home, lucebox_home, tmp_path
):
    sources = ["smollm2", "smoke", str(third_model(tmp_path))]
    with served_set(lucebox_home, sources, {"models.idle_s": "6"}) as served:
        assert {m["state"] for m in served.models().values()} == {"unloaded"}
        for alias in ("smollm2", "smoke", THIRD_NAME, "smollm2"):
            _, answer = served.ask(alias, max_tokens=4)
            assert answer["model"] == alias and answer["choices"][0]["message"]["content"]
        loaded = served.settled_models(lambda s: set(s.values()) <= {"loaded", "sleeping"})
        for alias, model in loaded.items():
            assert model["state"] in ("loaded", "sleeping"), alias
            assert model["device"].startswith("CPU")
            if model["state"] == "loaded":
                # What the process holds stays within what the plan gave it.
                assert 0 < model["memory_bytes"] <= model["planned_bytes"], alias
        assert loaded["smollm2"]["last_used_s"] is not None
        served.wait_states({"smollm2": "sleeping"}, timeout_s=60)
        _, answer = served.ask("smollm2", max_tokens=4)
        assert answer["choices"][0]["message"]["content"]
        assert served.router_states()["smollm2"] == "loaded"
        unknown = served.ask("nope")[1]
        assert unknown["error"]["message"].endswith("served: smollm2, smoke, tiny-llama")


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
