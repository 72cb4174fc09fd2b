"""The indexed shard reader: one shard opened once, its samples found by offset.

A tar shard's headers are parsed once into an index of (key, field offsets); a sample
is then a few slices of the shard's buffer (a memory map for local files), with no
``tarfile`` and no copy until the caller asks for bytes. Arrow shards use the IPC
file's record-batch directory. Readers are cached per process, as many as the shuffle
window reads at once; their bytes come from :mod:`shardstream.storage.fetch` (a local map,
or a checked download). :class:`MappedBytes` are values read in place from local shard
files, checked against the file's version and length.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import CorruptShardError
from ..formats import TAR_COMPRESSION
from ..formats import tar as tar_format
from ..formats.compression import decompress
from ..manifest import Manifest
from ..storage import Prefetcher, ShardFetcher, Store


class TarShard:
    """Random access to the samples of one tar shard. ``identity``: the version of the local file
    ``data`` maps (:func:`file_identity`); ``owned``: bytes it holds in memory (decompressed)."""

    def __init__(self, data, name: str, expected_samples: int, identity: FileIdentity | None = None):
        self.name = name
        self.data = data
        self.identity = identity
        self.owned = len(data) if isinstance(data, (bytes, bytearray)) else 0
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
        self.owned = self.table.nbytes  # decompressed buffers (at most: those of an uncompressed file are mapped)
        self._columns: dict[str, list[Any]] | None = None

    def sample(self, i: int) -> dict[str, Any]:
        if self._columns is None:  # one conversion per shard, not per row
            self._columns = self.table.to_pydict()
        return {name: values[i] for name, values in self._columns.items()}

    views = sample

    def take(self, rows):
        return self.table.take(rows)


DECOMPRESSED_LIMIT = 1 << 30  # bytes of decompressed shards a process keeps open beyond those the plan needs


def window_span(counts: np.ndarray, window: int) -> int:
    """The most shards that ``window`` consecutive positions of an epoch's order can touch
    (the smallest shards laid end to end, plus one cut at each end)."""
    sizes = np.sort(counts[counts > 0])
    if len(sizes) == 0:
        return 1
    whole = int(np.searchsorted(np.cumsum(sizes), window, side="right"))
    return min(whole + 2, len(sizes))


class OpenShards:
    """The shards this process has open (indexed, ready to read), least recently used dropped first.

    Shards come from a :class:`~shardstream.storage.ShardFetcher`, or from ``take`` while a
    :class:`~shardstream.storage.Prefetcher` loads them ahead (it calls :meth:`load`). At most
    ``capacity`` shards stay open (see :meth:`fit_window`), and of the shards held in memory
    (decompressed) at most ``max_owned`` bytes beyond those :meth:`retain` says the plan needs
    next; shards the plan needs are never dropped to make room (that would decompress them again
    per sample).
    """

    def __init__(self, store: Store, manifest: Manifest, capacity: int = 16, fetcher: ShardFetcher | None = None,
                 max_owned: int = DECOMPRESSED_LIMIT):
        self.store = store
        self.manifest = manifest
        self.capacity = capacity
        self.max_owned = max_owned
        self.fetcher = fetcher or ShardFetcher(store, manifest)
        self.take: Callable[[int], TarShard | ArrowShard] | None = None
        self._open: OrderedDict[int, TarShard | ArrowShard] = OrderedDict()
        self._needed: set[int] = set()  # what the plan reads next (retain): never dropped for room
        self._failed: dict[int, BaseException] = {}  # this pass's shards that failed: not fetched again per sample
        self._fitted: int | None = None

    def fit_window(self, window: int) -> None:
        """Keep open as many shards as a shuffle window of ``window`` samples reads at once, and the
        next window's (at least 16): fewer would close and re-index shards sample by sample."""
        if window != self._fitted:
            self.capacity = max(16, 2 * window_span(np.asarray(self.manifest.samples), window) + 1)
            self._fitted = window

    @property
    def owned(self) -> int:
        """Bytes the open shards hold in memory (decompressed), not in maps of files."""
        return sum(reader.owned for reader in self._open.values())

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
        self._make_room(shard)
        return opened

    def _make_room(self, keep: int) -> None:
        """Drop the least recently used shards (not ``keep``, none the plan needs) while over the limits."""
        extra, owned = len(self._open) - self.capacity, self.owned - self.max_owned
        for shard in list(self._open):
            if extra <= 0 and owned <= 0:
                break
            if shard == keep or shard in self._needed:
                continue
            owned -= self._open.pop(shard).owned
            extra -= 1

    def key_of(self, shard: int, offset: int) -> str | None:
        """The key of sample ``offset`` of ``shard`` if that shard is open and has keys (for messages)."""
        reader = self._open.get(shard)
        if isinstance(reader, TarShard) and 0 <= offset < len(reader.keys):
            return reader.keys[offset]
        return None

    def forget_failures(self) -> None:
        """Try the shards that failed again (at the start of a pass)."""
        self._failed.clear()
        self._needed = set()

    def retain(self, shards: set[int]) -> None:
        """Close the open shards not in ``shards``, which are what the plan reads next."""
        self._needed = set(shards)
        for shard in [s for s in self._open if s not in shards]:
            del self._open[shard]

    def load(self, shard: int) -> TarShard | ArrowShard:
        """Fetch, check, decompress and index shard ``shard`` (safe to call from any thread)."""
        return self._load(shard)

    def _load(self, shard: int) -> TarShard | ArrowShard:
        m = self.manifest
        name = self.store.url_of(m.paths[shard])
        path = self.store.path(m.paths[shard]) if self.store.local else None
        before = file_identity(path) if path else None
        data = self.fetcher.fetch(shard)
        identity = file_identity(path) if path else None
        if identity != before:  # the map may hold either version: its locations would name no file for sure
            raise CorruptShardError(f"{name}: the shard file was replaced while it was opened; the dataset is being "
                                    "re-written: make a new ShardDataset once that is done")
        if len(data) != m.nbytes[shard]:
            raise CorruptShardError(
                f"{name}: {len(data)} bytes, the manifest says {m.nbytes[shard]}; the shard is truncated or "
                "was replaced, run 'shardstream verify'"
            )
        expected = int(m.samples[shard])
        if m.shard_format == "arrow":
            return ArrowShard(data, name, expected)
        plain = decompress(data, TAR_COMPRESSION[m.shard_format], name)
        return TarShard(plain, name, expected, identity if plain is data else None)


