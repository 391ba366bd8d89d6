"""Write real GGUF files with the official gguf writer: tiny loadable models for tests and runs.

``write_llama`` makes a random-weight llama (or gemma3 / qwen3) model that llama-server loads and
serves (garbage text, real compute); the metadata knobs let tests build base/instruct,
draft/target and split-file cases. ``write_gguf`` also writes the speculation families: a hybrid
``qwen35`` target with or without its MTP head, a ``dflash`` / DSpark draft for it, and the
headers of drafts llama-server cannot run (Lucebox ``qwen35-dflash-draft``, ``gemma4-assistant``).
``cached_gguf`` keeps each file in the test cache under a hash of its spec, so tests and later
runs share them. Which keys and tensors each architecture needs comes from the pinned engine
source (``src/models/<arch>.cpp``, ``src/llama-arch.cpp``, ``conversion/qwen.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import gguf
import numpy as np

from support.bigram import DRAFT_SHARE, BigramTable, bigram_tensor, table_for

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GENERATOR_VERSION = 1
"""Part of every cached file's hash: bump it when the bytes written for a spec change."""
AGREE_EMBEDDING = 100.0
"""Dimension 0 of every token embedding when a spec has ``agree_token``: it dominates the
residual stream, so the final norm (which keeps only that dimension) is always positive."""


@dataclass
class ModelSpec:
    arch: str = "llama"
    name: str = "Tiny Llama Instruct"
    basename: str | None = "tiny-llama"
    finetune: str | None = "Instruct"
    size_label: str | None = "1M"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 2048
    extra_words: tuple[str, ...] = ("hello", "world", "the", "a", "model", "test")
    chat_template: str | None = CHATML
    dtype: type = np.float16
    extra_kv: dict[str, object] = field(default_factory=dict)
    seed: int = 0
    bos_token_id: int = 1
    vocab_size: int | None = None
    """Pad the vocabulary with filler tokens up to this size (real embedding sizes)."""
    head_dim: int | None = None
    sliding_window: int | None = None
    constant_weights: bool = False
    """Share one constant array per shape: fast to write, same memory once loaded."""
    header_only: bool = False
    """Write the header and tensor infos only; the data is a sparse hole (planner tests)."""
    extra_specials: tuple[str, ...] = ()
    """Control tokens after the ChatML ones (a DFlash mask token)."""
    split_max_tensors: int = 0
    """Write split shards (``<stem>-0000N-of-0000M.gguf``) of at most this many tensors each,
    as gguf-split and convert_hf_to_gguf.py --split-max-tensors do."""
    quant: str | None = None
    """Quantize the weight matrices (``"Q8_0"``, ``"Q4_0"``) with gguf-py, as downloads are;
    norms and small state stay F32."""
    agree_token: str | None = None
    """Make greedy decoding repeat this word whatever the weights compute: every layer still
    runs on random weights, but each token embedding carries ``AGREE_EMBEDDING`` in dimension 0
    and the final norm keeps only that dimension, which the output head maps to this word. Any
    draft built the same way (MTP head, DFlash draft, draft model) then predicts exactly what
    the target decodes: acceptance 1. Random weights without it accept almost nothing."""
    successors: int = 0
    """With K > 0 the model is in effect a bigram table over ``active_tokens`` tokens, K
    successors each (``support/bigram.py`` states the construction): greedy decoding is
    deterministic, temperature 0.7 samples the first successor 0.7 of the time."""
    active_tokens: int = 48
    """The bigram table's vocabulary (at most ``n_embd`` and the vocabulary's words)."""
    agree_share: float = 1.0
    """The share of the bigram table's slots whose first successor this file's drafts keep:
    a draft model's own head, or the MTP head of a target that has one (its output head then
    keeps the whole table); 1.0 for a target, less for a draft that should disagree."""


@dataclass
class HybridSpec(ModelSpec):
    """A Qwen3.5 / 3.6 style hybrid: gated delta-net layers, one full-attention layer in
    ``full_attention_interval``, and ``nextn_layers`` MTP blocks after the ``n_layer`` trunk."""

    arch: str = "qwen35"
    name: str = "Tiny Qwen3.5 Instruct"
    basename: str | None = "tiny-qwen35"
    n_layer: int = 4
    head_dim: int | None = 16
    rope_dims: int = 8
    rope_sections: tuple[int, int, int, int] = (2, 1, 1, 0)
    """IMRoPE sections: the loader requires 4 entries (sum = rope_dims / 2)."""
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16
    """Head size of the linear-attention keys and values."""
    ssm_group_count: int = 2
    """Linear-attention key heads."""
    ssm_time_step_rank: int = 4
    """Linear-attention value heads."""
    nextn_layers: int = 1
    extra_specials: tuple[str, ...] = ("<|mask|>",)


