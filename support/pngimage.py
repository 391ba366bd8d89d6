"""A small PNG written without an imaging library: the image tests and benches send."""

from __future__ import annotations

import struct
import zlib


def png(width: int = 16, height: int = 16) -> bytes:
    """A small RGB gradient as a PNG file."""
    rows = b"".join(
        b"\0" + b"".join(bytes((x * 16 % 256, y * 16 % 256, 128)) for x in range(width))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
