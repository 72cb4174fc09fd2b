"""The rules every packer shares: shard formats and compression, shard limits, when a shard is full."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ShardstreamError
from ..formats import tar as tar_format
from ..manifest import Manifest
from ..sizes import format_size, parse_size

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = "256MB"


@dataclass(frozen=True)
class ShardSpec:
    """What the shards of a pack are: their format and compression (:func:`resolve_format`), the limits
    that cut them (:func:`check_shard_limits`), and whether tar shards get sample indexes (``None``: the
    default for the destination)."""

    shard_format: str
    compression: str | None
    limit: int
    per_shard: int | None
    index: bool | None = None
    image_sizes: bool = True  # record each image's width and height (manifest.image_sizes)


def resolve_format(format: str, compression: str | None) -> tuple[str, str | None]:
    """(shard format, compression) from the user's ``format`` and ``compression``.

    ``compression=None`` means the format's default: none for tar, zstd buffers for Arrow.
    """
    if format not in ("tar", "arrow"):
        raise ShardstreamError(f"unknown format {format!r}; use 'tar' or 'arrow'")
    comp = None if compression in (None, "none") else compression
    if format == "tar":
        if comp not in (None, "zstd", "gzip"):
            raise ShardstreamError(
                f"tar shards take compression 'zstd', 'gzip' or 'none', not {compression!r}"
            )
        return {None: "tar", "zstd": "tar.zst", "gzip": "tar.gz"}[comp], comp
    if compression is None:
        comp = "zstd"
    if comp not in (None, "zstd", "lz4"):
        raise ShardstreamError(
            f"arrow shards take compression 'zstd', 'lz4' or 'none', not {compression!r}"
        )
    return "arrow", comp


def check_shard_limits(
    shard_size: int | str | None, samples_per_shard: int | None
) -> tuple[int, int | None]:
    """Validated (bytes, samples) limits of one shard."""
    size = parse_size(shard_size if shard_size is not None else DEFAULT_SHARD_SIZE)
    if samples_per_shard is not None and (
        isinstance(samples_per_shard, bool) or int(samples_per_shard) <= 0
    ):
        raise ShardstreamError(
            f"samples per shard must be a positive integer, not {samples_per_shard!r}"
        )
    return size, None if samples_per_shard is None else int(samples_per_shard)


def shard_is_full(
    shard_bytes: int, shard_samples: int, next_bytes: int, limit: int, per_shard: int | None
) -> bool:
    """The one rule for starting a new shard: the next sample would not fit (a shard is never empty)."""
    if shard_samples == 0:
        return False
    if per_shard is not None and shard_samples >= per_shard:
        return True
    return shard_bytes + next_bytes + len(tar_format.END_OF_ARCHIVE) > limit


def warn_small_shards(manifest: Manifest, limit: int) -> bool:
    """Warn (once, at the end of a pack) when most shards hold one sample because ``limit`` is smaller
    than a sample: a pack of one file per sample, slow to read. Returns whether it warned."""
    counts = manifest.stored_counts
    single = sum(1 for n in counts if n == 1)
    if len(counts) < 2 or single * 2 < len(counts):
        return False
    typical = sum(manifest.nbytes) // max(sum(counts), 1)
    if typical <= limit // 2:
        return False  # few large samples, not a small limit
    log.warning(
        "the shard size %s is smaller than a typical sample (about %s): %d of %d shards hold one sample; "
        "give a shard size of 100MB to 1GB (--shard-size / shard_size=, default %s)",
        format_size(limit),
        format_size(typical),
        single,
        len(counts),
        DEFAULT_SHARD_SIZE,
    )
    return True
