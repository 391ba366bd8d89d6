"""GGUF inspection that reads only the header, metadata and tensor infos, never tensor data.

Work is bounded on hostile input: every count, length and offset is checked against limits
and against the file's size before anything is allocated, so a broken or malicious header
ends in a ``GgufFormatError`` within milliseconds instead of an exception from deep inside a
parser or a multi-gigabyte allocation. The format constants come from the official gguf
package (``gguf/constants.py``); its reader is not used because it unpacks whole vocab arrays
(about 12 s on a 240 MB model) and fails on truncated files with unrelated numpy errors.

One format, one module: every value goes through the same bounded reader, and what a model is
(``inspect_model``) is read from the same walk of the header, so they stay together.

``info_from_header`` reads every fact a plan needs from one walk of the header.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 16
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 64 << 20
"""A chat template is a few KiB and a token a few bytes; nothing legitimate is near this."""
MAX_ARRAY_ITEMS = 1 << 26
MAX_DIMS = 4
SMALL_ARRAY_ITEMS = 4096
"""Arrays up to this size are kept as values (per-layer head counts); larger are skipped."""
READ_CHUNK_BYTES = 1 << 20


def _load_constants() -> ModuleType:
    # `import gguf` pulls in numpy (~0.3 s on every check); its constants module is pure, so
    # load just that file.
    spec = importlib.util.find_spec("gguf")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "constants.py"
        file_spec = importlib.util.spec_from_file_location("_lucebox_gguf_constants", path)
        if file_spec is not None and file_spec.loader is not None:
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[file_spec.name] = module
            file_spec.loader.exec_module(module)
            return module
    import gguf.constants

    return gguf.constants


C = _load_constants()
VT = C.GGUFValueType
_SCALAR_FORMATS: dict[int, str] = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
    VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
    VT.FLOAT64: "<d",
}  # fmt: skip
_QUANT_SIZES: dict[int, tuple[int, int]] = {int(k): v for k, v in C.GGML_QUANT_SIZES.items()}
_TYPE_NAMES: dict[int, str] = {int(t): t.name for t in C.GGMLQuantizationType}
_FILE_TYPE_NAMES: dict[int, str] = {int(t): t.name.removeprefix("MOSTLY_") for t in C.LlamaFileType}


class GgufFormatError(Exception):
    """The file is not a well-formed GGUF; ``code`` is a models-check problem code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ArraySummary:
    """A metadata array too large to keep: its element type, length and where it lies."""

    item_type: int
    count: int
    offset: int
    """File offset of the first element."""
    digest: str | None = None
    """sha256 over the raw elements, for string arrays (token lists)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    """Relative to the start of the data section."""
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    """The raw header: version, metadata (large arrays summarised) and tensor infos."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    alignment: int
    bytes_read: int


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

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "raw_metadata_keys"}
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out


class Seekable(Protocol):
    """What the header parser reads from: a local file, or a Hub file read by ranges."""

    def seek(self, pos: int, whence: int = 0, /) -> int: ...

    def read(self, n: int = -1, /) -> bytes: ...


class _Reader:
    """Bounded, counting reads over a file object; never reads past ``size``."""

    def __init__(self, handle: Seekable, size: int) -> None:
        self.handle = handle
        self.size = size
        self.pos = 0
        self.buffer = b""
        self.buffer_start = 0
        self.bytes_read = 0

    def _fill(self, n: int) -> memoryview:
        if self.pos + n > self.size:
            raise GgufFormatError(
                "truncated",
                f"the header ends at byte {self.size}, but needs at least {self.pos + n} bytes",
            )
        offset = self.pos - self.buffer_start
        if offset < 0 or offset + n > len(self.buffer):
            self.handle.seek(self.pos)
            self.buffer = self.handle.read(max(n, READ_CHUNK_BYTES))
            self.bytes_read += len(self.buffer)
            self.buffer_start = self.pos
            offset = 0
            if len(self.buffer) < n:
                raise GgufFormatError("truncated", f"the file ends inside its header at {self.pos}")
        return memoryview(self.buffer)[offset : offset + n]

    def take(self, n: int) -> bytes:
        view = self._fill(n)
        self.pos += n
        return bytes(view)

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        value = struct.unpack(fmt, self._fill(size))[0]
        self.pos += size
        return value

    def u32(self) -> int:
        return int(self.scalar("<I"))

    def u64(self) -> int:
        return int(self.scalar("<Q"))

    def string(self, limit: int, what: str) -> bytes:
        length = self.u64()
        if length > limit:
            raise GgufFormatError("corrupt-header", f"{what} claims {length} bytes (limit {limit})")
        if self.pos + length > self.size:
            raise GgufFormatError(
                "truncated" if self.pos + length <= (1 << 40) else "corrupt-header",
                f"{what} of {length} bytes runs past the end of the file",
            )
        return self.take(length)

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise GgufFormatError("truncated", "an array runs past the end of the file")
        self.pos += n


