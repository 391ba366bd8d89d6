"""What the planner knows about a model: its facts, read from a GGUF header as the pinned
engine reads them (which layers keep KV and how wide, sliding windows, recurrent state,
weights by group). Presets give the same facts before a download (presets.facts_from_preset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lucebox.engine.models.headerinfo import ModelInfo


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know about one model, from its header or its preset."""

    name: str
    architecture: str
    weights_bytes: int
    layer_bytes: int
    """Weights of the repeating layers (what -ngl moves); the rest stays on the GPU."""
    host_bytes: int
    """Weights the engine keeps in host memory: the input embeddings, unless they double as
    the output matrix (tied embeddings)."""
    expert_bytes: int
    """Weights of MoE expert tensors (what --n-cpu-moe moves to the CPU)."""
    n_layer: int
    n_embd: int
    n_vocab: int
    native_ctx: int
    full_kv_elems_per_token: int
    """Sum over full-attention KV layers of kv_heads x (key_length + value_length)."""
    max_layer_kv_elems: int
    """The widest full-attention layer's kv_heads x (key_length + value_length)."""
    swa_kv_elems_per_token: int
    swa_window: int
    recurrent_state_bytes: int
    """Fixed per-sequence state of recurrent layers (f32)."""
    source: str
    """"header" when read from the file, "preset" when from the preset's published facts."""
    max_swa_layer_kv_elems: int = 0
    """The widest sliding-window layer's, which spans only the window without --swa-full."""


def read_swa_patterns(source_dir: Path) -> dict[str, tuple[int, bool]]:
    """Default sliding-window patterns per architecture from the engine source.

    The engine hard-codes them per model file (``load_swa_pattern(ml, 6)`` for gemma3) unless
    the GGUF carries ``<arch>.attention.sliding_window_pattern``.
    """
    patterns: dict[str, tuple[int, bool]] = {}
    for path in sorted((source_dir / "src" / "models").glob("*.cpp")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = re.search(
            r"load_swa_pattern\(\s*ml\s*,\s*(\d+)\s*(?:,\s*(?:/\*.*?\*/\s*)?(true|false))?", text
        )
        if match:
            patterns[path.stem] = (int(match.group(1)), match.group(2) == "true")
    return patterns


def _swa_layers(info: ModelInfo, pattern: tuple[int, bool] | None) -> set[int]:
    if not info.sliding_window:
        return set()
    if info.swa_layers is not None:
        return set(info.swa_layers)
    if pattern is None:
        return set()  # unknown: count every layer as full attention (safe side)
    n_pattern, dense_first = pattern
    layers = range(info.block_count or 0)
    if dense_first:
        return {i for i in layers if n_pattern == 0 or i % n_pattern != 0}
    return {i for i in layers if n_pattern == 0 or i % n_pattern < n_pattern - 1}


def _heads(value: int | tuple[int, ...] | None, layer: int) -> int:
    if isinstance(value, tuple):
        return value[layer] if layer < len(value) else 0
    return value or 0


def groups_output_is_norm_only(info: ModelInfo) -> bool:
    """True when the file has no output matrix: the embeddings double as it (tied)."""
    output = info.weights_bytes_by_group.get("output", 0)
    return output <= (info.embedding_length or 0) * 4


def facts_from_info(info: ModelInfo, swa_pattern: tuple[int, bool] | None = None) -> ModelFacts:
    """Planner facts from a real GGUF header."""
    n_layer = info.block_count or 0
    n_head = info.head_count if isinstance(info.head_count, int) else max(info.head_count or (1,))
    n_embd = info.embedding_length or 0
    key_length = info.key_length or (n_embd // n_head if n_head else 0)
    value_length = info.value_length or key_length
    head_elems = key_length + value_length
    swa_head_elems = (info.key_length_swa or key_length) + (info.value_length_swa or value_length)
    swa = _swa_layers(info, swa_pattern)
    full = swa_elems = widest = widest_swa = 0
    for layer in info.kv_layers:
        if layer in swa:
            elems = _heads(info.head_count_kv, layer) * swa_head_elems
            swa_elems += elems
            widest_swa = max(widest_swa, elems)
        else:
            elems = _heads(info.head_count_kv, layer) * head_elems
            full += elems
            widest = max(widest, elems)
    ssm = info.ssm
    d_conv, d_inner = ssm.get("conv_kernel", 0), ssm.get("inner_size", 0)
    d_state, n_group = ssm.get("state_size", 0), ssm.get("group_count", 0)
    per_layer_state = (
        max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner
    ) * 4
    tied = groups_output_is_norm_only(info)
    groups = info.weights_bytes_by_group
    layer_bytes = sum(v for k, v in groups.items() if k not in ("embeddings", "output", "other"))
    return ModelFacts(
        name=info.name or Path(info.path).name,
        architecture=info.architecture,
        weights_bytes=info.weights_bytes,
        layer_bytes=layer_bytes,
        host_bytes=0 if tied else groups.get("embeddings", 0),
        expert_bytes=groups.get("ffn_experts", 0),
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=info.vocab_size or 0,
        native_ctx=info.context_length or 4096,
        full_kv_elems_per_token=full,
        max_layer_kv_elems=widest,
        max_swa_layer_kv_elems=widest_swa,
        swa_kv_elems_per_token=swa_elems,
        swa_window=info.sliding_window or 0,
        recurrent_state_bytes=per_layer_state * len(info.recurrent_layers),
        source="header",
    )
