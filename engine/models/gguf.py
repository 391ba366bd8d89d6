"""GGUF inspection that reads only the header, metadata and tensor infos, never tensor data.

Work is bounded on hostile input: every count, length and offset is checked against limits
and against the file's size before anything is allocated, so a broken or malicious header
ends in a ``GgufFormatError`` within milliseconds instead of an exception from deep inside a
parser or a multi-gigabyte allocation. The format constants come from the official gguf
package (``gguf/constants.py``); its reader is not used because it unpacks whole vocab arrays
(about 12 s on a 240 MB model) and fails on truncated files with unrelated numpy errors.

Every value goes through the same bounded reader. What a model is (``inspect_model``) is read
from one walk of the header by :mod:`lucebox.engine.models.headerinfo`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import struct
import sys
from dataclasses import dataclass
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
TYPE_NAMES: dict[int, str] = {int(t): t.name for t in C.GGMLQuantizationType}
FILE_TYPE_NAMES: dict[int, str] = {int(t): t.name.removeprefix("MOSTLY_") for t in C.LlamaFileType}


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
