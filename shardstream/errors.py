"""Errors a user can act on. Each message names the file, shard or sample and the fix."""

from __future__ import annotations

from typing import Any


class ShardstreamError(Exception):
    """Base class: a problem with the user's input, data or storage (not a bug)."""


class SourceError(ShardstreamError):
    """The pack source is missing, empty, unreadable or of an unsupported kind."""


class DatasetExistsError(ShardstreamError):
    """The destination already holds a dataset and overwriting was not asked for."""


class ManifestError(ShardstreamError):
    """The manifest is missing, unreadable or inconsistent."""


class CorruptShardError(ShardstreamError):
    """A shard does not parse, is truncated, or does not match its manifest entry."""


class CorruptSampleError(CorruptShardError):
    """One value of one sample differs from the checksum its pack recorded: the shard was damaged after
    packing. ``shard`` (its URL), ``key``, ``position`` (in the shard) and ``field`` say which; under
    ``on_error="skip"`` that sample alone is skipped."""

    def __init__(
        self,
        message: str,
        *,
        shard: str | None = None,
        key: Any = None,
        position: int | None = None,
        field: str | None = None,
    ):
        super().__init__(
            message
        )  # (pickled as its message and attributes: through a worker's pipe)
        self.shard, self.key, self.position, self.field = shard, key, position, field


class StorageError(ShardstreamError):
    """Reading or writing a URL failed in a way that retrying will not fix."""


class EncodeError(ShardstreamError):
    """A sample field cannot be encoded into a shard."""


class UsageError(ShardstreamError, ValueError):
    """An error in the caller's code or settings, not in the data: never skipped by ``on_error="skip"``.
    Every bad argument or setting raises it; it is a ``ValueError`` too."""


class TransformError(UsageError):
    """The user's transform raised: an error in code, never skipped by ``on_error="skip"``."""


def sample_name(offset: int, key: Any = None) -> str:
    """A shard's sample named for a person: by its key where it has one, and by its position in the shard
    (never a position in an epoch's order): ``sample 'cat/001' (position 4 in the shard)``."""
    return (
        f"sample {key!r} (position {offset} in the shard)"
        if key is not None and key != ""
        else f"sample at position {offset} in the shard"
    )
