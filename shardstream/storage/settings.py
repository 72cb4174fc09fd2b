"""A reader's storage settings as one object: how to reach remote shards, keep them, and retry."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardstreamError, UsageError
from ..sizes import parse_size
from .cache import DiskCache
from .retry import RetryPolicy


class _Default:
    """The value of a keyword that was not given (so that ``None`` can mean something)."""

    def __repr__(self) -> str:
        return "<StorageSettings' default>"


DEFAULT: Any = _Default()
_ZERO = re.compile(r"\s*0*\.?0*\s*([a-zA-Z]*)\s*")  # "0", "0MB", "0.0 GiB": nothing ahead


@dataclass(frozen=True)
class StorageSettings:
    """How a dataset reaches remote shards and keeps them; local datasets use none of it.

    Args:
        options: fsspec storage options (``endpoint_url``, ``anon``, ``profile``...).
        cache_dir: where downloaded shards are kept, shared by the workers and ranks of a
            host (default: ``shardstream-<uid>/cache`` in the system's temporary folder).
        cache_limit: bytes (or ``"50GB"``) the cache may hold; least recently used shards
            not being read are evicted (default: half the free space there).
        prefetch: bytes (or ``"1GB"``) of upcoming shards each worker downloads ahead of
            use (default: 512MB); ``0`` downloads each shard when it is first needed.
        retries: attempts after a transient error (resets, timeouts, 5xx, throttling, a
            damaged download) before giving up with an error (default: 5).
        timeout: seconds one request may take before it is retried (large downloads get
            more, at 1 MB/s); ``None`` for no limit (default: 60).
        trusted_roots: locations outside the dataset's folder that its manifest may name shards in
            by full URL (a merge across stores), each with its fsspec options:
            ``{"s3://bucket/team-a": {"endpoint_url": ...}, "/data/local-set": {}}``. A location
            holds the roots under it. A manifest naming a full-URL root none of them holds is refused
            (default: none, so a dataset reads only its own folder and the folders beside it).
    """

    options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    prefetch: int | str = "512MB"
    retries: int = 5
    timeout: float | None = 60.0
    trusted_roots: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .routed import normalize_root

        object.__setattr__(self, "options", dict(self.options or {}))
        object.__setattr__(
            self,
            "trusted_roots",
            {normalize_root(k): dict(v or {}) for k, v in (self.trusted_roots or {}).items()},
        )
        if self.prefetch_bytes < 0:
            raise UsageError(f"prefetch must be 0 or more bytes, not {self.prefetch!r}")
        self.retry  # noqa: B018 - checks retries and timeout now, not at the first download

    @classmethod
    def combine(cls, base: StorageSettings | None = None, **given: Any) -> StorageSettings:
        """``base`` (or the defaults) with the keywords that were given (not :data:`DEFAULT`) replacing its fields."""
        changes = {name: value for name, value in given.items() if value is not DEFAULT}
        return dataclasses.replace(base or cls(), **changes)

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(self.retries, self.timeout)

    @property
    def prefetch_bytes(self) -> int:
        if not isinstance(self.prefetch, str):
            return int(self.prefetch)
        zero = _ZERO.fullmatch(self.prefetch)
        try:
            # a unit all the same
            if zero is not None and "0" in self.prefetch and parse_size("1" + zero.group(1)):
                return 0
        except ShardstreamError:
            pass
        return parse_size(self.prefetch, "prefetch")

    def disk_cache(self) -> DiskCache:
        """The host's shard cache these settings name."""
        limit = (
            parse_size(self.cache_limit, "cache_limit")
            if isinstance(self.cache_limit, str)
            else self.cache_limit
        )
        cache = DiskCache(self.cache_dir, limit)
        cache.warn_if_full()  # here, once, rather than in each worker
        return cache
