"""What a model is, read from its GGUF header: the facts a plan needs, from one walk of it.

:mod:`lucebox.engine.models.gguf` reads the format (bounded against hostile input); this module
turns its metadata and tensor infos into a :class:`ModelInfo`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lucebox.engine.models.gguf import (
    FILE_TYPE_NAMES,
    TYPE_NAMES,
    ArraySummary,
    GgufFormatError,
    GgufHeader,
    read_header,
)


@dataclass(frozen=True)
class ModelInfo:
    """What lucebox knows about a model file from its header alone."""

    path: str
    architecture: str
    name: str | None
    parameter_count: int
    """Weights counted from the tensor shapes: bits per weight = 8 x weight bytes / this."""
    basename: str | None
    finetune: str | None
    size_label: str | None
    file_type: int | None
    file_type_name: str | None
    """"Q4_K_M", "F16", ..."""
    quantization: str | None
    """The tensor type holding most of the weight bytes."""
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | tuple[int, ...] | None
    head_count_kv: int | tuple[int, ...] | None
    key_length: int | None
    value_length: int | None
    key_length_swa: int | None
    value_length_swa: int | None
    """Head sizes of the sliding-window layers where they differ (Gemma 4: 256 beside 512)."""
    sliding_window: int | None
    swa_layers: tuple[int, ...] | None
    """Layers that use the sliding window, when the file says; None when it does not."""
    vocab_size: int | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    tokenizer_fingerprint: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool | None
    add_eos_token: bool | None
    has_chat_template: bool
    chat_template_bytes: int
    weights_bytes: int
    weights_bytes_by_group: dict[str, int]
    tensor_count: int
    data_offset: int
    expected_size_bytes: int
    """Data offset + the end of the last tensor: the smallest complete file."""
    actual_size_bytes: int
    split_count: int | None
    split_no: int | None
    target_layers: tuple[int, ...] | None
    """Target layers a DFlash/EAGLE-style draft reads hidden states from."""
    has_mtp_layers: bool
    """The engine's own MTP test: ``blk.<block_count-1>.nextn.eh_proj.weight`` is present."""
    nextn_predict_layers: int | None
    """``<arch>.nextn_predict_layers``: MTP blocks counted in ``block_count`` (a qwen35 head is
    the last block; every block of a ``gemma4-assistant`` draft)."""
    has_nextn_tensors: bool
    """Any ``nextn.*`` tensor: MTP weights present, whatever the key says."""
    embedding_length_out: int | None
    """The target hidden size a ``gemma4-assistant`` draft reads (``embedding_length_out``)."""
    dflash_block_size: int | None
    """A DFlash draft's trained block: at most block_size - 1 draft tokens per step."""
    mask_token_id: int | None
    """The DFlash mask token (``tokenizer.ggml.mask_token_id``)."""
    has_markov_head: bool
    """A ``markov_w1`` tensor: a DFlash-architecture file that is a DSpark draft."""
    kv_layers: tuple[int, ...]
    """Layers with attention K/V tensors: the ones that keep a KV cache."""
    recurrent_layers: tuple[int, ...]
    """Layers with recurrent (SSM / linear attention) state instead."""
    ssm: dict[str, int]
    """conv_kernel, inner_size, state_size, group_count when the model has recurrent layers."""
    draft_kind: str | None
    """The speculative type the engine detects for this file used as a draft (contract 4.3)."""
    header_bytes_read: int
    version: int
    raw_metadata_keys: tuple[str, ...] = field(default=(), repr=False)
    sampling: dict[str, float] = field(default_factory=dict)
    """The generation defaults the file carries (``general.sampling.*``), by request field
    name: ``temperature``, ``top_p``, ``top_k``, ``min_p``."""

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "raw_metadata_keys"}
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out


_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def tensor_group(name: str) -> str:
    """Coarse weight groups the planner sizes separately."""
    match = _LAYER.match(name)
    if match is None:
        if name.startswith("token_embd"):
            return "embeddings"
        if name.startswith(("output.", "output_norm")):
            return "output"
        return "other"
    part = match.group(2)
    if "_exps" in part or "_shexp" in part:
        return "ffn_experts"
    if part.startswith(("attn", "self_attn")):
        return "attention"
    if part.startswith("ffn"):
        return "ffn"
    if part.startswith(("ssm", "time_mix", "recurrent")):
        return "recurrent"
    if part.startswith("nextn"):
        return "mtp"
    return "layer_other"


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _first_int(meta: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        if (value := _int(meta, key)) is not None:
            return value
    return None


SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
}
"""The header keys llama-server reads as a model's generation defaults, by request field."""


