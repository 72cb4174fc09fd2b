"""``PackOptions``: everything a pack is told besides its source and destination, as one frozen value.

:func:`shardstream.pack` takes them as keywords (one per setting, as the command's options) and
hands this object on; what a pack does is then chosen by what it is asked (:attr:`PackOptions.request`)
and by the kind of source and the shard format (the tables in :mod:`.api` and :mod:`.driver`), never by
which keywords were given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardstreamError, UsageError
from .engine import Execution, default_workers
from .rules import DEFAULT_SHARD_SIZE


@dataclass(frozen=True)
class PackOptions:
    """The settings of one pack (see :func:`shardstream.pack` for each)."""

    format: str | None = None
    shard_size: int | str = DEFAULT_SHARD_SIZE
    samples_per_shard: int | None = None
    compression: str | None = None
    workers: int | None = None
    layout: str = "auto"
    overwrite: bool = False
    append: bool = False
    storage_options: dict[str, Any] | None = None
    progress: bool = True
    fsync: bool = True
    shuffle: bool = True
    seed: int = 0
    split_by: str | None = None
    fn: Callable[[Any], Any] | None = None
    fields: Sequence[str] | None = None
    field_name: str | None = None
    decode_value: Callable[[bytes, bytes], Any] | None = None
    engine: str = "local"
    ray_address: str | None = None
    source_options: dict[str, Any] | None = None
    index: bool = True
    image_sizes: bool = True
    token_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.append and self.overwrite:
            raise UsageError(
                "append adds to the dataset and overwrite replaces it: pass one of them, not both"
            )
        if self.append and (
            self.split_by is not None or self.format == "tokens" or self.token_options
        ):
            raise UsageError(
                "append adds to datasets of tar or Arrow shards; split packs and token datasets are "
                "packed again instead"
            )

    @property
    def request(self) -> str:
        """What the pack is asked to do: pack ``fn``'s samples of a list of ``"inputs"``, ``"split"`` a
        folder by class, tokenize ``"text"``, or pack a ``"source"`` (folders, tables, sample files)."""
        if self.fn is not None:
            return "inputs"
        if self.split_by is not None:
            return "split"
        if self.format == "tokens" or self.token_options:
            if self.format != "tokens":
                raise ShardstreamError(
                    f"{', '.join(sorted(self.token_options))} apply to format='tokens' only"
                )
            return "text"
        return "source"

    def execution(self) -> Execution:
        """How the shard jobs run: the workers checked (at least 1; default: every usable core)."""
        workers = self.workers
        if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
            raise ShardstreamError(f"workers must be at least 1, not {workers!r}")
        return Execution(
            default_workers() if workers is None else int(workers),
            self.progress,
            self.engine,
            self.ray_address,
        )

    def common(self) -> dict[str, Any]:
        """The settings every kind of pack takes, as keywords."""
        return {
            "shard_size": self.shard_size,
            "samples_per_shard": self.samples_per_shard,
            "compression": self.compression,
            "workers": self.workers,
            "overwrite": self.overwrite,
            "append": self.append,
            "storage_options": self.storage_options,
            "progress": self.progress,
            "fsync": self.fsync,
            "engine": self.engine,
            "ray_address": self.ray_address,
        }

    def source_settings(self) -> dict[str, Any]:
        """What the sources of samples take (HDF5 ``fields``, LMDB ``field_name`` and ``decode_value``)."""
        given = (
            ("fields", self.fields),
            ("field_name", self.field_name),
            ("decode_value", self.decode_value),
        )
        return {k: v for k, v in given if v is not None}

    def replace(self, **changes: Any) -> PackOptions:
        return dataclasses.replace(self, **changes)


__all__ = ["PackOptions"]
