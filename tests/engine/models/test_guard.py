"""Model inspection and guards on real GGUF files written with the official gguf writer."""

from __future__ import annotations

import os
import random
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from lucebox.engine.models.guard import check_model, check_pair
from lucebox.engine.models.headerinfo import inspect_model
from support.ggufgen import ModelSpec, write_llama

ARCHS = ("llama", "gemma3", "dflash", "qwen2")


def codes(result) -> set[str]:
    return {p.code for p in result.problems}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {
        "instruct": write_llama(folder / "tiny-llama-instruct-f16.gguf"),
        "base": write_llama(
            folder / "tiny-llama-base-f16.gguf",
            ModelSpec(name="Tiny Llama Base", finetune="base", chat_template=None),
        ),
        "draft": write_llama(
            folder / "tiny-draft-instruct.gguf", ModelSpec(n_layer=1, name="Tiny Draft Instruct")
        ),
        "other-vocab": write_llama(
            folder / "other-vocab-instruct.gguf",
            ModelSpec(extra_words=("cat", "dog", "sun", "moon", "sea", "sky")),
        ),
        "big-vocab": write_llama(
            folder / "big-vocab-instruct.gguf",
            ModelSpec(extra_words=tuple(f"w{i}" for i in range(300))),
        ),
        "other-bos": write_llama(folder / "other-bos-instruct.gguf", ModelSpec(bos_token_id=3)),
    }


def copy_bytes(src: Path, dst: Path, data: bytes | None = None) -> Path:
    dst.write_bytes(src.read_bytes() if data is None else data)
    return dst


def test_complete_instruct_model_is_ok(models):
    result = check_model(models["instruct"], known_archs=ARCHS)
    assert result.verdict == "ok", result.problems
    info = result.info
    assert info is not None
    assert info.architecture == "llama" and info.block_count == 2
    assert info.expected_size_bytes == info.actual_size_bytes
    assert info.has_chat_template and info.chat_template_bytes > 0
    assert info.vocab_size == 5 + 256 + 6
    assert info.head_count == 4 and info.head_count_kv == 2
    assert info.file_type_name == "F16"
    assert set(info.weights_bytes_by_group) >= {"embeddings", "attention", "ffn", "output"}
    assert info.tokenizer_fingerprint and len(info.tokenizer_fingerprint) == 64


def test_trailing_bytes_are_fine(models, tmp_path):
    path = copy_bytes(
        models["instruct"],
        tmp_path / "trailing-instruct.gguf",
        models["instruct"].read_bytes() + b"\0" * 4096,
    )
    assert check_model(path, known_archs=ARCHS).verdict == "ok"


@pytest.mark.parametrize("keep", [10, 30, 200, 2000, "header", "half", "minus-one"])
def test_truncated_at_several_points(models, tmp_path, keep):
    data = models["instruct"].read_bytes()
    info = inspect_model(models["instruct"])
    cut = {"header": info.data_offset, "half": len(data) // 2, "minus-one": len(data) - 1}.get(
        keep, keep
    )
    path = copy_bytes(models["instruct"], tmp_path / "cut-instruct.gguf", data[:cut])
    result = check_model(path, known_archs=ARCHS)
    assert result.verdict == "refuse"
    assert codes(result) == {"truncated"}
    if isinstance(keep, str):
        message = result.problems[0].message
        assert f"{cut:,} of {len(data):,} bytes" in message and "% present" in message


@pytest.mark.parametrize(
    ("data", "code"),
    [(b"", "not-gguf"), (b"GGU", "not-gguf"), (b"PK\x03\x04" + b"\0" * 100, "not-gguf")],
)
def test_not_gguf(tmp_path, data, code):
    path = tmp_path / "file-instruct.gguf"
    path.write_bytes(data)
    assert codes(check_model(path)) == {code}


def patched(src: Path, dst: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "fragment"),
    [
        (4, "<I", 99, "version 99"),
        (8, "<Q", 1 << 40, "absurd counts"),
        (16, "<Q", 1 << 40, "absurd counts"),
        (24, "<Q", 1 << 60, "claims"),
    ],
)
def test_corrupt_headers(models, tmp_path, offset, fmt, value, fragment):
    path = patched(models["instruct"], tmp_path / "bad-instruct.gguf", offset, fmt, value)
    result = check_model(path)
    assert codes(result) == {"corrupt-header"}
    assert fragment in result.problems[0].message


