"""A tar shard's sample index: where each sample's members lie, and their sha256.

Written next to an uncompressed tar shard at pack time as ``<shard>.idx``, it lets a reader fetch
single samples from object storage with ranged reads (the first batch of an epoch, before whole
shards arrive) and check each against its own sha256, as the whole shard is checked against the
manifest's. Sample ``i`` is the bytes ``offsets[i]:offsets[i + 1]`` of the tar: its members'
headers, data and padding, a tar of its own once an end-of-archive marker follows.

Layout (little-endian): ``MAGIC``, the sample count ``n`` (uint64), ``n + 1`` offsets (uint64),
``n`` sha256 digests (32 bytes each). A hand-written format because it is read whole with one
``numpy.frombuffer`` and its size is exact: 40 bytes a sample. The file is untrusted input; its own
sha256 is in the manifest, and :func:`parse_index` checks every offset.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptShardError

MAGIC = b"SSTARIX1"
SUFFIX = ".idx"
_HEAD = len(MAGIC) + 8
_FIX = "re-pack the dataset (or re-create its index files)"


def index_name(shard_path: str) -> str:
    """The index file of the shard at ``shard_path``."""
    return shard_path + SUFFIX


class IndexBuilder:
    """Collects a sample index while a tar shard is written: call :meth:`add` with each sample's
    pieces (in order), then :meth:`to_bytes`."""

    def __init__(self) -> None:
        self.offsets = [0]
        self.digests: list[bytes] = []

    def add(self, pieces: list) -> None:
        h = hashlib.sha256()
        size = 0
        for piece in pieces:
            h.update(piece)
            size += memoryview(piece).nbytes
        self.offsets.append(self.offsets[-1] + size)
        self.digests.append(h.digest())

    def to_bytes(self) -> bytes:
        n = len(self.digests)
        return MAGIC + struct.pack("<Q", n) + np.asarray(self.offsets, dtype="<u8").tobytes() + b"".join(self.digests)


@dataclass(frozen=True)
class SampleIndex:
    """The parsed index of one shard: ``offsets`` (n + 1, int64) and ``digests`` (n x 32 bytes)."""

    offsets: np.ndarray
    digests: bytes

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def span(self, i: int) -> tuple[int, int]:
        """Sample ``i``'s bytes in the tar: (start, end)."""
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def check(self, i: int, data: bytes | memoryview, name: str) -> None:
        """Raise unless ``data`` are sample ``i``'s bytes as packed."""
        if hashlib.sha256(data).digest() != self.digests[32 * i : 32 * i + 32]:
            raise CorruptShardError(f"{name}: sample {i}'s bytes differ from its sha256 in the shard's index; the "
                                    f"shard or its index was replaced or damaged: {_FIX}")


def parse_index(data: bytes, name: str, samples: int, tar_size: int) -> SampleIndex:
    """Check and parse ``data``, the index of a tar of ``tar_size`` bytes holding ``samples`` samples
    (both from the manifest); :class:`CorruptShardError` naming ``name`` for anything else."""

    def bad(what: str) -> CorruptShardError:
        return CorruptShardError(f"{name}: {what}; {_FIX}")

    if len(data) < _HEAD or bytes(data[: len(MAGIC)]) != MAGIC:
        raise bad("not a shardstream sample index")
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    if n != samples:
        raise bad(f"it indexes {n} samples, the manifest says the shard has {samples}")
    if len(data) != _HEAD + 8 * (n + 1) + 32 * n:
        raise bad(f"{len(data)} bytes, a sample index of {n} samples has {_HEAD + 40 * n + 8}")
    offsets = np.frombuffer(data, dtype="<u8", count=n + 1, offset=_HEAD)
    # samples start at 0 and follow each other in 512-byte blocks; the end-of-archive marker follows the last
    if offsets[0] != 0 or (offsets % 512).any() or (np.diff(offsets.astype(np.int64)) <= 0).any() \
            or int(offsets[-1]) + 1024 > tar_size:
        raise bad("its sample offsets are not increasing 512-byte blocks inside the shard")
    return SampleIndex(offsets.astype(np.int64), bytes(data[_HEAD + 8 * (n + 1) :]))