FileIdentity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns: one version of one file


def file_identity(path_or_fd: str | int) -> FileIdentity | None:
    """Which file ``path_or_fd`` is now, and which version of it (a re-packed shard gets another);
    ``None`` if there is none to stat."""
    try:
        st = os.stat(path_or_fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


# shard files this process has mapped for MappedBytes, with the identity of the file each map holds
_MAPS: OrderedDict[str, tuple[FileIdentity, mmap.mmap | bytes]] = OrderedDict()
_MAX_MAPS = 64


def release_stale_maps() -> None:
    """Forget the maps of files that were replaced or deleted since they were mapped, so that their
    disk space is freed once no batch views them any more."""
    for path, (identity, _) in list(_MAPS.items()):
        if file_identity(path) != identity:
            _MAPS.pop(path, None)


def _stale(path: str, what: str = "was replaced or changed") -> CorruptShardError:
    return CorruptShardError(f"{path}: the shard file {what} since this batch was read from it, so it no "
                             "longer holds the batch's bytes; read the batch again (from a ShardDataset made "
                             "after the change)")


def _mapping(path: str, expected: FileIdentity | None = None) -> memoryview:
    """The file at ``path`` as it is now (one stat), mapped; ``expected``: the version the batch's
    locations were found in (refused if the file is another one now)."""
    current = file_identity(path)
    if current is None:
        _MAPS.pop(path, None)
        raise _stale(path, "is gone (deleted or moved)")
    if expected is not None and current != tuple(expected):
        raise _stale(path)
    found = _MAPS.get(path)
    if found is not None and found[0] == current:
        _MAPS.move_to_end(path)
        return memoryview(found[1])
    _MAPS.pop(path, None)  # another version: dropped (its space is freed once its views are gone)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the map outlives it
    except OSError as exc:
        raise _stale(path, "is gone (deleted or moved)") from exc
    with f:
        identity = file_identity(f.fileno())  # what is mapped, should the file change between stat and open
        if identity is None or (expected is not None and identity != tuple(expected)):
            raise _stale(path)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if identity[2] > 0 else b""
    _MAPS[path] = (identity, mapped)
    release_stale_maps()  # a new file: a good moment to let go of deleted and replaced ones
    while len(_MAPS) > _MAX_MAPS:
        _MAPS.popitem(last=False)  # closed when the last view of it goes
    return memoryview(mapped)


class MappedBytes(Sequence):
    """A batch of byte strings that stay where they are: in the (local, uncompressed) shard
    files, which every process maps from the same page cache. Only the locations cross from
    the worker to the main process; ``batch[i]`` reads the value. ``identities`` (one per path,
    optional) are the versions of the files the locations were found in: a file replaced since
    (a re-pack) gives :class:`CorruptShardError`, never other bytes. Each batch checks its files
    once, on its first read (a stat each), and every value against the file's length; a file
    replaced or deleted later is read as it was while the batch lives.
    """

    def __init__(self, paths: list[str], shards: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                 identities: Sequence[FileIdentity | None] | None = None):
        self.paths, self.shards, self.starts, self.sizes = paths, shards, starts, sizes
        self.identities = list(identities) if identities is not None else None
        self._maps: list[memoryview | None] | None = None  # per path, once read (shared by slices)

    def __len__(self) -> int:
        return len(self.starts)

    def _map(self, k: int) -> memoryview:
        if self._maps is None:
            self._maps = [None] * len(self.paths)
        found = self._maps[k]
        if found is None:
            expected = self.identities[k] if self.identities is not None else None
            found = self._maps[k] = _mapping(self.paths[k], expected)
        return found

    def view(self, i: int) -> memoryview:
        """The i-th value without a copy."""
        k = int(self.shards[i])
        start, size = int(self.starts[i]), int(self.sizes[i])
        mapped = self._map(k)
        if start < 0 or size < 0 or start + size > len(mapped):
            raise CorruptShardError(
                f"{self.paths[k]}: value {i} of this batch lies at bytes {start}-{start + size}, past the file's "
                f"end ({len(mapped)} bytes); the shard was truncated or replaced, read the batch again")
        return mapped[start : start + size]

    def __iter__(self) -> Iterator[bytes]:
        """Every value as bytes, in order (one pass, without the per-index checks of ``batch[i]``)."""
        maps = {k: self._map(k) for k in set(self.shards.tolist())}  # the files this batch (or slice) reads
        for i, (k, start, size) in enumerate(zip(self.shards.tolist(), self.starts.tolist(), self.sizes.tolist())):
            if start < 0 or size < 0 or start + size > len(maps[k]):
                self.view(i)  # raises, naming the file and the value
            yield bytes(maps[k][start : start + size])

    def __getitem__(self, i):  # int -> bytes, slice -> list of bytes
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for a batch of {len(self)}")
        return bytes(self.view(i))

    def slice(self, start: int, stop: int) -> MappedBytes:
        part = MappedBytes(self.paths, self.shards[start:stop], self.starts[start:stop], self.sizes[start:stop],
                           self.identities)
        if self._maps is None:
            self._maps = [None] * len(self.paths)
        part._maps = self._maps  # the same files: checked once for all parts
        return part

    def __reduce__(self):
        return (MappedBytes, (self.paths, self.shards, self.starts, self.sizes, self.identities))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes, bytearray)):  # lists, RaggedBytes
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"MappedBytes({len(self)} values, {int(self.sizes.sum()):,} bytes)"

    def pin_memory(self, device: Any = None) -> MappedBytes:
        """Locations need no pinning (else the DataLoader's pin-memory thread would read every value)."""
        return self


