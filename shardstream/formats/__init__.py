"""Shard formats: WebDataset-style tar (optionally zstd, gzip, xz or bzip2-compressed), Arrow IPC,
Parquet in place.

This module maps a manifest's ``shard_format`` to the code that reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import tar
from .compression import decompress

TAR_COMPRESSION = {
    "tar": None,
    "tar.zst": "zstd",
    "tar.gz": "gzip",
    "tar.xz": "xz",
    "tar.bz2": "bzip2",
}
TAR_FORMAT = {compression: fmt for fmt, compression in TAR_COMPRESSION.items()}


def shard_format_of(name: str) -> str | None:
    """The shard format a file name implies (``x.tar.zst`` -> ``tar.zst``), or None."""
    lower = name.lower()
    for suffix, fmt in (
        (".tar.zst", "tar.zst"),
        (".tar.gz", "tar.gz"),
        (".tgz", "tar.gz"),
        (".tar.xz", "tar.xz"),
        (".txz", "tar.xz"),
        (".tar.bz2", "tar.bz2"),
        (".tbz2", "tar.bz2"),
        (".tbz", "tar.bz2"),
        (".tar", "tar"),
        (".arrow", "arrow"),
        (".feather", "arrow"),
        (".parquet", "parquet"),
    ):
        if lower.endswith(suffix):
            return fmt
    return None


def iter_shard_samples(shard_format: str, buf, name: str = "shard") -> Iterator[dict[str, Any]]:
    """Every sample of a stored shard as a dict: ``__key__`` (tar) plus one entry per field.

    Tar fields are ``bytes``; Arrow rows are Python values.
    """
    if shard_format == "arrow":
        from . import arrow

        yield from arrow.iter_rows(buf, name)
        return
    if shard_format == "parquet":
        from . import parquet

        yield from parquet.read_table(buf, name).to_pylist()
        return
    found = tar.read_samples(decompress(buf, TAR_COMPRESSION[shard_format], name), name)
    view = memoryview(found.data)
    for key, fields in zip(found.keys, found.fields):
        sample: dict[str, Any] = {"__key__": key}
        for ext, (offset, size) in fields.items():
            sample[ext] = bytes(view[offset : offset + size])
        yield sample


def count_samples(
    shard_format: str, buf, name: str = "shard", unkeyed: list[str] | None = None
) -> int:
    """Parse the whole shard (every header, every record batch) and count its samples."""
    if shard_format == "arrow":
        from . import arrow

        return arrow.read_table(buf, name).num_rows
    if shard_format == "parquet":
        from . import parquet

        return parquet.read_table(buf, name).num_rows
    found = tar.read_samples(decompress(buf, TAR_COMPRESSION[shard_format], name), name)
    if unkeyed is not None:
        unkeyed += found.unkeyed
    return len(found.keys)