def _value(reader: _Reader, value_type: int, key: str) -> Any:
    if value_type == VT.STRING:
        return reader.string(MAX_STRING_BYTES, f"string value of '{key}'").decode(
            "utf-8", errors="replace"
        )
    if value_type == VT.ARRAY:
        return _array(reader, key)
    fmt = _SCALAR_FORMATS.get(value_type)
    if fmt is None:
        raise GgufFormatError("corrupt-header", f"'{key}' has unknown value type {value_type}")
    return reader.scalar(fmt)


def _array(reader: _Reader, key: str) -> Any:
    item_type = reader.u32()
    count = reader.u64()
    if count > MAX_ARRAY_ITEMS:
        raise GgufFormatError("corrupt-header", f"array '{key}' claims {count} items")
    start = reader.pos
    if item_type == VT.STRING:
        if count <= SMALL_ARRAY_ITEMS and not key.startswith("tokenizer.ggml."):
            return tuple(_value(reader, VT.STRING, key) for _ in range(count))
        digest = _walk_strings(reader, count, key)
        return ArraySummary(item_type, count, start, digest)
    fmt = _SCALAR_FORMATS.get(item_type)
    if fmt is None:
        raise GgufFormatError("corrupt-header", f"array '{key}' has unknown item type {item_type}")
    item_bytes = struct.calcsize(fmt)
    if reader.pos + count * item_bytes > reader.size:
        raise GgufFormatError("truncated", f"array '{key}' runs past the end of the file")
    if count <= SMALL_ARRAY_ITEMS:
        raw = reader.take(count * item_bytes)
        return tuple(struct.unpack(f"<{count}{fmt[1]}", raw))
    reader.skip(count * item_bytes)
    return ArraySummary(item_type, count, start)


_U64 = struct.Struct("<Q").unpack_from


def _walk_strings(reader: _Reader, count: int, key: str) -> str:
    """Step over ``count`` strings, hashing their raw bytes; the hot loop of a vocab."""
    digest = hashlib.sha256()
    remaining = count
    while remaining:
        reader._fill(8)
        buf = reader.buffer
        off = seg_start = reader.pos - reader.buffer_start
        limit = len(buf)
        while remaining and off + 8 <= limit:
            length = _U64(buf, off)[0]
            if length > MAX_STRING_BYTES:
                raise GgufFormatError(
                    "corrupt-header", f"a string in '{key}' claims {length} bytes"
                )
            if off + 8 + length > limit:
                break
            off += 8 + length
            remaining -= 1
        digest.update(memoryview(buf)[seg_start:off])
        reader.pos = reader.buffer_start + off
        if remaining and off + 8 <= limit:
            # The next string crosses the end of the buffer: read it on its own.
            length_bytes = reader.take(8)
            length = _U64(length_bytes)[0]
            if length > MAX_STRING_BYTES:
                raise GgufFormatError(
                    "corrupt-header", f"a string in '{key}' claims {length} bytes"
                )
            digest.update(length_bytes)
            digest.update(reader.take(length))
            remaining -= 1
    return digest.hexdigest()


def tensor_bytes(shape: tuple[int, ...], ggml_type: int, name: str) -> int:
    sizes = _QUANT_SIZES.get(ggml_type)
    if sizes is None:
        raise GgufFormatError("corrupt-header", f"tensor '{name}' has unknown type {ggml_type}")
    block, type_size = sizes
    elements = 1
    for dim in shape:
        elements *= dim
    if shape and shape[0] % block:
        raise GgufFormatError(
            "corrupt-header", f"tensor '{name}' row of {shape[0]} is not a multiple of {block}"
        )
    return elements // block * type_size


def read_header(path: Path) -> GgufHeader:
    """Parse the header of ``path``; raises ``GgufFormatError`` or ``OSError``."""
    with path.open("rb") as handle:
        return parse_header(handle, path.stat().st_size)


