"""A served set's model states, from lines and answers recorded from the real router (b11434
CPU engine serving SmolLM2, the Gemma 270M smoke model and a generated llama)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebox.engine.core.errors import UsageError
from lucebox.engine.run.runstate import Status
from lucebox.engine.run.servedset.servedsetrun import PlannedModel, model_statuses
from lucebox.engine.run.servedsetmodels import (
    ModelStatus,
    find_model,
    proxied_model,
    router_change,
    router_states,
)

RECORDED = Path(__file__).parents[1] / "routerlog"
PLANNED = (
    PlannedModel("smollm2", "CPU", "/m/smol.gguf", 1_000_000_000, False),
    PlannedModel("smoke", "CPU", "/m/gemma.gguf", 1_400_000_000, False),
    PlannedModel("tiny-llama", "CPU", "/m/tiny.gguf", 50_000_000, False),
)


def _recorded(name: str) -> object:
    return json.loads((RECORDED / name).read_text())


def test_router_states_from_the_recorded_models_answers():
    assert router_states(_recorded("models_unloaded.json")) == {
        "smoke": "unloaded",
        "smollm2": "unloaded",
        "tiny-llama": "unloaded",
    }
    assert set(router_states(_recorded("models_loaded.json")).values()) == {"loaded"}
    assert router_states({"data": [{"id": "x", "status": {"value": "downloading"}}]}) == {
        "x": "unloaded"
    }
    assert router_states("not json") == {}


def test_the_router_ran_each_model_with_its_section_flags():
    entries = {e["id"]: e for e in _recorded("models_loaded.json")["data"]}  # type: ignore[index]
    args = entries["smoke"]["status"]["args"]
    assert args[args.index("--ctx-size") + 1] == "32768"
    assert "--swa-full" in args and args[args.index("--chat-template") + 1] == "gemma"


def test_the_proxy_log_line_names_the_model():
    lines = (RECORDED / "proxy.log").read_text().splitlines()
    assert [proxied_model(line) for line in lines if proxied_model(line)] == ["smollm2"]
    assert proxied_model("srv  llama_server: model loaded") is None


def test_model_statuses_join_states_memory_and_last_use():
    states = {"smollm2": "loaded", "smoke": "sleeping"}
    memory = {"/m/smol.gguf": 340_000_000, "/m/gemma.gguf": 60_000_000, "/m/tiny.gguf": 9}
    found = model_statuses(PLANNED, states, memory, {"smollm2": 100.0}, now_s=103.5)  # type: ignore[arg-type]
    smol, gemma, tiny = found
    assert (smol.state, smol.memory_bytes, smol.last_used_s) == ("loaded", 340_000_000, 3.5)
    assert (gemma.state, gemma.memory_bytes, gemma.last_used_s) == ("sleeping", 60_000_000, None)
    assert (tiny.state, tiny.memory_bytes) == ("unloaded", 0)  # no process: nothing held
    on_gpu = (PlannedModel("big", "GPU 0", "/m/big.gguf", 20_000_000_000, True),)
    (big,) = model_statuses(on_gpu, {"big": "loaded"}, {}, {}, now_s=0)
    assert big.memory_bytes == 20_000_000_000


def test_status_json_carries_the_models_through_the_state_file():
    models = model_statuses(PLANNED, {"smoke": "loaded"}, {}, {}, now_s=0)
    status = Status("ready", models=models)
    document = status.to_json()
    assert [m["alias"] for m in document["models"]] == ["smollm2", "smoke", "tiny-llama"]
    assert set(document["models"][0]) >= {"alias", "state", "device", "memory_bytes", "last_used_s"}
    assert Status.from_file_json(status.to_file_json()) == status
    assert ModelStatus.from_json({"state": "gone"}) is None


def test_an_unknown_model_name_is_refused_with_the_served_aliases():
    models = model_statuses(PLANNED, {}, {}, {}, now_s=0)
    assert find_model(models, "smoke").alias == "smoke"
    with pytest.raises(UsageError) as refused:
        find_model(models, "gpt-4")
    assert "smollm2, smoke, tiny-llama" in (refused.value.hint or "")


def test_load_progress_and_changes_from_the_recorded_models_events():
    lines = (RECORDED / "models_sse.txt").read_text().splitlines()
    changes = [router_change(line) for line in lines]
    assert [(c.state, c.load_progress) for c in changes if c] == [
        ("loading", None),
        ("loading", 0.0),
        ("loading", 0.0),
        ("loading", 1.0),
        ("loaded", None),
        ("unloaded", None),
    ]
    assert {c.alias for c in changes if c} == {"smoke"}
    assert router_change(": keep-alive") is None
    assert router_change('data: {"model": "x", "event": "download_progress", "data": {}}') is None


def test_a_load_in_stages_counts_each_stage_alike():
    draft_half = {"stages": ["text_model", "spec_model"], "current": "spec_model", "value": 0.5}
    line = json.dumps(
        {
            "model": "q",
            "event": "status_change",
            "data": {"status": "loading", "progress": draft_half},
        }
    )
    change = router_change(f"data: {line}")
    assert change is not None and change.load_progress == 0.75


def test_load_progress_shows_only_while_loading_and_reaches_status_json():
    progress = {"smollm2": 0.4, "smoke": 1.0}
    states = {"smollm2": "loading", "smoke": "loaded"}
    smol, gemma, _ = model_statuses(PLANNED, states, {}, {}, 0, progress)  # type: ignore[arg-type]
    assert (smol.load_progress, gemma.load_progress) == (0.4, None)
    status = Status("ready", models=(smol,))
    assert status.to_json()["models"][0]["load_progress"] == 0.4
    assert Status.from_file_json(status.to_file_json()) == status
