"""Whole-shard compression: a writer that compresses on the way out (zstd, gzip), and the way back
(zstd, gzip, xz, bzip2), the compression found from the data's first bytes, not from a file name.

zstd frames carry a content checksum (and the content size when the writer is told it), so a
damaged frame that still decompresses is an error rather than other bytes; gzip has its CRC-32,
xz its check, bzip2 its block and stream CRCs. Bytes after the last stream are an error.
"""

from __future__ import annotations

import gzip
from typing import IO, Any

from ..errors import CorruptShardError, UsageError


def compressing_writer(
    sink: IO[bytes], compression: str | None, level: int | None = None, size: int | None = None
) -> Any:
    """A file-like writer that compresses into ``sink`` (left open when it closes), or ``None`` for no compression.

    ``size``, the exact number of bytes that will be written, goes into a zstd frame's header.
    """
    if compression == "zstd":
        import zstandard

        zstd = zstandard.ZstdCompressor(level=3 if level is None else level, write_checksum=True)
        return zstd.stream_writer(sink, size=-1 if size is None else size, closefd=False)
    if compression == "gzip":
        return gzip.GzipFile(
            fileobj=sink, mode="wb", mtime=0, compresslevel=6 if level is None else level
        )
    if compression is None:
        return None
    raise UsageError(f"unknown tar compression {compression!r}; use None, 'zstd' or 'gzip'")


# what each compressed format starts with (bzip2: "BZh", the block size, then a block or the end)
_MAGIC = (
    ("gzip", (b"\x1f\x8b",)),
    ("zstd", (b"\x28\xb5\x2f\xfd",)),
    ("xz", (b"\xfd7zXZ\x00",)),
    (
        "bzip2",
        tuple(b"BZh%d%s" % (n, m) for n in range(1, 10) for m in (b"1AY&SY", b"\x17rE8P\x90")),
    ),
)
COMPRESSIONS = tuple(name for name, _ in _MAGIC)


def sniff(data) -> str | None:
    """The compression whose magic bytes ``data`` starts with, or None."""
    head = bytes(data[:10])
    for name, starts in _MAGIC:
        if head.startswith(starts):
            return name
    return None


def _tar_header(data) -> bool:
    """Whether ``data`` starts with a tar header block whose checksum matches."""
    head = bytes(data[:512])
    if len(head) < 512:
        return False
    digits = head[148:156].strip(b" \0")
    stored = (
        int(digits, 8)
        if digits and digits.isdigit() and b"8" not in digits and b"9" not in digits
        else -1
    )
    return stored == sum(head[:148]) + 256 + sum(head[156:])


def true_compression(data, named: str | None) -> str | None:
    """The compression of ``data``, a stored tar whose name says ``named``: its magic bytes decide; data
    with none is a plain tar when it starts with a tar header, else what the name says (and fails there)."""
    found = sniff(data)
    if found is not None or named is None or _tar_header(data):
        return found
    return named


def _streams(data, new: Any, padding: bool) -> bytes:
    """Every stream of ``data`` (an xz or bzip2 decompressor from ``new()``), one after the other, with
    NUL bytes between them when ``padding`` (xz), and nothing after the last."""
    parts: list[bytes] = []
    rest = bytes(data)
    while True:
        stream = new()
        parts.append(stream.decompress(rest))
        if not stream.eof:
            raise EOFError("the compressed stream ends early")
        rest = stream.unused_data.lstrip(b"\0") if padding else stream.unused_data
        if not rest:
            return b"".join(parts)
        if sniff(rest) is None:
            raise ValueError(f"{len(rest)} bytes after the compressed stream")


def _xz_decompress(data) -> bytes:
    import lzma

    return _streams(data, lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ), padding=True)


def _bzip2_decompress(data) -> bytes:
    import bz2

    return _streams(data, bz2.BZ2Decompressor, padding=False)


def _zstd_decompress(data) -> bytes:
    """Every zstd frame of ``data``, each checked against its content checksum when it has one."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    parts: list[bytes] = []
    rest = data
    while True:
        frame = decompressor.decompressobj()
        parts.append(frame.decompress(rest))
        if not frame.eof:
            raise EOFError("the zstd frame ends early")
        if not frame.unused_data:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        # cannot happen with zstd; bounds the loop regardless
        if len(frame.unused_data) >= len(rest):
            raise ValueError("a zstd frame of no bytes")
        rest = frame.unused_data


def decompress(data, compression: str | None, name: str = "shard"):
    """The plain tar bytes of a stored shard (``data`` itself when not compressed). ``compression`` is
    what the shard's name or manifest says; the data's own first bytes decide (:func:`true_compression`).

    Raises :class:`CorruptShardError` naming ``name`` when the data is truncated, damaged (a zstd
    content checksum or the gzip CRC does not match), or followed by bytes that are no frame.
    """
    compression = true_compression(data, compression)
    try:
        if compression == "zstd":
            return _zstd_decompress(data)
        if compression == "gzip":
            # checks each member's CRC-32 and length; refuses trailing garbage
            return gzip.decompress(data)
        if compression == "xz":
            return _xz_decompress(data)
        if compression == "bzip2":
            return _bzip2_decompress(data)
    except Exception as exc:  # the decompressors raise several unrelated types
        raise CorruptShardError(
            f"{name}: cannot decompress ({compression}): {exc}; the shard is truncated or damaged, "
            "re-create or re-download it"
        ) from exc
    return data
