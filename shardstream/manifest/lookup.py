"""Look inside a dataset: one sample by its index or key."""

from __future__ import annotations

from typing import Any

from ..errors import ShardstreamError
from ..formats import TAR_COMPRESSION, iter_shard_samples
from ..formats import arrow as arrow_format
from ..formats import tar as tar_format
from ..formats.compression import decompress
from ..storage import Store
from .schema import Manifest


def sample_at(store: Store, manifest: Manifest, index: int) -> dict[str, Any]:
    """The dataset's ``index``-th sample (negative counts from the end)."""
    n = manifest.num_samples
    if index < 0:
        index += n
    try:
        shard, offset = manifest.locate(index)
    except IndexError as exc:
        raise ShardstreamError(str(exc)) from None
    name = manifest.paths[shard]
    data = store.read_bytes(name)
    if manifest.shard_format == "arrow":
        table = arrow_format.read_table(data, store.url_of(name))
        return table.slice(offset, 1).to_pylist()[0]
    for i, sample in enumerate(iter_shard_samples(manifest.shard_format, data, store.url_of(name))):
        if i == offset:
            return sample
    raise ShardstreamError(
        f"{store.url_of(name)} has fewer samples than its manifest says ({manifest.samples[shard]}); "
        "run 'shardstream verify'"
    )


def sample_by_key(store: Store, manifest: Manifest, key: str) -> dict[str, Any]:
    """The first sample whose ``__key__`` is ``key`` (scans shards in order; headers only for tar)."""
    for name in manifest.paths:
        data = store.read_bytes(name)
        where = store.url_of(name)
        if manifest.shard_format == "arrow":
            table = arrow_format.read_table(data, where)
            if "__key__" not in table.column_names:
                raise ShardstreamError(
                    f"{store.url} has no __key__ column; look samples up by index"
                )
            keys = table.column("__key__").to_pylist()
            if key in keys:
                return table.slice(keys.index(key), 1).to_pylist()[0]
            continue
        found = tar_format.read_samples(
            decompress(data, TAR_COMPRESSION[manifest.shard_format], where), where
        )
        for k, fields in zip(found.keys, found.fields):
            if k == key:
                view = memoryview(found.data)
                return {
                    "__key__": k,
                    **{ext: bytes(view[o : o + n]) for ext, (o, n) in fields.items()},
                }
    raise ShardstreamError(f"no sample with key {key!r} in {store.url}")