@dataclass
class DFlashSpec(ModelSpec):
    """An upstream DFlash draft (``general.architecture`` = ``dflash``) for a target whose
    vocabulary and hidden size it shares; its token embeddings and output head are the
    target's unless ``own_head``. ``markov_rank`` adds the DSpark Markov head."""

    arch: str = "dflash"
    name: str = "Tiny DFlash Draft"
    basename: str | None = "tiny-dflash"
    finetune: str | None = None
    n_layer: int = 1
    head_dim: int | None = 16
    target_layers: tuple[int, ...] = (1, 3)
    """Target layers whose inputs the draft reads (the file's ``dflash.target_layers``)."""
    block_size: int = 16
    mask_token: str = "<|mask|>"
    markov_rank: int | None = None
    own_head: bool = False
    mrope_target: bool = True
    """The target uses M-RoPE (qwen35): write degenerate rope sections like the converter."""


@dataclass
class LuceboxDFlashSpec(ModelSpec):
    """A draft for the Lucebox engine (``dflash_server``), arch ``qwen35-dflash-draft``: header
    keys under ``<arch>.dflash.*``, tensors ``dflash.fc`` / ``dflash.hidden_norm``, no tokenizer.
    llama-server cannot load it; written for inspection and refusal tests."""

    arch: str = "qwen35-dflash-draft"
    name: str = "Qwen3.5-Tiny-DFlash-Draft"
    n_layer: int = 2
    head_dim: int | None = 16
    n_target_layers: int = 2
    block_size: int = 16
    mask_token_id: int = 5


@dataclass
class AssistantSpec(ModelSpec):
    """A Gemma 4 MTP assistant draft (``gemma4-assistant``): ``n_layer`` nextn blocks that read
    a ``target_n_embd``-wide backbone hidden state. Header-faithful; not a loadable pair here
    (its target, a gemma4 model, is not generated)."""

    arch: str = "gemma4-assistant"
    name: str = "Tiny Gemma4 Assistant"
    basename: str | None = "tiny-gemma4-assistant"
    n_layer: int = 4
    head_dim: int | None = 16
    sliding_window: int | None = 512
    target_n_embd: int = 128


@dataclass
class ProjectorSpec(ModelSpec):
    """A LLaVA-style vision projector (``mmproj``, architecture ``clip``, projector type
    ``mlp``): a ViT of ``n_layer`` blocks over ``image_size``/``patch_size`` patches plus a
    class token, then ``mm.0``/``mm.2`` projecting to ``target_n_embd`` (the text model's
    width). The tensors are the ones tools/mtmd/clip.cpp's loader and llava graph read."""

    arch: str = "clip"
    name: str = "Tiny Vision Projector"
    basename: str | None = "tiny-mmproj"
    finetune: str | None = None
    size_label: str | None = None
    n_layer: int = 2
    n_embd: int = 32
    n_head: int = 2
    n_ff: int = 64
    image_size: int = 32
    patch_size: int = 8
    target_n_embd: int = 64
    chat_template: str | None = None
    projector_type: str = "mlp"
    """What the header names (the tensors stay LLaVA's: only readers of the header see it)."""


def vocab(spec: ModelSpec) -> list[str]:
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", *spec.extra_specials]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tokens = specials + byte_tokens + ["\u2581" + w for w in spec.extra_words]
    if spec.vocab_size is not None:
        tokens += [f"\u2581t{i}" for i in range(spec.vocab_size - len(tokens))]
    return tokens


def token_id(spec: ModelSpec, word: str) -> int:
    """The id of a word (``hello``) or special token (``<|mask|>``) in ``spec``'s vocabulary."""
    tokens = vocab(spec)
    return tokens.index(word) if word in tokens else tokens.index("\u2581" + word)


def _start(path: Path, spec: ModelSpec, *, tokenizer: bool = True) -> gguf.GGUFWriter:
    """A writer with the general keys, the SPM tokenizer and ``extra_kv`` added."""
    writer = gguf.GGUFWriter(str(path), spec.arch, split_max_tensors=spec.split_max_tensors)
    writer.add_name(spec.name)
    if spec.basename:
        writer.add_basename(spec.basename)
    if spec.finetune:
        writer.add_finetune(spec.finetune)
    if spec.size_label:
        writer.add_size_label(spec.size_label)
    if spec.quant:
        # A K-quant block type (Q4_K) names the file type of its medium mix (Q4_K_M).
        types = gguf.LlamaFileType.__members__
        file_type = types.get(f"MOSTLY_{spec.quant}") or types[f"MOSTLY_{spec.quant}_M"]
        writer.add_file_type(file_type)
    else:
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == np.float16 else 0)
    if tokenizer:
        tokens = vocab(spec)
        n_specials = 5 + len(spec.extra_specials)
        n_words = len(tokens) - n_specials - 256
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(
            [0.0] * n_specials + [-1000.0] * 256 + [-float(i) for i in range(n_words)]
        )
        writer.add_token_types([2, 3, 3, 3, 3] + [3] * len(spec.extra_specials) + [6] * 256
                               + [1] * n_words)  # fmt: skip
        writer.add_bos_token_id(spec.bos_token_id)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        if spec.chat_template is not None:
            writer.add_chat_template(spec.chat_template)
    for key, value in spec.extra_kv.items():
        if isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, str(value))
    return writer