def _sampling(meta: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, name in SAMPLING_KEYS.items():
        value = meta.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[name] = float(value)
    return found


def _str(meta: dict[str, Any], key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) else None


def _per_layer(meta: dict[str, Any], key: str) -> int | tuple[int, ...] | None:
    value = meta.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return value
    return None


def _swa_layers(meta: dict[str, Any], arch: str, block_count: int | None) -> tuple[int, ...] | None:
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, tuple):
        return tuple(i for i, is_swa in enumerate(pattern) if is_swa)
    if isinstance(pattern, int) and block_count is not None and pattern > 0:
        return tuple(i for i in range(block_count) if i % pattern < pattern - 1)
    return None


def inspect_model(path: Path) -> ModelInfo:
    """Read ``path``'s header into a ``ModelInfo``; raises ``GgufFormatError`` or ``OSError``."""
    return info_from_header(read_header(path), str(path), path.stat().st_size)


def _tensor_bytes(header: GgufHeader) -> tuple[dict[str, int], dict[int, int], int]:
    """The tensors' bytes by group and by ggml type, and where the last one ends."""
    groups: dict[str, int] = {}
    by_type: dict[int, int] = {}
    end = 0
    for tensor in header.tensors:
        group = tensor_group(tensor.name)
        groups[group] = groups.get(group, 0) + tensor.n_bytes
        by_type[tensor.ggml_type] = by_type.get(tensor.ggml_type, 0) + tensor.n_bytes
        end = max(end, tensor.offset + tensor.n_bytes)
    return groups, by_type, end


def _cache_layers(
    meta: dict[str, Any], arch: str, names: set[str], block_count: int | None
) -> tuple[set[int], set[int]]:
    """The layers that keep a KV cache and the recurrent (SSM, linear-attention) layers."""
    kv_layers: set[int] = set()
    recurrent_layers: set[int] = set()
    for name in names:
        match = _LAYER.match(name)
        if match is None:
            continue
        part = match.group(2)
        if part.startswith(("attn_k.", "attn_qkv.", "attn_kv_a_mqa.", "attn_k_b.")):
            kv_layers.add(int(match.group(1)))
        elif part.startswith(("ssm_", "time_mix_")):
            recurrent_layers.add(int(match.group(1)))
    # Linear-attention layers name their fused projection attn_qkv too, but keep no KV cache.
    kv_layers -= recurrent_layers
    # The last shared_kv_layers layers (Gemma 4 E-size) reuse earlier layers' cache, even
    # where the file still carries their K projections.
    shared = _int(meta, f"{arch}.attention.shared_kv_layers") or 0
    if shared and block_count:
        kv_layers = {layer for layer in kv_layers if layer < block_count - shared}
    return kv_layers, recurrent_layers


def _draft_kind(arch: str, *, has_mtp: bool, has_markov: bool) -> str | None:
    """Which drafter the file is: a DFlash or DSpark draft, an MTP head, or none."""
    if arch == "dflash":
        return "draft-dspark" if has_markov else "draft-dflash"
    return "draft-mtp" if has_mtp else None


def _vocab_size(tokens: Any) -> int | None:
    """How many tokens the vocabulary holds (a summarised or a listed token array)."""
    if isinstance(tokens, ArraySummary):
        return tokens.count
    return len(tokens) if isinstance(tokens, tuple) else None


def _ssm(meta: dict[str, Any], arch: str) -> dict[str, int]:
    """The state-space layers' shape keys the header has."""
    return {
        key: value
        for key in ("conv_kernel", "inner_size", "state_size", "group_count")
        if (value := _int(meta, f"{arch}.ssm.{key}")) is not None
    }