def test_unknown_value_type(models, tmp_path):
    # The first key is a string; its value type follows the key's length and bytes.
    data = models["instruct"].read_bytes()
    key_len = struct.unpack_from("<Q", data, 24)[0]
    path = patched(models["instruct"], tmp_path / "type-instruct.gguf", 32 + key_len, "<I", 77)
    assert codes(check_model(path)) == {"corrupt-header"}


def test_string_running_past_the_end(models, tmp_path):
    data = models["instruct"].read_bytes()
    path = patched(models["instruct"], tmp_path / "long-instruct.gguf", 24, "<Q", len(data) * 2)
    assert codes(check_model(path)) in ({"truncated"}, {"corrupt-header"})


def test_base_model_and_missing_template_are_refused_unless_allowed(models):
    refused = check_model(models["base"], known_archs=ARCHS)
    assert refused.verdict == "refuse"
    assert codes(refused) == {"no-chat-template", "base-model"}
    assert all("--allow-base" in p.message for p in refused.problems)
    allowed = check_model(models["base"], known_archs=ARCHS, allow_base=True)
    assert allowed.verdict == "warn"
    assert {p.severity for p in allowed.problems} == {"warning"}


def test_template_supplied_by_a_preset(models):
    result = check_model(models["base"], known_archs=ARCHS, template_supplied=True, allow_base=True)
    assert codes(result) == {"base-model"}


@pytest.mark.parametrize(
    ("name", "finetune", "is_base"),
    [
        ("gemma-3-270m", None, True),
        ("gemma-3-270m-it", None, False),
        ("Meta-Llama-3.1-8B", None, True),
        ("Meta-Llama-3.1-8B-Instruct", None, False),
        ("Qwen2.5-7B", None, True),
        ("Qwen2.5-7B-Instruct", None, False),
        ("Hermes 3 Llama 3.1 8B", None, False),
        ("Some Model", "pretrained", True),
        ("Some Model", "Instruct", False),
    ],
)
def test_base_model_naming(tmp_path, name, finetune, is_base):
    path = write_llama(
        tmp_path / "model.gguf",
        ModelSpec(name=name, basename=None, finetune=finetune, size_label=None),
    )
    assert ("base-model" in codes(check_model(path))) == is_base


def test_unsupported_arch(tmp_path):
    path = write_llama(tmp_path / "odd-instruct.gguf", ModelSpec(arch="nonsense"))
    result = check_model(path, known_archs=ARCHS)
    assert codes(result) == {"unsupported-arch"}
    assert "nonsense" in result.problems[0].message
    unchecked = check_model(path, known_archs=None)
    assert unchecked.verdict == "ok" and unchecked.notes


def test_incomplete_download_markers(models, tmp_path):
    path = copy_bytes(models["instruct"], tmp_path / "dl-instruct.gguf")
    (tmp_path / "dl-instruct.gguf.part").write_bytes(b"partial")
    assert "incomplete-download" in codes(check_model(path, known_archs=ARCHS))
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    blob = copy_bytes(models["instruct"], blobs / "abc123")
    (blobs / "abc123.incomplete").write_bytes(b"")
    link = tmp_path / "linked-instruct.gguf"
    link.symlink_to(blob)
    assert "incomplete-download" in codes(check_model(link, known_archs=ARCHS))


def write_shards(folder: Path, count: int) -> list[Path]:
    return [
        write_llama(
            folder / f"split-instruct-{n:05d}-of-{count:05d}.gguf",
            ModelSpec(extra_kv={"split.count": count, "split.no": n - 1}),
        )
        for n in range(1, count + 1)
    ]


def test_split_model_complete_missing_and_short(tmp_path):
    shards = write_shards(tmp_path, 3)
    assert check_model(shards[0], known_archs=ARCHS).verdict == "ok"
    data = shards[2].read_bytes()
    shards[2].write_bytes(data[: len(data) - 1000])
    short = check_model(shards[0], known_archs=ARCHS)
    assert codes(short) == {"missing-shard"} and "00003" in short.problems[0].message
    shards[1].unlink()
    missing = check_model(shards[0], known_archs=ARCHS)
    assert "shard 2 of 3" in " ".join(p.message for p in missing.problems)


def test_matching_draft_pair(models):
    draft, target = check_pair(
        models["draft"],
        models["instruct"],
        known_archs=ARCHS,
        spec_types=("draft-simple", "draft-dflash"),
    )
    assert draft.verdict == "ok" and target.verdict == "ok"
    assert draft.speculative_type == "draft-simple"


