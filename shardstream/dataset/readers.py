"""The indexed shard reader: one shard opened once, its samples found by offset.

A tar shard's headers are parsed once into an index of (key, field offsets); a sample
is then a few slices of the shard's buffer (a memory map for local files), with no
``tarfile`` and no copy until the caller asks for bytes. Arrow shards use the IPC
file's record-batch directory. Readers are cached per process, a few at a time; their
bytes come from :mod:`shardstream.storage.fetch` (a local map, or a checked download).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import CorruptShardError
from ..formats import TAR_COMPRESSION
from ..formats import tar as tar_format
from ..formats.compression import decompress
from ..manifest import Manifest
from ..storage import Prefetcher, ShardFetcher, Store


class TarShard:
    """Random access to the samples of one tar shard."""

    def __init__(self, data, name: str, expected_samples: int):
        self.name = name
        self.data = data
        self.view = memoryview(data)
        self.keys, self.fields = tar_format.index_samples(data, name)
        if len(self.keys) != expected_samples:
            raise CorruptShardError(
                f"{name}: {len(self.keys)} samples, the manifest says {expected_samples}; "
                "the shard or the manifest was replaced, re-create the manifest or the shard"
            )

    def sample(self, i: int) -> dict[str, Any]:
        view = self.view
        sample: dict[str, Any] = {"__key__": self.keys[i]}
        for ext, (offset, size) in self.fields[i].items():
            sample[ext] = bytes(view[offset : offset + size])
        return sample

    def locate(self, i: int) -> tuple[str, dict[str, tuple[int, int]]]:
        """The i-th sample's key and its fields' (offset, size) in the shard."""
        return self.keys[i], self.fields[i]

    def views(self, i: int) -> dict[str, Any]:
        """Like :meth:`sample`, with ``memoryview`` slices of the shard instead of copies."""
        view = self.view
        sample: dict[str, Any] = {"__key__": self.keys[i]}
        for ext, (offset, size) in self.fields[i].items():
            sample[ext] = view[offset : offset + size]
        return sample


class ArrowShard:
    """Random access to the rows of one Arrow IPC shard; whole batches by ``take``."""

    def __init__(self, data, name: str, expected_samples: int):
        from ..formats import arrow as arrow_format

        self.name = name
        self.table = arrow_format.read_table(data, name)
        if self.table.num_rows != expected_samples:
            raise CorruptShardError(
                f"{name}: {self.table.num_rows} rows, the manifest says {expected_samples}; "
                "the shard or the manifest was replaced"
            )
        self._columns: dict[str, list[Any]] | None = None

    def sample(self, i: int) -> dict[str, Any]:
        if self._columns is None:  # one conversion per shard, not per row
            self._columns = self.table.to_pydict()
        return {name: values[i] for name, values in self._columns.items()}

    views = sample

    def take(self, rows):
        return self.table.take(rows)


class OpenShards:
    """The shards this process has open (indexed, ready to read), least recently used dropped first.

    Shards come from a :class:`~shardstream.storage.ShardFetcher`, or from ``take`` while a
    :class:`~shardstream.storage.Prefetcher` loads them ahead (it calls :meth:`load`).
    """

    def __init__(self, store: Store, manifest: Manifest, capacity: int = 16, fetcher: ShardFetcher | None = None):
        self.store = store
        self.manifest = manifest
        self.capacity = capacity
        self.fetcher = fetcher or ShardFetcher(store, manifest)
        self.take: Callable[[int], TarShard | ArrowShard] | None = None
        self._open: OrderedDict[int, TarShard | ArrowShard] = OrderedDict()
        self._failed: dict[int, BaseException] = {}  # this pass's shards that failed: not fetched again per sample

    def get(self, shard: int) -> TarShard | ArrowShard:
        found = self._open.get(shard)
        if found is not None:
            self._open.move_to_end(shard)
            return found
        failure = self._failed.get(shard)
        if failure is not None:
            raise failure.with_traceback(None)
        try:
            opened = self.take(shard) if self.take is not None else self._load(shard)
        except Exception as exc:
            self._failed[shard] = exc
            raise
        self._open[shard] = opened
        if len(self._open) > self.capacity:
            self._open.popitem(last=False)
        return opened

    def key_of(self, shard: int, offset: int) -> str | None:
        """The key of sample ``offset`` of ``shard`` if that shard is open and has keys (for messages)."""
        reader = self._open.get(shard)
        if isinstance(reader, TarShard) and 0 <= offset < len(reader.keys):
            return reader.keys[offset]
        return None

    def forget_failures(self) -> None:
        """Try the shards that failed again (at the start of a pass)."""
        self._failed.clear()

    def retain(self, shards: set[int]) -> None:
        """Close the open shards not in ``shards`` (the plan no longer needs them)."""
        for shard in [s for s in self._open if s not in shards]:
            del self._open[shard]

    def load(self, shard: int) -> TarShard | ArrowShard:
        """Fetch, check, decompress and index shard ``shard`` (safe to call from any thread)."""
        return self._load(shard)

    def _load(self, shard: int) -> TarShard | ArrowShard:
        m = self.manifest
        name = self.store.url_of(m.paths[shard])
        data = self.fetcher.fetch(shard)
        if len(data) != m.nbytes[shard]:
            raise CorruptShardError(
                f"{name}: {len(data)} bytes, the manifest says {m.nbytes[shard]}; the shard is truncated or "
                "was replaced, run 'shardstream verify'"
            )
        expected = int(m.samples[shard])
        if m.shard_format == "arrow":
            return ArrowShard(data, name, expected)
        plain = decompress(data, TAR_COMPRESSION[m.shard_format], name)
        return TarShard(plain, name, expected)


Chunk = tuple[int, np.ndarray, np.ndarray]  # a batch's first position in the epoch's order, its shards and offsets


def looking_ahead(chunks: Iterable[Chunk], depth: int, prefetcher: Prefetcher, shards: OpenShards
                  ) -> Iterator[Chunk]:
    """The chunks, while the shards of the next ``depth`` are prefetched and the others closed."""
    it = iter(chunks)
    ahead: deque[Chunk] = deque()
    for item in it:
        ahead.append(item)
        if len(ahead) >= max(depth, 2):
            break
    while ahead:
        needed = np.concatenate([ids for _, ids, _ in ahead])
        first, index = np.unique(needed, return_index=True)
        in_order = first[np.argsort(index)].tolist()  # shards by first use
        prefetcher.want(in_order)
        prefetcher.keep_only(in_order)
        shards.retain(set(in_order))
        yield ahead.popleft()
        following = next(it, None)
        if following is not None:
            ahead.append(following)