def info_from_header(header: GgufHeader, path: str, actual_size_bytes: int) -> ModelInfo:
    """What a parsed header says about the model in ``path`` (a local path or a Hub URL)."""
    meta = header.metadata
    arch = _str(meta, "general.architecture") or ""
    if not arch:
        raise GgufFormatError("corrupt-header", "general.architecture is missing")
    groups, by_type, end = _tensor_bytes(header)
    file_type = _int(meta, "general.file_type")
    block_count = _int(meta, f"{arch}.block_count")
    targets = meta.get(f"{arch}.target_layers")
    quant = max(by_type, key=lambda t: by_type[t]) if by_type else None
    names = {t.name for t in header.tensors}
    kv_layers, recurrent_layers = _cache_layers(meta, arch, names, block_count)
    has_mtp = f"blk.{(block_count or 0) - 1}.nextn.eh_proj.weight" in names
    has_markov = "markov_w1.weight" in names
    tokens = meta.get("tokenizer.ggml.tokens")
    template = _str(meta, "tokenizer.chat_template")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_eos = meta.get("tokenizer.ggml.add_eos_token")
    return ModelInfo(
        path=path,
        architecture=arch,
        name=_str(meta, "general.name"),
        parameter_count=sum(math.prod(t.shape) for t in header.tensors),
        basename=_str(meta, "general.basename"),
        finetune=_str(meta, "general.finetune"),
        size_label=_str(meta, "general.size_label"),
        file_type=file_type,
        file_type_name=FILE_TYPE_NAMES.get(file_type) if file_type is not None else None,
        quantization=TYPE_NAMES.get(quant) if quant is not None else None,
        context_length=_int(meta, f"{arch}.context_length"),
        block_count=block_count,
        embedding_length=_int(meta, f"{arch}.embedding_length"),
        head_count=_per_layer(meta, f"{arch}.attention.head_count"),
        head_count_kv=_per_layer(meta, f"{arch}.attention.head_count_kv"),
        key_length=_int(meta, f"{arch}.attention.key_length"),
        value_length=_int(meta, f"{arch}.attention.value_length"),
        key_length_swa=_int(meta, f"{arch}.attention.key_length_swa"),
        value_length_swa=_int(meta, f"{arch}.attention.value_length_swa"),
        sliding_window=_int(meta, f"{arch}.attention.sliding_window"),
        swa_layers=_swa_layers(meta, arch, block_count),
        vocab_size=_vocab_size(tokens),
        tokenizer_model=_str(meta, "tokenizer.ggml.model"),
        tokenizer_pre=_str(meta, "tokenizer.ggml.pre"),
        tokenizer_fingerprint=tokens.digest if isinstance(tokens, ArraySummary) else None,
        bos_token_id=_int(meta, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_int(meta, "tokenizer.ggml.eos_token_id"),
        add_bos_token=add_bos if isinstance(add_bos, bool) else None,
        add_eos_token=add_eos if isinstance(add_eos, bool) else None,
        has_chat_template=bool(template),
        chat_template_bytes=len(template.encode()) if template else 0,
        weights_bytes=sum(groups.values()),
        weights_bytes_by_group=groups,
        tensor_count=len(header.tensors),
        data_offset=header.data_offset,
        expected_size_bytes=header.data_offset + end,
        actual_size_bytes=actual_size_bytes,
        split_count=_int(meta, "split.count"),
        split_no=_int(meta, "split.no"),
        target_layers=tuple(targets) if isinstance(targets, tuple) else None,
        has_mtp_layers=has_mtp,
        nextn_predict_layers=_int(meta, f"{arch}.nextn_predict_layers"),
        has_nextn_tensors=any(".nextn." in name or name.startswith("nextn.") for name in names),
        embedding_length_out=_int(meta, f"{arch}.embedding_length_out"),
        # Upstream DFlash keys first, then the Lucebox engine's (<arch>.dflash.*).
        dflash_block_size=_first_int(meta, f"{arch}.block_size", f"{arch}.dflash.block_size"),
        mask_token_id=_first_int(
            meta, "tokenizer.ggml.mask_token_id", f"{arch}.dflash.mask_token_id"
        ),
        has_markov_head=has_markov,
        kv_layers=tuple(sorted(kv_layers)),
        recurrent_layers=tuple(sorted(recurrent_layers)),
        ssm=_ssm(meta, arch),
        draft_kind=_draft_kind(arch, has_mtp=has_mtp, has_markov=has_markov),
        header_bytes_read=header.bytes_read,
        version=header.version,
        raw_metadata_keys=tuple(meta),
        sampling=_sampling(meta),
    )
