"""An encoded image's width and height from its header alone: JPEG (the frame header), PNG (IHDR),
GIF, BMP and WebP (VP8, VP8L, VP8X), without decoding a pixel; any other format: ``None``.

Every byte is untrusted: positions only move forward, every read is bounds-checked, and a header that
does not parse gives ``None`` (the caller may then ask Pillow, whose lazy open also reads only headers).
"""

from __future__ import annotations

import struct

# JPEG start-of-frame markers (C4, C8 and CC are other segments)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xD8)))  # markers without a length
_UNPACK_U16 = struct.Struct(">H").unpack_from
_UNPACK_2U16 = struct.Struct(">HH").unpack_from


def _jpeg(data: bytes | memoryview) -> tuple[int, int] | None:
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill bytes
            at += 1
            continue
        if marker in _NO_LENGTH:
            at += 2
            continue
        (length,) = _UNPACK_U16(data, at + 2)
        if length < 2:
            return None
        if marker in _SOF:
            if at + 9 > end:
                return None
            height, width = _UNPACK_2U16(data, at + 5)
            return (width, height) if width and height else None
        if marker == 0xDA:  # scan data before any frame header
            return None
        at += 2 + length
    return None


def _webp(data: bytes | memoryview) -> tuple[int, int] | None:
    kind = bytes(data[12:16])
    if kind == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    if kind == b"VP8L" and len(data) >= 25:
        (bits,) = struct.unpack_from("<I", data, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(bytes(data[24:27]), "little") + 1
        h = int.from_bytes(bytes(data[27:30]), "little") + 1
        return w, h
    return None


def image_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(width, height) of an encoded image from its header, or ``None`` where it cannot tell."""
    head = bytes(data[:32])
    if head[:2] == b"\xff\xd8":
        return _jpeg(data)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24 and head[12:16] == b"IHDR":
        return struct.unpack_from(">II", head, 16)
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack_from("<HH", head, 6)
    if head[:2] == b"BM" and len(head) >= 26:
        width, height = struct.unpack_from("<ii", head, 18)
        return width, abs(height)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(data)
    return None


__all__ = ["image_size"]
