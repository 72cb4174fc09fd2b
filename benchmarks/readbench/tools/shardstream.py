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


def pack_argv(source: Path, out: Path) -> list[str]:
    """The ``shardstream pack`` command that converts ``source`` (an image folder or a Parquet file) into ``out``;
    tar shards with their sample indexes (``--index``), as a pack for an upload to object storage has them."""
    index = ["--index"] if source.suffix != ".parquet" else []
    return [
        *shardstream_command(),
        "pack",
        str(source),
        str(out),
        "--shard-size",
        SHARD_SIZE,
        "--overwrite",
        "-q",
        *index,
    ]


def loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    from shardstream import ShardDataset

    decode = None if mode == "raw" else "torch"
    if remote is None:
        dataset = ShardDataset(str(data), shuffle=True, seed=0, decode=decode)
    else:  # a fresh, empty cache: the epoch downloads every shard (default prefetch, retries and timeout)
        dataset = ShardDataset(
            remote.url("shardstream"),
            storage_options={"endpoint_url": remote.endpoint},
            cache_dir=str(remote.scratch / "cache"),
            shuffle=True,
            seed=0,
            decode=decode,
        )
    return dataset.loader(batch_size=BATCH_SIZE, num_workers=WORKERS)
