"""The one planner's speculation choice over generated GGUFs: the right mode and argv per
file set, or a clear refusal. Headers only are read; nothing is served here."""

from __future__ import annotations

import json

import pytest

from support.ggufgen import (
    LuceboxDFlashSpec,
    cached_gguf,
    dflash_for,
    qwen3_pair,
    qwen35_target,
)
from tests.conftest import run_lucebox


def plan(*args: str) -> tuple[int, dict, str]:
    result = run_lucebox("plan", *args, "--vram-mib", "16384", "--json")
    document = json.loads(result.stdout) if result.stdout else {}
    return result.returncode, document, result.stderr


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_mtp_head_inside_the_target_is_switched_on_with_its_family_draft_length():
    code, document, err = plan("--model", str(cached_gguf(qwen35_target())))
    assert code == 0, err
    argv = document["argv"]
    assert flag(argv, "--spec-type") == "draft-mtp" and "-md" not in argv
    assert flag(argv, "--spec-draft-n-max") == "3"
    assert flag(argv, "--spec-draft-p-min") == "0.75"  # a dense model
    assert "carries MTP layers" in document["reasons"]["spec"]
    assert document["memory_bytes"]["draft"] > 0  # the head's KV and compute are priced


def test_a_target_without_a_head_falls_back_to_ngram_and_says_why():
    code, document, _ = plan("--model", str(cached_gguf(qwen35_target(mtp=False))))
    assert code == 0
    assert document["spec"]["type"] == "ngram-mod" and document["memory_bytes"]["draft"] == 0
    assert "n-gram speculation" in document["reasons"]["spec"]


def test_a_dflash_draft_runs_as_dflash_and_dspark_as_dspark():
    target_spec = qwen35_target(mtp=False)
    target = str(cached_gguf(target_spec))
    for dspark, wanted in ((False, "draft-dflash"), (True, "draft-dspark")):
        draft = cached_gguf(dflash_for(target_spec, dspark=dspark))
        code, document, err = plan("--model", target, "--draft", str(draft))
        assert code == 0, err
        argv = document["argv"]
        assert flag(argv, "--spec-type") == wanted and flag(argv, "-md") == str(draft)
        assert flag(argv, "-ctkd") == document["cache_type_k"]


def test_a_same_tokenizer_draft_runs_draft_simple_and_mtp_beats_it():
    target_spec, draft_spec = qwen3_pair()
    target, draft = cached_gguf(target_spec), cached_gguf(draft_spec)
    code, document, err = plan("--model", str(target), "--draft", str(draft))
    assert code == 0, err
    assert document["spec"]["type"] == "draft-simple"
    assert flag(document["argv"], "-md") == str(draft)
    off = plan("--model", str(target), "--draft", str(draft), "--spec", "off")[1]
    assert "--spec-type" not in off["argv"] and off["memory_bytes"]["draft"] == 0


def test_asking_for_a_mode_the_files_cannot_do_is_refused_with_the_reason():
    code, document, err = plan(
        "--model", str(cached_gguf(qwen35_target(mtp=False))), "--spec", "mtp"
    )
    assert code == 3
    assert "--spec mtp needs MTP layers in the target" in err
    assert document["refusal"]


def test_a_lucebox_engine_draft_is_refused_by_name():
    target_spec = qwen35_target()
    lucebox_draft = cached_gguf(LuceboxDFlashSpec())
    code, document, err = plan(
        "--model", str(cached_gguf(target_spec)), "--draft", str(lucebox_draft), "--spec", "dflash"
    )
    assert code == 3
    assert "dflash_server" in err or "dflash_server" in json.dumps(document["draft"])


def test_a_draft_given_as_the_target_is_refused_as_a_draft():
    draft = cached_gguf(dflash_for(qwen35_target()))
    code, document, _ = plan("--model", str(draft))
    assert code == 3
    assert "draft-only" in {p["code"] for p in document["target"]["problems"]}
    assert "no-chat-template" not in {p["code"] for p in document["target"]["problems"]}


@pytest.mark.parametrize("mode", ["auto", "off", "ngram"])
def test_spec_setting_in_config_is_read_once_and_a_flag_wins(mode):
    target = str(cached_gguf(qwen35_target()))
    assert run_lucebox("config", "set", "model.spec", "off").returncode == 0
    default = plan("--model", target)[1]
    assert default["spec"]["type"] is None
    chosen = plan("--model", target, "--spec", mode)[1]
    assert chosen["spec"]["type"] == {"auto": "draft-mtp", "off": None, "ngram": "ngram-mod"}[mode]


def test_on_a_cpu_auto_leaves_model_drafts_out_and_says_why():
    target = str(cached_gguf(qwen35_target()))
    result = run_lucebox("plan", "--model", target, "--json")  # this machine: no GPU
    document = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert document["spec"]["type"] == "ngram-mod"
    assert "not draft-mtp: on a CPU" in document["reasons"]["spec"]
    asked = json.loads(run_lucebox("plan", "--model", target, "--spec", "mtp", "--json").stdout)
    assert asked["spec"]["type"] == "draft-mtp"  # the user's choice is respected


def test_on_a_cpu_a_draft_the_user_names_is_tried_and_the_guard_watches_it():
    target_spec = qwen35_target()
    target, draft = cached_gguf(target_spec), cached_gguf(dflash_for(target_spec))
    result = run_lucebox("plan", "--model", str(target), "--draft", str(draft), "--json")
    document = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert document["spec"]["type"] == "draft-dflash"  # the target's own MTP head is left out
    reason = document["reasons"]["spec"]
    assert "not draft-mtp: on a CPU" in reason and "the named draft is tried on a CPU" in reason
    assert "then stops speculating, below the 65% break-even measured for draft-dflash" in reason


def test_a_mode_set_in_config_is_the_users_choice_and_the_guard_only_warns():
    target_spec = qwen35_target()
    target, draft = cached_gguf(target_spec), cached_gguf(dflash_for(target_spec))
    assert run_lucebox("config", "set", "model.spec", "dflash").returncode == 0
    code, document, err = plan("--model", str(target), "--draft", str(draft))
    assert code == 0, err
    reason = document["reasons"]["spec"]
    assert 'model.spec = "dflash" in config.toml' in reason and "the guard warns below" in reason
