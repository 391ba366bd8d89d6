"""Agent prompt warnings (pure) and the last-served record that feeds them."""

from __future__ import annotations

import json

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.memory.agentprompt import ServedModel, prompt_warnings
from lucebox.engine.run.lastserved import (
    LastServed,
    read_last_served,
    record_file,
    served_now,
    write_last_served,
)

SMOL_BYTES = 98_000_000


@pytest.mark.parametrize(
    ("served", "output_tokens", "expected"),
    [
        (ServedModel(3072, False, SMOL_BYTES, 2), 512, "more than the served context of 3072"),
        (ServedModel(16384, False, SMOL_BYTES, 2), 2048, "its first request takes ~60 s"),
        (ServedModel(16384, False, SMOL_BYTES, 2, 1000.0), 2048, None),
        (ServedModel(16384, False, SMOL_BYTES, 2, 40.0), 2048, "~40 tokens/s (measured)"),
        (ServedModel(32768, True, 5_000_000_000, 16), 4096, None),
    ],
)
def test_codex_prompt_warnings(served, output_tokens, expected):
    said = prompt_warnings("codex", served, output_tokens)
    if expected is None:
        assert said == []
    else:
        assert len(said) == 1 and expected in said[0], said


def test_a_too_long_prompt_names_a_context_that_fits():
    said = prompt_warnings("qwen-code", ServedModel(8192, True, SMOL_BYTES, 2), 1024)
    assert "`lucebox serve --ctx 16384`" in said[0]


def test_clients_with_short_prompts_and_sdks_get_no_warning():
    served = ServedModel(4096, False, 5_000_000_000, 2)
    assert prompt_warnings("openai", served, 512) == []
    assert prompt_warnings("llm", served, 512) == []


def test_last_served_round_trip_and_foreign_files(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    assert read_last_served(paths) is None
    record = served_now(
        "http://127.0.0.1:8080", ("a", "b"), 8192, api_key_file=None, on_gpu=False, weights_bytes=1
    )
    write_last_served(paths, record)
    assert read_last_served(paths) == record and record.model == "a"
    for foreign in ("[]", "{}", '{"aliases": [], "url": "x"}', "not json"):
        record_file(paths).write_text(foreign)
        assert read_last_served(paths) is None
    assert LastServed.from_json(json.loads(json.dumps(record.to_json()))) == record