def _attention_keys(writer: gguf.GGUFWriter, spec: ModelSpec, block_count: int) -> int:
    """Sizes every transformer here shares; returns the head size."""
    head_dim = spec.head_dim or spec.n_embd // spec.n_head
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(block_count)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    return head_dim


Tensor = Callable[..., None]


def _tensors(writer: gguf.GGUFWriter, spec: ModelSpec) -> Tensor:
    """``tensor(name, *shape, kind="weight"|"norm"|"f32")``: shape in numpy order (rows, cols),
    the reverse of GGUF's; norms are ones, weights random (or constant), f32 for small state."""
    rng = np.random.default_rng(spec.seed)
    shared: dict[tuple[tuple[int, ...], str], np.ndarray] = {}
    agree = token_id(spec, spec.agree_token) if spec.agree_token else None
    bigram = _bigram_table(spec)

    def tensor(name: str, *shape: int, kind: str = "weight") -> None:
        dtype = np.dtype(spec.dtype if kind == "weight" else np.float32)
        quant = gguf.GGMLQuantizationType[spec.quant] if spec.quant and kind == "weight" else None
        if spec.header_only:
            # Like add_tensor, add_tensor_info takes numpy's (rows, cols) order.
            n_bytes = int(np.prod(shape)) * dtype.itemsize
            if quant is not None:
                block, type_size = gguf.GGML_QUANT_SIZES[quant]
                n_bytes = int(np.prod(shape)) // block * type_size
            writer.add_tensor_info(name, shape, dtype, n_bytes, raw_dtype=quant)
            return
        key = (shape, kind)
        if spec.constant_weights and key in shared:
            data = shared[key]
        elif kind == "norm":
            data = np.ones(shape, dtype=np.float32)
        elif spec.constant_weights:
            data = np.full(shape, 0.01, dtype=dtype)
        else:
            data = rng.normal(0, 0.02, shape).astype(dtype)
        shared[key] = data
        if name.endswith(".ssm_a"):
            data = -0.5 - np.abs(data)  # a decay: -exp(A_log) is negative in real checkpoints
        if agree is not None:
            data = _agreeing(name, data, agree)
        if bigram is not None:
            data = bigram_tensor(name, data, bigram)
        if quant is None:
            writer.add_tensor(name, data)
            return
        # Constant weights share their quantized form too: an 8B shape quantizes once per shape.
        packed_key = (shape, f"{kind}:{spec.quant}")
        reusable = spec.constant_weights and data is shared[key]
        packed = shared.get(packed_key) if reusable else None
        if packed is None:
            packed = gguf.quants.quantize(data.astype(np.float32), quant)
            if reusable:
                shared[packed_key] = packed
        writer.add_tensor(name, packed, raw_dtype=quant)

    return tensor


def _bigram_table(spec: ModelSpec) -> BigramTable | None:
    """The bigram table of a spec with ``successors`` (a draft's with its ``agree_share``)."""
    if not spec.successors:
        return None
    if spec.arch == "gemma3" or isinstance(spec, (DFlashSpec, LuceboxDFlashSpec)):
        raise ValueError(f"no bigram construction for {type(spec).__name__} {spec.arch}")
    return table_for(spec, 5 + len(spec.extra_specials) + 256, len(vocab(spec)))


def _agreeing(name: str, data: np.ndarray, agree: int) -> np.ndarray:
    """The ``agree_token`` edits: see ``ModelSpec.agree_token``."""
    if name == "token_embd.weight":
        data = data.copy()
        data[:, 0] = AGREE_EMBEDDING
    elif name.endswith(("output_norm.weight", "nextn.shared_head_norm.weight")):
        data = np.zeros_like(data)
        data[0] = 1.0
    elif name == "output.weight":
        data = data.copy()
        data[:, 0] = 0.0
        data[agree, 0] = 1.0
    elif name.endswith("nextn.eh_proj.weight"):
        # Carry the embedding's dimension 0 straight through the MTP block's input projection.
        data = data.copy()
        data[0, 0] = 1.0
    return data