def parse_header(handle: Seekable, size: int) -> GgufHeader:
    """Parse the header of a GGUF of ``size`` bytes from a seekable ``handle`` (a local file, or
    a remote one read by ranges); raises ``GgufFormatError`` or ``OSError``."""
    reader = _Reader(handle, size)
    if size < 4 or reader.take(4) != GGUF_MAGIC:
        raise GgufFormatError("not-gguf", "the file does not start with the GGUF magic")
    if size < 24:
        raise GgufFormatError("truncated", f"only {size} bytes: the GGUF header is cut off")
    version = reader.u32()
    if version not in SUPPORTED_VERSIONS:
        raise GgufFormatError("corrupt-header", f"GGUF version {version} is not supported")
    n_tensors = reader.u64()
    n_kv = reader.u64()
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise GgufFormatError(
            "corrupt-header", f"absurd counts: {n_tensors} tensors, {n_kv} metadata keys"
        )
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = reader.string(MAX_KEY_BYTES, "a metadata key").decode("utf-8", "replace")
        metadata[key] = _value(reader, reader.u32(), key)
    tensors = []
    for _ in range(n_tensors):
        name = reader.string(MAX_KEY_BYTES, "a tensor name").decode("utf-8", "replace")
        n_dims = reader.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise GgufFormatError("corrupt-header", f"tensor '{name}' has {n_dims} dimensions")
        shape = tuple(reader.u64() for _ in range(n_dims))
        if any(dim == 0 or dim > (1 << 40) for dim in shape):
            raise GgufFormatError("corrupt-header", f"tensor '{name}' has shape {shape}")
        ggml_type = reader.u32()
        offset = reader.u64()
        tensors.append(
            TensorInfo(name, shape, ggml_type, offset, tensor_bytes(shape, ggml_type, name))
        )
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GgufFormatError("corrupt-header", f"general.alignment {alignment!r} is invalid")
    data_offset = -(-reader.pos // alignment) * alignment
    for tensor in tensors:
        if tensor.offset % alignment:
            raise GgufFormatError(
                "corrupt-header", f"tensor '{tensor.name}' is not aligned to {alignment}"
            )
    return GgufHeader(version, metadata, tuple(tensors), data_offset, alignment, reader.bytes_read)


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


def info_from_header(header: GgufHeader, path: str, actual_size_bytes: int) -> ModelInfo:
    """What a parsed header says about the model in ``path`` (a local path or a Hub URL)."""
    meta = header.metadata
    arch = _str(meta, "general.architecture") or ""
    if not arch:
        raise GgufFormatError("corrupt-header", "general.architecture is missing")
    groups: dict[str, int] = {}
    by_type: dict[int, int] = {}
    end = 0
    for tensor in header.tensors:
        group = tensor_group(tensor.name)
        groups[group] = groups.get(group, 0) + tensor.n_bytes
        by_type[tensor.ggml_type] = by_type.get(tensor.ggml_type, 0) + tensor.n_bytes
        end = max(end, tensor.offset + tensor.n_bytes)
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_size = (
        tokens.count
        if isinstance(tokens, ArraySummary)
        else (len(tokens) if isinstance(tokens, tuple) else None)
    )
    template = _str(meta, "tokenizer.chat_template")
    file_type = _int(meta, "general.file_type")
    block_count = _int(meta, f"{arch}.block_count")
    targets = meta.get(f"{arch}.target_layers")
    mtp_tensor = f"blk.{(block_count or 0) - 1}.nextn.eh_proj.weight"
    quant = max(by_type, key=lambda t: by_type[t]) if by_type else None
    names = {t.name for t in header.tensors}
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
    has_mtp = mtp_tensor in names
    has_markov = "markov_w1.weight" in names
    draft_kind = None
    if arch == "dflash":
        draft_kind = "draft-dspark" if has_markov else "draft-dflash"
    elif has_mtp:
        draft_kind = "draft-mtp"
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
        file_type_name=_FILE_TYPE_NAMES.get(file_type) if file_type is not None else None,
        quantization=_TYPE_NAMES.get(quant) if quant is not None else None,
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
        vocab_size=vocab_size,
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
        ssm={
            key: value
            for key in ("conv_kernel", "inner_size", "state_size", "group_count")
            if (value := _int(meta, f"{arch}.ssm.{key}")) is not None
        },
        draft_kind=draft_kind,
        header_bytes_read=header.bytes_read,
        version=header.version,
        raw_metadata_keys=tuple(meta),
    )


def token_texts_digest(path: Path, start: int, stop: int) -> str | None:
    """sha256 of token strings ``start..stop-1`` (the engine compares these for drafts)."""
    header = read_header(path)
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, ArraySummary) or tokens.item_type != VT.STRING:
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        reader = _Reader(handle, path.stat().st_size)
        reader.pos = tokens.offset
        for index in range(min(stop, tokens.count)):
            text = reader.string(MAX_STRING_BYTES, "a token")
            if index >= start:
                digest.update(len(text).to_bytes(8, "little") + text)
    return digest.hexdigest()
