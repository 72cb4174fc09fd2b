"""Raw values read in place: :class:`MappedBytes` batches locate values in local, uncompressed
shard files, which every process maps from the same page cache; each value is checked against
the file's version and length when it is read, and against its checksum (:class:`Expected`)."""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import CorruptShardError
from ...formats import checksums as checksums_format
from ...formats.checksums import checksum, mismatch

FileIdentity = tuple[
    int, int, int, int
]  # st_dev, st_ino, st_size, st_mtime_ns: one version of one file


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
    return CorruptShardError(
        f"{path}: the shard file {what} since this batch was read from it, so it no "
        "longer holds the batch's bytes; read the batch again (from a ShardDataset made "
        "after the change)"
    )


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
        # what is mapped, should the file change between stat and open
        identity = file_identity(f.fileno())
        if identity is None or (expected is not None and identity != tuple(expected)):
            raise _stale(path)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if identity[2] > 0 else b""
    _MAPS[path] = (identity, mapped)
    release_stale_maps()  # a new file: a good moment to let go of deleted and replaced ones
    while len(_MAPS) > _MAX_MAPS:
        _MAPS.popitem(last=False)  # closed when the last view of it goes
    return memoryview(mapped)


@dataclass(frozen=True)
class Expected:
    """What the values of one field of a :class:`MappedBytes` batch are: each one's checksum from its
    shard's sample index (``known``: per value whether it has one; None: all do), and, for the error of
    one that differs, the field's name and each value's sample key and position in its shard."""

    field: str
    sums: np.ndarray  # uint64, one per value
    keys: Sequence[Any]
    positions: np.ndarray
    known: np.ndarray | None = None

    def slice(self, start: int, stop: int) -> Expected:
        known = None if self.known is None else self.known[start:stop]
        return Expected(
            self.field,
            self.sums[start:stop],
            self.keys[start:stop],
            self.positions[start:stop],
            known,
        )


class MappedBytes(Sequence):
    """A batch of byte strings that stay where they are: in the (local, uncompressed) shard
    files, which every process maps from the same page cache. Only the locations cross from
    the worker to the main process; ``batch[i]`` reads the value. ``identities`` (one per path,
    optional) are the versions of the files the locations were found in: a file replaced since
    (a re-pack) gives :class:`CorruptShardError`, never other bytes. Each batch checks its files
    once, on its first read (a stat each), and every value against the file's length; a file
    replaced or deleted later is read as it was while the batch lives. With ``expected``, every value
    read (``batch[i]``, iterating, :meth:`view`) is checked against its checksum where it is read:
    :class:`~shardstream.errors.CorruptSampleError` naming the shard, the sample's key and the field.
    """

    def __init__(
        self,
        paths: list[str],
        shards: np.ndarray,
        starts: np.ndarray,
        sizes: np.ndarray,
        identities: Sequence[FileIdentity | None] | None = None,
        expected: Expected | None = None,
    ):
        self.paths, self.shards, self.starts, self.sizes = paths, shards, starts, sizes
        self.identities = list(identities) if identities is not None else None
        self.expected = expected
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

    def check(self, i: int, value: Any) -> None:
        """Raise unless ``value`` (value ``i``'s bytes) matches its checksum (where the batch knows it)."""
        found = self.expected
        if found is None or not checksums_format.CHECK_ON_READ:
            return
        if (found.known is None or found.known[i]) and checksum(value) != found.sums[i]:
            where = self.paths[int(self.shards[i])]
            raise mismatch(where, int(found.positions[i]), found.keys[i], found.field)

    def view(self, i: int) -> memoryview:
        """The i-th value without a copy (checked against its checksum)."""
        found = self._located(i)
        self.check(i, found)
        return found

    def _located(self, i: int) -> memoryview:
        k = int(self.shards[i])
        start, size = int(self.starts[i]), int(self.sizes[i])
        mapped = self._map(k)
        if start < 0 or size < 0 or start + size > len(mapped):
            raise CorruptShardError(
                f"{self.paths[k]}: value {i} of this batch lies at bytes {start}-{start + size}, past the file's "
                f"end ({len(mapped)} bytes); the shard was truncated or replaced, read the batch again"
            )
        return mapped[start : start + size]

    def __iter__(self) -> Iterator[bytes]:
        """Every value as bytes, in order (one pass, without the per-index checks of ``batch[i]``)."""
        maps = {
            k: self._map(k) for k in set(self.shards.tolist())
        }  # the files this batch (or slice) reads
        found = self.expected if checksums_format.CHECK_ON_READ else None
        sums = None if found is None else found.sums.tolist()
        for i, (k, start, size) in enumerate(
            zip(self.shards.tolist(), self.starts.tolist(), self.sizes.tolist())
        ):
            if start < 0 or size < 0 or start + size > len(maps[k]):
                self._located(i)  # raises, naming the file and the value
            value = bytes(maps[k][start : start + size])
            # the copy's bytes, in the core's cache: checked at little cost
            if sums is not None and checksum(value) != sums[i]:
                self.check(i, value)  # raises, unless the value has no checksum
            yield value

    def __getitem__(self, i):  # int -> bytes, slice -> list of bytes
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for a batch of {len(self)}")
        value = bytes(self._located(i))
        self.check(i, value)
        return value

    def slice(self, start: int, stop: int) -> MappedBytes:
        part = MappedBytes(
            self.paths,
            self.shards[start:stop],
            self.starts[start:stop],
            self.sizes[start:stop],
            self.identities,
            None if self.expected is None else self.expected.slice(start, stop),
        )
        if self._maps is None:
            self._maps = [None] * len(self.paths)
        part._maps = self._maps  # the same files: checked once for all parts
        return part

    def __reduce__(self):
        return (
            MappedBytes,
            (self.paths, self.shards, self.starts, self.sizes, self.identities, self.expected),
        )

    def __eq__(self, other: object) -> bool:
        # lists, RaggedBytes
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes, bytearray)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"MappedBytes({len(self)} values, {int(self.sizes.sum()):,} bytes)"

    def pin_memory(self, device: Any = None) -> MappedBytes:
        """Locations need no pinning (else the DataLoader's pin-memory thread would read every value)."""
        return self