def _finish(writer: gguf.GGUFWriter, path: Path, spec: ModelSpec) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    if spec.header_only:
        writer.write_ti_data_to_file()
        writer.close()
        from lucebox.engine.models.gguf import read_header

        header = read_header(path)
        end = max(t.offset + t.n_bytes for t in header.tensors)
        os.truncate(path, header.data_offset + end)
        return path
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_llama(path: Path, spec: ModelSpec | None = None) -> Path:
    """A random-weight llama, gemma3 or qwen3 GGUF with an SPM tokenizer llama.cpp accepts."""
    spec = spec or ModelSpec()
    n_vocab = len(vocab(spec))
    writer = _start(path, spec)
    head_dim = _attention_keys(writer, spec, spec.n_layer)
    if spec.arch != "gemma3":
        writer.add_rope_dimension_count(head_dim)
    if spec.sliding_window is not None:
        writer.add_sliding_window(spec.sliding_window)
    tensor = _tensors(writer, spec)
    q_width = spec.n_head * head_dim
    tensor("token_embd.weight", n_vocab, spec.n_embd)
    tensor("output_norm.weight", spec.n_embd, kind="norm")
    if spec.arch != "gemma3":  # gemma ties the output matrix to the embeddings
        tensor("output.weight", n_vocab, spec.n_embd)
    for i in range(spec.n_layer):
        tensor(f"blk.{i}.attn_norm.weight", spec.n_embd, kind="norm")
        tensor(f"blk.{i}.attn_q.weight", q_width, spec.n_embd)
        tensor(f"blk.{i}.attn_k.weight", spec.n_head_kv * head_dim, spec.n_embd)
        tensor(f"blk.{i}.attn_v.weight", spec.n_head_kv * head_dim, spec.n_embd)
        tensor(f"blk.{i}.attn_output.weight", spec.n_embd, q_width)
        if spec.arch in ("gemma3", "qwen3"):
            tensor(f"blk.{i}.attn_q_norm.weight", head_dim, kind="norm")
            tensor(f"blk.{i}.attn_k_norm.weight", head_dim, kind="norm")
        if spec.arch == "gemma3":
            tensor(f"blk.{i}.post_attention_norm.weight", spec.n_embd, kind="norm")
            tensor(f"blk.{i}.post_ffw_norm.weight", spec.n_embd, kind="norm")
        tensor(f"blk.{i}.ffn_norm.weight", spec.n_embd, kind="norm")
        tensor(f"blk.{i}.ffn_gate.weight", spec.n_ff, spec.n_embd)
        tensor(f"blk.{i}.ffn_up.weight", spec.n_ff, spec.n_embd)
        tensor(f"blk.{i}.ffn_down.weight", spec.n_embd, spec.n_ff)
    return _finish(writer, path, spec)