@pytest.mark.parametrize("other", ["other-vocab", "big-vocab", "other-bos"])
def test_mismatching_draft_pairs(models, other):
    draft, _ = check_pair(models[other], models["instruct"], known_archs=ARCHS)
    assert codes(draft) == {"draft-vocab-mismatch"}


def dflash_draft(path: Path, target_layers: list[int], n_embd: int = 64) -> Path:
    return write_llama(
        path,
        ModelSpec(
            arch="dflash",
            name="Tiny DFlash",
            n_embd=n_embd,
            extra_kv={"dflash.target_layers": target_layers},
        ),
    )


def test_dflash_draft(models, tmp_path):
    good = dflash_draft(tmp_path / "good-dflash.gguf", [0, 1])
    draft, _ = check_pair(good, models["instruct"], known_archs=ARCHS, spec_types=("draft-dflash",))
    assert draft.verdict == "ok" and draft.speculative_type == "draft-dflash"
    deep = dflash_draft(tmp_path / "deep-dflash.gguf", [0, 5, 40])
    draft, _ = check_pair(deep, models["instruct"], known_archs=ARCHS)
    assert codes(draft) == {"draft-arch-mismatch"}
    assert "[5, 40]" in draft.problems[0].message
    engine_without_dflash, _ = check_pair(
        good, models["instruct"], known_archs=ARCHS, spec_types=("draft-simple",)
    )
    assert codes(engine_without_dflash) == {"draft-arch-mismatch"}


@pytest.mark.parametrize("arch", ["qwen35-dflash-draft", "dflash-draft", "gemma4-dflash-draft"])
def test_drafts_for_another_engine_are_refused_by_name(models, tmp_path, arch):
    path = write_llama(tmp_path / f"{arch}.gguf", ModelSpec(arch=arch))
    draft, _ = check_pair(path, models["instruct"], known_archs=ARCHS)
    assert codes(draft) == {"draft-arch-mismatch"}
    assert (
        f"'{arch}' is a draft for the Lucebox engine (dflash_server)" in draft.problems[0].message
    )
    assert "serve the pair with --engine lucebox" in draft.problems[0].message
    as_target = check_model(path, known_archs=ARCHS)
    assert codes(as_target) == {"draft-only"}
    assert "it needs a target" in as_target.problems[0].message
    assert "give this file as --draft --engine lucebox" in as_target.problems[0].message


def test_a_draft_given_as_the_target_is_refused_as_a_draft(models, tmp_path):
    dflash = dflash_draft(tmp_path / "qwen3-dflash.gguf", [0, 1])
    result = check_model(dflash, known_archs=(*ARCHS, "dflash"))
    assert codes(result) == {"draft-only"}
    assert "a DFlash draft ('dflash'): a draft, it needs a target" in result.problems[0].message
    assert "no-chat-template" not in codes(result)


def test_fuzzed_headers_never_escape(models, tmp_path):
    """Thousands of mutated headers: no exception escapes, each ends fast, memory stays small."""
    original = models["instruct"].read_bytes()
    header_end = inspect_model(models["instruct"]).data_offset
    rng = random.Random(1234)
    path = tmp_path / "fuzz-instruct.gguf"
    tracemalloc.start()
    slowest_s = 0.0
    try:
        for _ in range(3000):
            data = bytearray(original[: header_end + 4096])
            for _ in range(rng.randint(1, 8)):
                position = rng.randrange(0, header_end)
                data[position] = rng.randrange(256)
            if rng.random() < 0.2:
                data = data[: rng.randrange(0, len(data))]
            path.write_bytes(bytes(data))
            started = time.perf_counter()
            result = check_model(path, known_archs=ARCHS)
            slowest_s = max(slowest_s, time.perf_counter() - started)
            assert result.verdict in {"ok", "warn", "refuse"}
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (
        slowest_s < 10.0
    )  # never hangs; benchmarks/model_check_reads_header.py measures the speed
    assert peak_bytes < 64 * 2**20


@pytest.mark.slow
def test_real_gemma_is_a_base_model_without_template():
    from support.realmodels import gemma_model

    result = check_model(gemma_model(), known_archs=ARCHS)
    assert codes(result) == {"no-chat-template", "base-model"}
    info = result.info
    assert info is not None
    assert info.architecture == "gemma3" and info.block_count == 18
    assert info.context_length == 32768 and info.sliding_window == 512
    assert info.vocab_size == 262144
    assert info.expected_size_bytes == info.actual_size_bytes == 253_113_024
    assert info.header_bytes_read < 16 * 2**20
    assert os.path.getsize(gemma_model()) == 253_113_024
