from __future__ import annotations

import json

from support.ggufgen import ModelSpec, ProjectorSpec, write_gguf, write_llama
from tests.conftest import assert_one_line_error, run_lucebox

INFO_KEYS = {
    "architecture",
    "file_type",
    "context_length",
    "expected_size_bytes",
    "actual_size_bytes",
    "has_chat_template",
    "tokenizer_fingerprint",
}


def test_json_shape_and_exit_codes(tmp_path):
    good = write_llama(tmp_path / "tiny-instruct.gguf")
    base = write_llama(
        tmp_path / "tiny-base.gguf",
        ModelSpec(name="Tiny Base", finetune="base", chat_template=None),
    )
    ok = run_lucebox("models", "check", "--json", str(good))
    assert ok.returncode == 0, ok.stderr
    (entry,) = json.loads(ok.stdout)
    assert entry["path"] == str(good) and entry["verdict"] == "ok" and entry["problems"] == []
    assert set(entry["info"]) >= INFO_KEYS

    refused = run_lucebox("models", "check", "--json", str(good), str(base))
    assert refused.returncode == 3
    entries = json.loads(refused.stdout)
    assert [e["verdict"] for e in entries] == ["ok", "refuse"]
    assert {p["code"] for p in entries[1]["problems"]} == {"no-chat-template", "base-model"}
    for problem in entries[1]["problems"]:
        assert set(problem) == {"code", "severity", "message"}

    allowed = run_lucebox("models", "check", "--allow-base", str(base))
    assert allowed.returncode == 0
    assert "warning base-model" in allowed.stdout


def test_bad_inputs_never_show_a_traceback(tmp_path):
    zero = tmp_path / "zero.gguf"
    zero.write_bytes(b"")
    folder = tmp_path / "folder"
    folder.mkdir()
    result = run_lucebox("models", "check", str(zero), str(folder), str(tmp_path / "missing"))
    assert result.returncode == 3
    assert "Traceback" not in result.stderr + result.stdout
    assert "not-gguf" in result.stdout and "not-found" in result.stdout


def test_draft_pair_reports_the_speculative_type(tmp_path):
    target = write_llama(tmp_path / "target-instruct.gguf")
    draft = write_llama(tmp_path / "draft-instruct.gguf", ModelSpec(n_layer=1))
    result = run_lucebox(
        "models", "check", "--json", "--draft", str(draft), "--target", str(target)
    )
    assert result.returncode == 0, result.stdout
    entries = json.loads(result.stdout)
    assert entries[0]["speculative_type"] == "draft-simple"


def test_draft_without_target_is_a_usage_error(tmp_path):
    result = run_lucebox("models", "check", "--draft", str(tmp_path / "d.gguf"))
    assert result.returncode == 2
    assert_one_line_error(result)


def test_a_projector_is_checked_against_its_model(tmp_path):
    model = write_llama(tmp_path / "tiny-instruct.gguf")
    own = write_gguf(tmp_path / "mmproj-own.gguf", ProjectorSpec(header_only=True))
    other = write_gguf(
        tmp_path / "mmproj-other.gguf", ProjectorSpec(target_n_embd=96, header_only=True)
    )
    ok = run_lucebox("models", "check", "--json", str(model), "--mmproj", str(own))
    assert ok.returncode == 0, ok.stderr
    assert [e["verdict"] for e in json.loads(ok.stdout)] == ["ok", "ok"]
    refused = run_lucebox("models", "check", "--json", str(model), "--mmproj", str(other))
    assert refused.returncode == 3
    entry = json.loads(refused.stdout)[1]
    assert entry["path"] == str(other)
    assert [p["code"] for p in entry["problems"]] == ["mmproj-mismatch"]
    assert "width 96" in entry["problems"][0]["message"]