def write_qwen35(path: Path, spec: HybridSpec) -> Path:
    """A hybrid qwen35 target; with ``nextn_layers`` it carries the MTP head in its last block."""
    n_vocab = len(vocab(spec))
    writer = _start(path, spec)
    block_count = spec.n_layer + spec.nextn_layers
    head_dim = _attention_keys(writer, spec, block_count)
    arch = spec.arch
    writer.add_rope_dimension_count(spec.rope_dims)
    writer.add_array(f"{arch}.rope.dimension_sections", list(spec.rope_sections))
    writer.add_rope_freq_base(10_000_000.0)
    value_dim = spec.ssm_state_size * spec.ssm_time_step_rank
    key_dim = spec.ssm_state_size * spec.ssm_group_count
    writer.add_uint32(f"{arch}.ssm.conv_kernel", spec.ssm_conv_kernel)
    writer.add_uint32(f"{arch}.ssm.state_size", spec.ssm_state_size)
    writer.add_uint32(f"{arch}.ssm.group_count", spec.ssm_group_count)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", spec.ssm_time_step_rank)
    writer.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    writer.add_uint32(f"{arch}.full_attention_interval", spec.full_attention_interval)
    if spec.nextn_layers:
        writer.add_uint32(f"{arch}.nextn_predict_layers", spec.nextn_layers)
    tensor = _tensors(writer, spec)
    n_embd = spec.n_embd
    q_width = spec.n_head * head_dim
    kv_width = spec.n_head_kv * head_dim

    def attention(i: int) -> None:
        # Qwen3.5 attention projects query and gate together: twice the query width.
        tensor(f"blk.{i}.attn_q.weight", 2 * q_width, n_embd)
        tensor(f"blk.{i}.attn_k.weight", kv_width, n_embd)
        tensor(f"blk.{i}.attn_v.weight", kv_width, n_embd)
        tensor(f"blk.{i}.attn_output.weight", n_embd, q_width)
        tensor(f"blk.{i}.attn_q_norm.weight", head_dim, kind="norm")
        tensor(f"blk.{i}.attn_k_norm.weight", head_dim, kind="norm")

    def ffn(i: int) -> None:
        tensor(f"blk.{i}.ffn_gate.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, spec.n_ff)

    tensor("token_embd.weight", n_vocab, n_embd)
    tensor("output_norm.weight", n_embd, kind="norm")
    tensor("output.weight", n_vocab, n_embd)
    for i in range(spec.n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.post_attention_norm.weight", n_embd, kind="norm")
        if (i + 1) % spec.full_attention_interval == 0:
            attention(i)
        else:
            tensor(f"blk.{i}.attn_qkv.weight", 2 * key_dim + value_dim, n_embd)
            tensor(f"blk.{i}.attn_gate.weight", value_dim, n_embd)
            tensor(f"blk.{i}.ssm_conv1d.weight", 2 * key_dim + value_dim, spec.ssm_conv_kernel,
                   kind="f32")  # fmt: skip
            tensor(f"blk.{i}.ssm_dt.bias", spec.ssm_time_step_rank, kind="f32")
            tensor(f"blk.{i}.ssm_a", spec.ssm_time_step_rank, kind="f32")
            tensor(f"blk.{i}.ssm_beta.weight", spec.ssm_time_step_rank, n_embd)
            tensor(f"blk.{i}.ssm_alpha.weight", spec.ssm_time_step_rank, n_embd)
            tensor(f"blk.{i}.ssm_norm.weight", spec.ssm_state_size, kind="norm")
            tensor(f"blk.{i}.ssm_out.weight", n_embd, value_dim)
        ffn(i)
    for i in range(spec.n_layer, block_count):
        tensor(f"blk.{i}.attn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.post_attention_norm.weight", n_embd, kind="norm")
        attention(i)
        ffn(i)
        tensor(f"blk.{i}.nextn.eh_proj.weight", n_embd, 2 * n_embd)
        tensor(f"blk.{i}.nextn.enorm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.nextn.hnorm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.nextn.shared_head_norm.weight", n_embd, kind="norm")
    return _finish(writer, path, spec)


def write_dflash(path: Path, spec: DFlashSpec) -> Path:
    """A DFlash (or, with ``markov_rank``, DSpark) draft for a target with ``spec``'s vocab."""
    n_vocab = len(vocab(spec))
    writer = _start(path, spec)
    head_dim = _attention_keys(writer, spec, spec.n_layer)
    arch = spec.arch
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10_000_000.0)
    if spec.mrope_target:
        writer.add_array(f"{arch}.rope.dimension_sections", [head_dim // 2, 0, 0, 0])
    writer.add_array(f"{arch}.target_layers", list(spec.target_layers))
    writer.add_uint32(f"{arch}.block_size", spec.block_size)
    writer.add_uint32("tokenizer.ggml.mask_token_id", token_id(spec, spec.mask_token))
    if spec.markov_rank is not None:
        writer.add_bool(f"{arch}.sample_from_anchor", True)
        writer.add_bool(f"{arch}.has_confidence_head", False)
    tensor = _tensors(writer, spec)
    n_embd = spec.n_embd
    q_width = spec.n_head * head_dim
    kv_width = spec.n_head_kv * head_dim
    if spec.own_head:
        tensor("token_embd.weight", n_vocab, n_embd)
        tensor("output.weight", n_vocab, n_embd)
    tensor("fc.weight", n_embd, len(spec.target_layers) * n_embd)
    tensor("enc.output_norm.weight", n_embd, kind="norm")
    tensor("output_norm.weight", n_embd, kind="norm")
    if spec.markov_rank is not None:
        tensor("markov_w1.weight", n_vocab, spec.markov_rank)
        tensor("markov_w2.weight", n_vocab, spec.markov_rank)
    for i in range(spec.n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.attn_q.weight", q_width, n_embd)
        tensor(f"blk.{i}.attn_k.weight", kv_width, n_embd)
        tensor(f"blk.{i}.attn_v.weight", kv_width, n_embd)
        tensor(f"blk.{i}.attn_output.weight", n_embd, q_width)
        tensor(f"blk.{i}.attn_q_norm.weight", head_dim, kind="norm")
        tensor(f"blk.{i}.attn_k_norm.weight", head_dim, kind="norm")
        tensor(f"blk.{i}.ffn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.ffn_gate.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, spec.n_ff)
    return _finish(writer, path, spec)


def write_lucebox_dflash(path: Path, spec: LuceboxDFlashSpec) -> Path:
    """The header (and tensor layout) of a Lucebox-engine DFlash draft."""
    arch = spec.arch
    writer = _start(path, spec, tokenizer=False)
    head_dim = _attention_keys(writer, spec, spec.n_layer)
    writer.add_uint32(f"{arch}.vocab_size", spec.vocab_size or len(vocab(spec)))
    writer.add_rope_freq_base(10_000_000.0)
    writer.add_uint32(f"{arch}.dflash.n_target_layers", spec.n_target_layers)
    writer.add_uint32(f"{arch}.dflash.block_size", spec.block_size)
    writer.add_uint32(f"{arch}.dflash.mask_token_id", spec.mask_token_id)
    tensor = _tensors(writer, spec)
    n_embd = spec.n_embd
    tensor("dflash.fc.weight", n_embd, spec.n_target_layers * n_embd)
    tensor("dflash.hidden_norm.weight", n_embd, kind="norm")
    tensor("output_norm.weight", n_embd, kind="norm")
    for i in range(spec.n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.ffn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.attn_q.weight", spec.n_head * head_dim, n_embd)
        tensor(f"blk.{i}.attn_k.weight", spec.n_head_kv * head_dim, n_embd)
        tensor(f"blk.{i}.attn_v.weight", spec.n_head_kv * head_dim, n_embd)
        tensor(f"blk.{i}.attn_output.weight", n_embd, spec.n_head * head_dim)
        tensor(f"blk.{i}.attn_q_norm.weight", head_dim, kind="norm")
        tensor(f"blk.{i}.attn_k_norm.weight", head_dim, kind="norm")
        tensor(f"blk.{i}.ffn_gate.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, spec.n_ff)
    return _finish(writer, path, spec)


def write_assistant(path: Path, spec: AssistantSpec) -> Path:
    """A gemma4-assistant MTP draft: every block is a nextn block (``nextn_predict_layers``)."""
    arch = spec.arch
    n_vocab = len(vocab(spec))
    writer = _start(path, spec)
    head_dim = _attention_keys(writer, spec, spec.n_layer)
    swa = [(i + 1) % spec.n_layer != 0 for i in range(spec.n_layer)]
    writer.add_uint32(f"{arch}.embedding_length_out", spec.target_n_embd)
    writer.add_uint32(f"{arch}.nextn_predict_layers", spec.n_layer)
    writer.add_uint32(f"{arch}.attention.sliding_window", spec.sliding_window or 512)
    writer.add_array(f"{arch}.attention.sliding_window_pattern", swa)
    writer.add_uint32(f"{arch}.attention.key_length_swa", head_dim)
    writer.add_uint32(f"{arch}.attention.value_length_swa", head_dim)
    tensor = _tensors(writer, spec)
    n_embd = spec.n_embd
    q_width = spec.n_head * head_dim
    tensor("token_embd.weight", n_vocab, n_embd)
    tensor("output_norm.weight", n_embd, kind="norm")
    tensor("nextn.pre_projection.weight", n_embd, 2 * spec.target_n_embd)
    tensor("nextn.post_projection.weight", spec.target_n_embd, n_embd)
    tensor("rope_freqs.weight", head_dim // 2, kind="f32")
    for i in range(spec.n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.attn_q.weight", q_width, n_embd)
        tensor(f"blk.{i}.attn_output.weight", n_embd, q_width)
        tensor(f"blk.{i}.attn_q_norm.weight", head_dim, kind="norm")
        tensor(f"blk.{i}.post_attention_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.layer_output_scale.weight", 1, kind="f32")
        tensor(f"blk.{i}.ffn_norm.weight", n_embd, kind="norm")
        tensor(f"blk.{i}.ffn_gate.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", spec.n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, spec.n_ff)
        tensor(f"blk.{i}.post_ffw_norm.weight", n_embd, kind="norm")
    return _finish(writer, path, spec)


def write_projector(path: Path, spec: ProjectorSpec) -> Path:
    """A random-weight LLaVA ``mlp`` projector the pinned engine loads with ``--mmproj``."""
    writer = _start(path, spec, tokenizer=False)
    writer.add_string("clip.projector_type", spec.projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    for key, value in (
        ("embedding_length", spec.n_embd),
        ("feed_forward_length", spec.n_ff),
        ("block_count", spec.n_layer),
        ("attention.head_count", spec.n_head),
        ("projection_dim", spec.target_n_embd),
        ("image_size", spec.image_size),
        ("patch_size", spec.patch_size),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    tensor = _tensors(writer, spec)
    width, n_pos = spec.n_embd, (spec.image_size // spec.patch_size) ** 2 + 1
    # The patch convolution stays unquantized in every precision (its rows are patch-wide).
    tensor("v.patch_embd.weight", width, 3, spec.patch_size, spec.patch_size, kind="f32")
    tensor("v.class_embd", width, kind="f32")
    tensor("v.position_embd.weight", n_pos, width)
    tensor("v.pre_ln.weight", width, kind="norm")
    tensor("v.pre_ln.bias", width, kind="f32")
    for i in range(spec.n_layer):
        for part, rows, cols in (
            ("attn_q", width, width), ("attn_k", width, width), ("attn_v", width, width),
            ("attn_out", width, width), ("ffn_up", spec.n_ff, width),
            ("ffn_down", width, spec.n_ff),
        ):  # fmt: skip
            tensor(f"v.blk.{i}.{part}.weight", rows, cols)
            tensor(f"v.blk.{i}.{part}.bias", rows, kind="f32")
        for norm in ("ln1", "ln2"):
            tensor(f"v.blk.{i}.{norm}.weight", width, kind="norm")
            tensor(f"v.blk.{i}.{norm}.bias", width, kind="f32")
    tensor("mm.0.weight", spec.target_n_embd, width)
    tensor("mm.0.bias", spec.target_n_embd, kind="f32")
    tensor("mm.2.weight", spec.target_n_embd, spec.target_n_embd)
    tensor("mm.2.bias", spec.target_n_embd, kind="f32")
    return _finish(writer, path, spec)


def write_gguf(path: Path, spec: ModelSpec) -> Path:
    """Write ``spec`` with the writer of its kind."""
    if isinstance(spec, ProjectorSpec):
        return write_projector(path, spec)
    if isinstance(spec, HybridSpec):
        return write_qwen35(path, spec)
    if isinstance(spec, DFlashSpec):
        return write_dflash(path, spec)
    if isinstance(spec, LuceboxDFlashSpec):
        return write_lucebox_dflash(path, spec)
    if isinstance(spec, AssistantSpec):
        return write_assistant(path, spec)
    return write_llama(path, spec)


def spec_digest(spec: ModelSpec) -> str:
    """A stable hash of everything that decides the bytes ``write_gguf`` writes for ``spec``."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    # Files written before these fields existed keep their name while the fields are unset.
    for name, unset in (("split_max_tensors", 0), ("successors", 0), ("active_tokens", 48),
                        ("agree_share", 1.0)):  # fmt: skip
        if fields[name] == unset:
            del fields[name]
    fields["dtype"] = np.dtype(spec.dtype).name
    text = f"{GENERATOR_VERSION}:{type(spec).__name__}:{sorted(fields.items())!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_gguf(spec: ModelSpec, folder: Path | None = None) -> Path:
    """``spec`` written once into the test cache (``folder`` for tests of this cache) and reused.

    The file is named by ``spec_digest``, and lands by an atomic rename, so concurrent tests and
    later sessions see a whole file or none.
    """
    if folder is None:
        from support.realmodels import test_cache_dir

        folder = test_cache_dir() / "ggufgen"
    folder.mkdir(parents=True, exist_ok=True)
    stem = (spec.basename or spec.arch).replace("/", "-")
    path = folder / f"{stem}-{spec_digest(spec)}.gguf"
    if path.exists():
        return path
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write_gguf(Path(tmp_name), spec)
        os.replace(tmp_name, path)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return path


AnySpec = TypeVar("AnySpec", bound=ModelSpec)


def widen(spec: AnySpec, factor: int) -> AnySpec:
    """``spec`` with ``factor`` times the width (hidden size, FFN, heads; head sizes kept), for
    runs that need real compute: a GPU, or a CPU benchmark that should not measure overhead."""
    changes: dict[str, Any] = {
        "n_embd": spec.n_embd * factor,
        "n_ff": spec.n_ff * factor,
        "n_head": spec.n_head * factor,
        "n_head_kv": spec.n_head_kv * factor,
    }
    if isinstance(spec, HybridSpec):
        changes["ssm_group_count"] = spec.ssm_group_count * factor
        changes["ssm_time_step_rank"] = spec.ssm_time_step_rank * factor
    if isinstance(spec, AssistantSpec):
        changes["target_n_embd"] = spec.target_n_embd * factor
    return dataclasses.replace(spec, **changes)


def qwen35_target(*, mtp: bool = True, **changes: object) -> HybridSpec:
    """The hybrid target, with its MTP head (``mtp``) or as the plain conversions ship it."""
    spec = HybridSpec(nextn_layers=1 if mtp else 0)
    if not mtp:
        spec = dataclasses.replace(spec, name="Tiny Qwen3.5 Instruct (no MTP)")
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def dflash_for(target: HybridSpec, *, dspark: bool = False, **changes: object) -> DFlashSpec:
    """A DFlash (DSpark) draft sharing ``target``'s vocabulary and hidden size, reading the
    inputs of its second and last trunk layers."""
    spec = DFlashSpec(
        name="Tiny DSpark Draft" if dspark else "Tiny DFlash Draft",
        basename="tiny-dspark" if dspark else "tiny-dflash",
        n_embd=target.n_embd,
        n_head=target.n_head,
        n_head_kv=target.n_head_kv,
        n_ff=target.n_ff,
        n_ctx=target.n_ctx,
        head_dim=target.head_dim,
        extra_words=target.extra_words,
        extra_specials=target.extra_specials,
        vocab_size=target.vocab_size,
        chat_template=target.chat_template,
        dtype=target.dtype,
        quant=target.quant,
        agree_token=target.agree_token,
        constant_weights=target.constant_weights,
        header_only=target.header_only,
        target_layers=(1, target.n_layer - 1),
        markov_rank=32 if dspark else None,
        seed=target.seed + 1,
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def draft_model_for(target: ModelSpec, **changes: object) -> ModelSpec:
    """A one-layer qwen3 draft model with ``target``'s tokenizer, for ``draft-simple``."""
    spec = ModelSpec(
        arch="qwen3",
        name="Tiny Qwen3 Draft Instruct",
        basename="tiny-qwen3-draft",
        size_label=None,
        n_layer=1,
        n_embd=max(64, target.n_embd // 2),
        n_head=4,
        n_head_kv=2,
        n_ff=max(128, target.n_ff // 2),
        n_ctx=target.n_ctx,
        extra_words=target.extra_words,
        extra_specials=target.extra_specials,
        vocab_size=target.vocab_size,
        chat_template=target.chat_template,
        bos_token_id=target.bos_token_id,
        dtype=target.dtype,
        quant=target.quant,
        agree_token=target.agree_token,
        successors=target.successors,
        active_tokens=target.active_tokens,
        constant_weights=target.constant_weights,
        header_only=target.header_only,
        seed=target.seed + 2,
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def qwen3_pair(**changes: object) -> tuple[ModelSpec, ModelSpec]:
    """A qwen3 target and a smaller qwen3 draft with the same tokenizer (``draft-simple``)."""
    target = ModelSpec(
        arch="qwen3", name="Tiny Qwen3 Instruct", basename="tiny-qwen3", n_layer=4,
        n_embd=128, n_head=4, n_head_kv=2, n_ff=256, size_label="4M",
    )  # fmt: skip
    target = dataclasses.replace(target, **changes)  # type: ignore[arg-type]
    return target, draft_model_for(target)


def partial_pair(
    agree_share: float = DRAFT_SHARE, **changes: object
) -> tuple[ModelSpec, ModelSpec]:
    """``qwen3_pair`` as bigram tables (``ModelSpec.successors``): the draft keeps the target's
    first successor on ``agree_share`` of the slots, so greedy acceptance follows the share and
    sampled acceptance falls below it."""
    target, _ = qwen3_pair(**{"successors": 4, "vocab_size": 512, **changes})
    return target, draft_model_for(target, agree_share=agree_share)


SHAPES = {
    "llama8b": ModelSpec(
        name="Random Llama 8B",
        n_layer=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=14336,
        vocab_size=128256,
        n_ctx=131072,
        constant_weights=True,
    ),
    "gemma3-4b": ModelSpec(
        arch="gemma3",
        name="Random Gemma3 4B",
        n_layer=34,
        n_embd=2560,
        n_head=8,
        n_head_kv=4,
        head_dim=256,
        n_ff=10240,
        vocab_size=262144,
        sliding_window=1024,
        n_ctx=131072,
        constant_weights=True,
    ),
    "gemma3-270m": ModelSpec(
        arch="gemma3",
        name="Random Gemma3 270M",
        n_layer=18,
        n_embd=640,
        n_head=4,
        n_head_kv=1,
        head_dim=256,
        n_ff=2048,
        vocab_size=262144,
        sliding_window=512,
        n_ctx=32768,
        constant_weights=True,
    ),
    "qwen35-27b": HybridSpec(
        name="Random Qwen3.5 27B Instruct",
        basename="random-qwen3.5-27b",
        size_label="27B",
        n_layer=64,
        n_embd=5120,
        n_head=24,
        n_head_kv=4,
        head_dim=256,
        n_ff=17408,
        n_ctx=262144,
        rope_dims=64,
        rope_sections=(11, 11, 10, 0),
        ssm_state_size=128,
        ssm_group_count=16,
        ssm_time_step_rank=48,
        vocab_size=248320,
        constant_weights=True,
    ),
}
"""Real architectures at real sizes (llama 3 8B, gemma 3 4B and 270M, and the Qwen3.5 / 3.6 /
3.8 27B hybrid with its MTP block) with constant weights."""
