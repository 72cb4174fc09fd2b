"""Whole-shard compression (zstd, gzip): a writer that compresses on the way out, and the way back.

zstd frames carry a content checksum (and the content size when the writer is told it), so a
damaged frame that still decompresses is an error rather than other bytes; gzip has its CRC-32.
"""

from __future__ import annotations

import gzip
from typing import IO, Any

from ..errors import CorruptShardError


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
    raise ValueError(f"unknown tar compression {compression!r}; use None, 'zstd' or 'gzip'")


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
    """The plain tar bytes of a stored shard (``data`` itself when not compressed).

    Raises :class:`CorruptShardError` naming ``name`` when the data is truncated, damaged (a zstd
    content checksum or the gzip CRC does not match), or followed by bytes that are no frame.
    """
    try:
        if compression == "zstd":
            return _zstd_decompress(data)
        if compression == "gzip":
            # checks each member's CRC-32 and length; refuses trailing garbage
            return gzip.decompress(data)
    except Exception as exc:  # zstd and gzip raise several unrelated types
        raise CorruptShardError(
            f"{name}: cannot decompress ({compression}): {exc}; the shard is truncated or damaged, "
            "re-create or re-download it"
        ) from exc
    return data
