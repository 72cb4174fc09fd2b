"""Whole-shard compression (zstd, gzip): a writer that compresses on the way out, and the way back."""

from __future__ import annotations

import gzip
from typing import IO, Any

from ..errors import CorruptShardError


def compressing_writer(sink: IO[bytes], compression: str | None, level: int | None = None) -> Any:
    """A file-like writer that compresses into ``sink`` (left open when it closes), or ``None`` for no compression."""
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3 if level is None else level).stream_writer(sink, closefd=False)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=sink, mode="wb", mtime=0, compresslevel=6 if level is None else level)
    if compression is None:
        return None
    raise ValueError(f"unknown tar compression {compression!r}; use None, 'zstd' or 'gzip'")


def decompress(data, compression: str | None, name: str = "shard"):
    """The plain tar bytes of a stored shard (``data`` itself when not compressed)."""
    try:
        if compression == "zstd":
            import zstandard

            stream = zstandard.ZstdDecompressor().decompressobj()
            plain = stream.decompress(data)
            if not stream.eof:
                raise EOFError("the zstd frame ends early")
            return plain
        if compression == "gzip":
            return gzip.decompress(data)
    except Exception as exc:  # zstd and gzip raise several unrelated types
        raise CorruptShardError(
            f"{name}: cannot decompress ({compression}): {exc}; the shard is truncated or damaged, "
            "re-create or re-download it"
        ) from exc
    return data
