"""Codex's model list as lucebox builds it, against the fields Codex requires.

The required-field list (support/codexlist.py) is codex-rs ``protocol/src/openai_models.rs``
(``ModelsResponse``/``ModelInfo``, serde fields with no default that are not ``Option``) at
openai/codex commit 8db0700334e35787030da010475ab211649e6b5d, checked against Codex 0.169.0's
own parser (tests/e2e/test_codex_models.py runs it).
"""

from __future__ import annotations

import pytest

from lucebox.engine.run.front.codexmodels import CodexModel, asks_codex_list, codex_models
from support import codexlist

ENGINE_OWN = {
    "models": [
        {
            "slug": "qwen3.6-27b",
            "display_name": "qwen3.6-27b",
            "default_reasoning_level": "low",
            "supported_reasoning_levels": [
                {"effort": e, "description": "d"} for e in ("low", "medium", "x-high", "max")
            ],
            "shell_type": "shell_command",
            "visibility": "list",
            "supported_in_api": True,
            "priority": 1,
            "context_window": 65536,
            "supports_reasoning_summaries": False,
            "supports_parallel_tool_calls": False,
        }
    ]
}
"""The Lucebox engine's own answer (http_server.cpp at the pinned commit, ``/v1/models`` with
``client_version``): the checker must refuse it."""


def test_the_document_has_every_field_codex_requires_for_each_served_model():
    served = [CodexModel("smol", 4096, None), CodexModel("qwen3.6-27b", 65536, False, True)]
    doc = codex_models(served)
    assert codexlist.problems(doc) == []
    smol, qwen = doc["models"]
    assert [smol["slug"], qwen["slug"]] == ["smol", "qwen3.6-27b"]
    assert [smol["priority"], qwen["priority"]] == [1, 2]
    assert [smol["context_window"], qwen["context_window"]] == [4096, 65536]
    assert smol["truncation_policy"] == {"mode": "tokens", "limit": 1024}
    assert qwen["input_modalities"] == ["text", "image"] and smol["input_modalities"] == ["text"]


@pytest.mark.parametrize(
    ("thinking_default", "level"), [(False, "none"), (True, "medium"), (None, None)]
)
def test_codex_defaults_to_no_thinking_where_the_plan_has_it_off(thinking_default, level):
    (model,) = codex_models([CodexModel("m", 8192, thinking_default)])["models"]
    assert model.get("default_reasoning_level") == level
    assert "none" in [e["effort"] for e in model["supported_reasoning_levels"]]


def test_the_checker_refuses_the_lucebox_engines_own_schema():
    found = codexlist.problems(ENGINE_OWN)
    assert "0: base_instructions missing or not <class 'str'>" in found
    assert "0: effort 'x-high' is not Codex's" in found
    assert codexlist.problems({"object": "list", "data": []}) == ["no 'models' list"]


@pytest.mark.parametrize(
    ("target", "asks"),
    [
        ("/v1/models?client_version=0.169.0", True),
        ("/v1/models?a=1&client_version=", True),
        ("/v1/models", False),
        ("/v1/models?version=1", False),
    ],
)
def test_codex_is_told_apart_by_its_query(target, asks):
    assert asks_codex_list(target) is asks
