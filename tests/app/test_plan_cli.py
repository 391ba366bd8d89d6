from __future__ import annotations

import json

import pytest

from tests.conftest import assert_one_line_error, run_lucebox

PLAN_KEYS = {
    "fits",
    "ctx",
    "cache_type_k",
    "cache_type_v",
    "n_gpu_layers",
    "memory_bytes",
    "kvflash_pool_tokens",
    "argv",
    "reasons",
}
MEMORY_KEYS = {"weights", "kv", "draft", "compute", "reserve", "total", "available"}


def test_presets_for_a_24_gib_card():
    result = run_lucebox("presets", "--json", "--vram-mib", "24576")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["best"] == "qwen3.6-27b"
    for entry in report["presets"]:
        assert entry["reason"] in (("",) if entry["fits"] else ("vram", "offload"))
        assert entry["evidence"]
    small = json.loads(run_lucebox("presets", "--json", "--vram-mib", "4096").stdout)
    assert {e["id"]: e["fits"] for e in small["presets"]}["qwen3.6-27b"] is False


def test_plan_json_shape():
    result = run_lucebox("plan", "--preset", "qwen3.6-27b", "--vram-mib", "24576", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) >= PLAN_KEYS
    assert set(plan["memory_bytes"]) >= MEMORY_KEYS
    assert plan["ctx"] % 256 == 0 and plan["fits"]
    assert plan["argv"][plan["argv"].index("-c") + 1] == str(plan["ctx"])
    assert "not available on llama-server" in plan["reasons"]["kvflash_pool"]


def test_a_context_that_does_not_fit_is_refused_not_shrunk():
    result = run_lucebox(
        "plan", "--preset", "qwen3.6-27b", "--vram-mib", "20480", "--ctx", "262144", "--json"
    )
    assert result.returncode == 3
    assert_one_line_error(result)
    assert "largest context that fits is" in result.stderr
    assert json.loads(result.stdout)["ctx"] == 262144


def test_unknown_preset_and_missing_model():
    unknown = run_lucebox("plan", "--preset", "nope")
    assert unknown.returncode == 2 and "known presets" in unknown.stderr
    missing = run_lucebox("plan", "--model", "hf:acme/none/x.gguf")
    assert missing.returncode == 2 and "models pull" in missing.stderr


@pytest.mark.slow
def test_plan_from_the_real_gemma_header_matches_llama_fit_params(built_engine_home):
    from tests.realmodels import gemma_model

    result = run_lucebox(
        "plan",
        "--model",
        str(gemma_model()),
        "--ctx",
        "32768",
        "--json",
        env={"LUCEBOX_HOME": str(built_engine_home)},
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["memory_bytes"]["kv"] == 111 * 2**20
    fit = plan["fit_check"]
    assert fit is not None and fit["context_mib"] == 111
