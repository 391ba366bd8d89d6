"""Write real GGUF files with the official gguf writer: tiny loadable models for tests and runs.

``write_llama`` makes a random-weight llama model that llama-server loads and serves (garbage
text, real compute); the metadata knobs let tests build base/instruct, draft/target and
split-file cases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


def vocab(spec: ModelSpec) -> list[str]:
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tokens = specials + byte_tokens + ["\u2581" + w for w in spec.extra_words]
    if spec.vocab_size is not None:
        tokens += [f"\u2581t{i}" for i in range(spec.vocab_size - len(tokens))]
    return tokens


def write_llama(path: Path, spec: ModelSpec | None = None) -> Path:
    """A random-weight llama-architecture GGUF with an SPM tokenizer llama.cpp accepts."""
    spec = spec or ModelSpec()
    rng = np.random.default_rng(spec.seed)
    tokens = vocab(spec)
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(spec.name)
    if spec.basename:
        writer.add_basename(spec.basename)
    if spec.finetune:
        writer.add_finetune(spec.finetune)
    if spec.size_label:
        writer.add_size_label(spec.size_label)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    head_dim = spec.head_dim or spec.n_embd // spec.n_head
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if spec.arch != "gemma3":
        writer.add_rope_dimension_count(head_dim)
    if spec.sliding_window is not None:
        writer.add_sliding_window(spec.sliding_window)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == np.float16 else 0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    n_words = n_vocab - 261
    writer.add_token_scores([0.0] * 5 + [-1000.0] * 256 + [-float(i) for i in range(n_words)])
    types = [2, 3, 3, 3, 3] + [6] * 256 + [1] * n_words
    writer.add_token_types(types)
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
        else:
            writer.add_string(key, str(value))

    shared: dict[tuple[tuple[int, ...], bool], np.ndarray] = {}

    def tensor(name: str, *shape: int, norm: bool = False) -> None:
        key = (shape, norm)
        if spec.header_only:
            dtype = np.dtype(np.float32 if norm else spec.dtype)
            # gguf takes numpy's (rows, cols) order: the reverse of GGUF's dimension order.
            writer.add_tensor_info(
                name, tuple(reversed(shape)), dtype, int(np.prod(shape)) * dtype.itemsize
            )
            return
        if spec.constant_weights and key in shared:
            data = shared[key]
        elif norm:
            data = np.ones(shape, dtype=np.float32)
        elif spec.constant_weights:
            data = np.full(shape, 0.01, dtype=spec.dtype)
        else:
            data = rng.normal(0, 0.02, shape).astype(spec.dtype)
        shared[key] = data
        writer.add_tensor(name, data)

    q_width = spec.n_head * head_dim
    tensor("token_embd.weight", n_vocab, spec.n_embd)
    tensor("output_norm.weight", spec.n_embd, norm=True)
    if spec.arch != "gemma3":  # gemma ties the output matrix to the embeddings
        tensor("output.weight", n_vocab, spec.n_embd)
    for i in range(spec.n_layer):
        tensor(f"blk.{i}.attn_norm.weight", spec.n_embd, norm=True)
        tensor(f"blk.{i}.attn_q.weight", q_width, spec.n_embd)
        tensor(f"blk.{i}.attn_k.weight", spec.n_head_kv * head_dim, spec.n_embd)
        tensor(f"blk.{i}.attn_v.weight", spec.n_head_kv * head_dim, spec.n_embd)
        tensor(f"blk.{i}.attn_output.weight", spec.n_embd, q_width)
        if spec.arch == "gemma3":
            tensor(f"blk.{i}.attn_q_norm.weight", head_dim, norm=True)
            tensor(f"blk.{i}.attn_k_norm.weight", head_dim, norm=True)
            tensor(f"blk.{i}.post_attention_norm.weight", spec.n_embd, norm=True)
            tensor(f"blk.{i}.post_ffw_norm.weight", spec.n_embd, norm=True)
        tensor(f"blk.{i}.ffn_norm.weight", spec.n_embd, norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", spec.n_ff, spec.n_embd)
        tensor(f"blk.{i}.ffn_up.weight", spec.n_ff, spec.n_embd)
        tensor(f"blk.{i}.ffn_down.weight", spec.n_embd, spec.n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    if spec.header_only:
        writer.write_ti_data_to_file()
        writer.close()
        from lucebox.engine.gguf import read_header

        header = read_header(path)
        end = max(t.offset + t.n_bytes for t in header.tensors)
        os.truncate(path, header.data_offset + end)
        return path
    writer.write_tensors_to_file()
    writer.close()
    return path


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
}
"""Real architectures at real sizes (llama 3 8B, gemma 3 4B and 270M) with constant weights."""
