"""The generated speculation models in the real CPU engine: each loads, and each speculation
mode drafts with it (``timings`` and ``/metrics`` count the drafted tokens).

llama-server is started by hand here with the exact flags each mode needs; the ``agree``
variants (``ModelSpec.agree_token``) prove that a draft the target agrees with is accepted in
full, and the random-weight ones that an unrelated draft is rejected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.engineserver import exit_of, running_server, spec_args
from support.ggufgen import (
    LuceboxDFlashSpec,
    cached_gguf,
    dflash_for,
    draft_model_for,
    qwen3_pair,
    qwen35_target,
)
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

PROMPT = "hello world the model test hello world"
N_PREDICT = 48


@pytest.fixture(scope="module")
def server_path(built_engine_home: Path) -> Path:
    path = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert path.returncode == 0, path.stderr
    return Path(path.stdout.strip())


def drafted(reply: dict) -> tuple[int, int]:
    timings = reply["timings"]
    return timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)


def test_mtp_head_inside_the_target_drafts(server_path):
    target = cached_gguf(qwen35_target())
    with running_server(server_path, target, spec_args("draft-mtp", draft_max=3)) as server:
        reply = server.complete(PROMPT, N_PREDICT)
        counters = server.counters()
        log = server.log()
    draft_n, accepted = drafted(reply)
    assert draft_n > 0, log[-3000:]
    assert accepted < draft_n / 2  # random weights: the head guesses, the target disagrees
    assert counters["spec_decode_num_draft_tokens_total"] == draft_n
    assert counters["spec_decode_num_drafts_total"] > 0
    assert "creating MTP draft context" in log


def test_mtp_head_the_target_agrees_with_is_always_accepted(server_path):
    target = cached_gguf(qwen35_target(agree_token="hello"))
    with running_server(server_path, target, spec_args("draft-mtp", draft_max=3)) as server:
        reply = server.complete(PROMPT, N_PREDICT)
    draft_n, accepted = drafted(reply)
    assert draft_n > 0 and accepted == draft_n
    assert reply["content"].split() == ["hello"] * N_PREDICT


def test_target_without_head_refuses_draft_mtp(server_path):
    """Unlike other speculation failures, asking for MTP on a target without the head stops
    the engine: the planner must never pass ``draft-mtp`` for such a file."""
    code, output = exit_of(
        server_path, cached_gguf(qwen35_target(mtp=False)), spec_args("draft-mtp")
    )
    assert code == 1
    assert "model doesn't contain MTP layers" in output
    assert "exiting due to model loading error" in output


@pytest.mark.parametrize(("dspark", "mode"), [(False, "draft-dflash"), (True, "draft-dspark")])
@pytest.mark.parametrize("agree", [False, True])
def test_dflash_draft(server_path, dspark, mode, agree):
    target_spec = qwen35_target(mtp=False, agree_token="hello" if agree else None)
    draft = cached_gguf(dflash_for(target_spec, dspark=dspark))
    args = spec_args(mode, draft, draft_max=15)
    with running_server(server_path, cached_gguf(target_spec), args) as server:
        reply = server.complete(PROMPT, N_PREDICT)
        log = server.log()
    draft_n, accepted = drafted(reply)
    assert draft_n > 0, log[-3000:]
    if agree:
        assert accepted == draft_n
    else:
        assert accepted < draft_n / 2
    assert "block_size=16" in log


def test_dflash_draft_is_detected_from_its_header(server_path):
    """``-md`` alone enables DFlash: the engine reads the draft's architecture."""
    target_spec = qwen35_target(mtp=False)
    draft = cached_gguf(dflash_for(target_spec))
    with running_server(server_path, cached_gguf(target_spec), ["-md", str(draft)]) as server:
        reply = server.complete(PROMPT, 16)
        log = server.log()
    assert drafted(reply)[0] > 0
    assert "auto-detected speculative type 'draft-dflash'" in log


def test_qwen3_pair_with_draft_simple(server_path):
    target_spec, draft_spec = qwen3_pair()
    target, draft = cached_gguf(target_spec), cached_gguf(draft_spec)
    with running_server(server_path, target, spec_args("draft-simple", draft)) as server:
        reply = server.complete(PROMPT, N_PREDICT)
    assert drafted(reply)[0] > 0
    # The target as its own draft agrees with itself on every token.
    with running_server(server_path, target, spec_args("draft-simple", target)) as server:
        reply = server.complete(PROMPT, N_PREDICT)
    draft_n, accepted = drafted(reply)
    assert draft_n > 0 and accepted == draft_n


def test_hybrid_target_with_a_small_draft_model(server_path):
    target_spec = qwen35_target(mtp=False, agree_token="hello")
    draft = cached_gguf(draft_model_for(target_spec))
    args = spec_args("draft-simple", draft, draft_max=6)
    with running_server(server_path, cached_gguf(target_spec), args) as server:
        reply = server.complete(PROMPT, N_PREDICT)
    draft_n, accepted = drafted(reply)
    assert draft_n > 0 and accepted == draft_n


def test_ngram_mod_drafts_from_repeated_text(server_path):
    target = cached_gguf(qwen35_target(mtp=False, agree_token="hello"))
    with running_server(server_path, target, spec_args("ngram-mod")) as server:
        reply = server.complete(PROMPT, 96)
    draft_n, accepted = drafted(reply)
    assert draft_n > 0 and accepted > draft_n / 2


def test_lucebox_draft_is_refused_by_llama_server(server_path):
    code, output = exit_of(server_path, cached_gguf(LuceboxDFlashSpec()))
    assert code != 0
    assert "unknown model architecture: 'qwen35-dflash-draft'" in output


def test_generated_models_pass_models_check(server_path):
    paths = [cached_gguf(qwen35_target()), cached_gguf(qwen3_pair()[0])]
    done = run_lucebox("models", "check", "--json", *map(str, paths))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [entry["verdict"] for entry in json.loads(done.stdout)] == ["ok", "ok"]
