"""The generated speculation models: what their headers say, read the way the planner reads
them (``inspect_model``), and how the test cache keeps them."""

from __future__ import annotations

import dataclasses
import os

import pytest

from lucebox.engine.models.gguf import read_header
from lucebox.engine.models.headerinfo import inspect_model
from support.ggufgen import (
    AssistantSpec,
    LuceboxDFlashSpec,
    cached_gguf,
    dflash_for,
    draft_model_for,
    qwen3_pair,
    qwen35_target,
    spec_digest,
    token_id,
    widen,
    write_gguf,
)


def test_qwen35_with_mtp_head(tmp_path):
    spec = qwen35_target()
    info = inspect_model(write_gguf(tmp_path / "mtp.gguf", spec))
    assert info.architecture == "qwen35"
    assert info.block_count == spec.n_layer + 1
    assert info.nextn_predict_layers == 1
    assert info.has_mtp_layers and info.has_nextn_tensors
    assert info.draft_kind == "draft-mtp"
    assert info.weights_bytes_by_group["mtp"] > 0
    # Three linear-attention layers, then one full-attention layer, then the MTP block.
    assert info.recurrent_layers == (0, 1, 2)
    assert info.kv_layers == (3, 4)
    assert set(info.ssm) == {"conv_kernel", "inner_size", "state_size", "group_count"}
    assert info.has_chat_template and not info.has_markov_head


def test_qwen35_without_head(tmp_path):
    info = inspect_model(write_gguf(tmp_path / "plain.gguf", qwen35_target(mtp=False)))
    assert info.block_count == 4 and info.nextn_predict_layers is None
    assert not info.has_mtp_layers and not info.has_nextn_tensors
    assert info.draft_kind is None


@pytest.mark.parametrize("dspark", [False, True])
def test_dflash_and_dspark_drafts(tmp_path, dspark):
    target = qwen35_target()
    spec = dflash_for(target, dspark=dspark)
    info = inspect_model(write_gguf(tmp_path / "draft.gguf", spec))
    assert info.architecture == "dflash"
    assert info.draft_kind == ("draft-dspark" if dspark else "draft-dflash")
    assert info.has_markov_head is dspark
    assert info.embedding_length == target.n_embd
    assert info.target_layers == (1, 3)
    assert info.dflash_block_size == 16
    assert info.mask_token_id == token_id(target, "<|mask|>")
    # It shares the target's embeddings and output head, so it carries neither.
    assert "embeddings" not in info.weights_bytes_by_group
    target_info = inspect_model(write_gguf(tmp_path / "target.gguf", target))
    assert info.tokenizer_fingerprint == target_info.tokenizer_fingerprint


def test_qwen3_pair_shares_a_tokenizer(tmp_path):
    target, draft = qwen3_pair()
    t = inspect_model(write_gguf(tmp_path / "t.gguf", target))
    d = inspect_model(write_gguf(tmp_path / "d.gguf", draft))
    assert t.architecture == d.architecture == "qwen3"
    assert t.tokenizer_fingerprint == d.tokenizer_fingerprint
    assert d.weights_bytes < t.weights_bytes / 3
    hybrid_draft = inspect_model(write_gguf(tmp_path / "h.gguf", draft_model_for(qwen35_target())))
    assert (
        hybrid_draft.vocab_size
        == inspect_model(write_gguf(tmp_path / "q.gguf", qwen35_target())).vocab_size
    )


def test_lucebox_draft_header(tmp_path):
    info = inspect_model(write_gguf(tmp_path / "luce.gguf", LuceboxDFlashSpec()))
    assert info.architecture == "qwen35-dflash-draft"
    assert info.dflash_block_size == 16 and info.mask_token_id == 5
    assert info.vocab_size is None and info.draft_kind is None
    assert info.actual_size_bytes == info.expected_size_bytes


def test_gemma4_assistant_header(tmp_path):
    spec = AssistantSpec()
    info = inspect_model(write_gguf(tmp_path / "assistant.gguf", spec))
    assert info.architecture == "gemma4-assistant"
    assert info.nextn_predict_layers == spec.n_layer == info.block_count
    assert info.embedding_length_out == spec.target_n_embd
    assert info.has_nextn_tensors and not info.has_mtp_layers
    assert info.kv_layers == ()  # it reads the target's KV cache


def test_widen_keeps_heads_and_grows_the_weights(tmp_path):
    small = qwen35_target()
    big = widen(small, 4)
    s = inspect_model(write_gguf(tmp_path / "s.gguf", dataclasses.replace(small, header_only=True)))
    b = inspect_model(write_gguf(tmp_path / "b.gguf", dataclasses.replace(big, header_only=True)))
    assert (b.embedding_length, s.embedding_length) == (4 * small.n_embd, small.n_embd)
    assert b.key_length == s.key_length
    assert b.weights_bytes > 4 * s.weights_bytes
    assert b.ssm["group_count"] == 4 * s.ssm["group_count"]


def test_cache_writes_once_and_keys_by_spec(tmp_path):
    spec = qwen35_target()
    first = cached_gguf(spec, tmp_path)
    written_ns = first.stat().st_mtime_ns
    again = cached_gguf(qwen35_target(), tmp_path)
    assert again == first and again.stat().st_mtime_ns == written_ns
    other = cached_gguf(qwen35_target(seed=1), tmp_path)
    assert other != first
    assert spec_digest(spec) != spec_digest(qwen35_target(agree_token="hello"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert os.path.getsize(first) == inspect_model(first).expected_size_bytes


@pytest.mark.parametrize("header_only", [False, True])
def test_quantized_weights(tmp_path, header_only):
    spec = qwen35_target(quant="Q8_0", header_only=header_only, constant_weights=True)
    path = write_gguf(tmp_path / "q8.gguf", spec)
    info = inspect_model(path)
    assert info.quantization == info.file_type_name == "Q8_0"
    for draft in (dflash_for(spec), dflash_for(spec, dspark=True), draft_model_for(spec)):
        assert inspect_model(write_gguf(tmp_path / "d.gguf", draft)).quantization == "Q8_0"
    assert info.actual_size_bytes == info.expected_size_bytes
    f16 = inspect_model(write_gguf(tmp_path / "f16.gguf", qwen35_target(header_only=True)))
    assert info.weights_bytes < 0.6 * f16.weights_bytes


def test_header_only_files_describe_the_same_tensors(tmp_path):
    spec = qwen35_target(quant="Q8_0")
    full = read_header(write_gguf(tmp_path / "full.gguf", spec))
    hole = dataclasses.replace(spec, header_only=True)
    header = read_header(write_gguf(tmp_path / "hole.gguf", hole))
    assert [(t.name, t.shape, t.ggml_type) for t in header.tensors] == [
        (t.name, t.shape, t.ggml_type) for t in full.tensors
    ]
