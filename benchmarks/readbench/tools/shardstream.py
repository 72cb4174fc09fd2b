"""shardstream: its own ``pack`` command writes the data, ``ShardDataset`` reads it.

Conversion: ``shardstream pack --shard-size 64MB`` (tar shards; webdataset reads the same tars), run
with the console script of this interpreter's environment (the ``PYTHONPATH`` snapshot, if one is set).
Shuffle: shardstream permutes shards and shuffles within its default window (about 64 shards; over remote
shards at most 1 GiB of them). In pillow mode
it uses ``decode="torch"`` in a process where ``import simplejpeg`` fails, so it takes its Pillow path;
in fast mode simplejpeg, its default decoder when installed.

Remote: ``ShardDataset("s3://BUCKET/shardstream", storage_options={"endpoint_url": ...},
cache_dir=<scratch>)`` with its default prefetch, retries and timeout; then a second epoch in the same
process from the now warm local cache, reported apart (not in the table's rates).

Only shardstream's top-level names are used, so the benchmark reads any source tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pack import shardstream_command

from ..config import BATCH_SIZE, SHARD_SIZE, WORKERS
from .base import RemoteSource

DATA = "shardstream"  # the conversion it reads
SHUFFLE = "shard permutation + index shuffle in the default window (~64 shards, <= 1 GiB remote)"
# its rows: the defaults, and with 2 worker processes or 2 reader threads (non-default rows)
VARIANTS = {"shardstream": "loader", "ss-2proc": "processes", "ss-2threads": "threads"}


def pack_argv(source: Path, out: Path) -> list[str]:
    """The ``shardstream pack`` command that converts ``source`` (an image folder or a Parquet file) into
    ``out``: default settings but the shard size all tools share (tar shards and their sample indexes)."""
    return [
        *shardstream_command(),
        "pack",
        str(source),
        str(out),
        "--shard-size",
        SHARD_SIZE,
        "--overwrite",
        "-q",
    ]


def loader(data: Path, mode: str, remote: RemoteSource | None = None, **loader_args: Any) -> Any:
    """Default settings: ``ShardDataset(url, decode=...)`` and ``.loader(batch_size=64)``, nothing else (its
    default shuffle, seed, worker count and worker kind); ``loader_args`` for the non-default rows."""
    from shardstream import ShardDataset

    decode = None if mode == "raw" else "torch"
    if remote is None:
        dataset = ShardDataset(str(data), decode=decode)
    else:  # a fresh, empty cache: the epoch downloads every shard (default prefetch, retries and timeout)
        dataset = ShardDataset(
            remote.url("shardstream"),
            storage_options={"endpoint_url": remote.endpoint},
            cache_dir=str(remote.scratch / "cache"),
            decode=decode,
        )
    return dataset.loader(batch_size=BATCH_SIZE, **loader_args)


def processes(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    """A non-default row: 2 worker processes, as every other tool gets."""
    return loader(data, mode, remote, num_workers=WORKERS, workers="processes")


def threads(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    """A non-default row: 2 reader threads in the main process."""
    return loader(data, mode, remote, num_workers=WORKERS, workers="threads")