Chunk = tuple[int, np.ndarray, np.ndarray]  # a batch's first position in the epoch's order, its shards and offsets


def looking_ahead(chunks: Iterable[Chunk], depth: int, prefetcher: Prefetcher | None, shards: OpenShards
                  ) -> Iterator[Chunk]:
    """The chunks, while the shards of the next ``depth`` are prefetched (with a prefetcher) and the
    others closed; both are told again only when that set of shards changes."""
    it = iter(chunks)
    ahead: deque[tuple[Chunk, list[int]]] = deque()
    uses: dict[int, int] = {}  # shard -> chunks ahead that read it
    changed = True

    def push(item: Chunk) -> None:
        nonlocal changed
        used = list(dict.fromkeys(item[1].tolist()))  # (np.unique costs more on small chunks)
        ahead.append((item, used))
        for shard in used:
            changed = changed or shard not in uses
            uses[shard] = uses.get(shard, 0) + 1

    for item in it:
        push(item)
        if len(ahead) >= max(depth, 2):
            break
    while ahead:
        if changed:
            needed = np.concatenate([ids for (_, ids, _), _ in ahead])
            first, index = np.unique(needed, return_index=True)
            in_order = first[np.argsort(index)].tolist()  # shards by first use
            if prefetcher is not None:
                prefetcher.want(in_order)
                prefetcher.keep_only(in_order)
            shards.retain(set(in_order))
            changed = False
        item, used = ahead.popleft()
        for shard in used:
            uses[shard] -= 1
            if not uses[shard]:
                del uses[shard]
                changed = True
        yield item
        following = next(it, None)
        if following is not None:
            push(following)
