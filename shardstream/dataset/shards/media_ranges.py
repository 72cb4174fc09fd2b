"""Large video and audio fields of remote samples, read by the blocks a clip needs instead of whole.

A clip of 16 frames from a video of hundreds of megabytes in object storage needs the container's index
and the keyframe group around the clip: a few megabytes. When a map reads a sample of a remote tar
(:class:`~shardstream.dataset.shards.sparse.SparseReads`) whose field is decoded by a media clip
(:class:`~shardstream.dataset.samples.media.VideoClip`, ``AudioClip``) and holds at least the map's
``partial_media`` bytes, the decoder gets a :class:`MemberFile` instead of the field's bytes: a
read-only, seekable file over the member's span in the tar that PyAV opens and seeks in, fetching the
aligned blocks (:data:`~shardstream.manifest.media_facts.BLOCK`, 1 MiB) it reads with ranged GETs and
keeping the last few. Every block is checked against its blake2b-128 digest, recorded at pack time in
the media side file's ``blocks`` (:mod:`shardstream.manifest.media_facts`), before PyAV sees a byte of
it, and the sample's other fields against their checksums in the shard's verified index: a partial
read is as checked as a whole one. Samples without recorded block digests (packed before they were
recorded, or on a machine without PyAV), shards whose index has no member checksums, and smaller fields
are read whole, as before.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import CorruptShardError
from ...formats.checksums import checksum
from ...formats.tar_index import SampleIndex
from ...manifest.media_facts import BLOCK, DIGEST, MediaFacts, recorded_media

PARTIAL_MEDIA = 8 << 20  # bytes from which a clip's field is read by blocks (ShardMap's default)
KEPT_BLOCKS = (
    16  # blocks a file keeps (PyAV reads the container's index, then seeks back and forth)
)
_ADVICE = (
    "the shard was damaged or replaced after it was packed: run 'shardstream verify' on the dataset, "
    "and re-pack it or restore the shard"
)


class MemberFile(io.RawIOBase):
    """A read-only, seekable file over ``size`` bytes at ``start`` of the remote object ``path``, fetched
    by blocks of ``block`` bytes, each checked against its digest in ``digests`` (16 bytes a block).

    ``fetched`` counts the bytes it fetched, ``requests`` the ranged reads; ``counted(n)`` is told of
    each read's bytes. ``field`` names the field in a message."""

    def __init__(  # noqa: PLR0913 - where the member lies and how it is checked
        self,
        store: Any,
        path: str,
        start: int,
        size: int,
        digests: bytes,
        field: str,
        block: int = BLOCK,
        kept: int = KEPT_BLOCKS,
        counted: Callable[[int], None] | None = None,
    ):
        super().__init__()
        if len(digests) != DIGEST * -(-size // block):
            raise ValueError(f"{len(digests) // DIGEST} block digests for {size} bytes")
        self.store, self.path, self.start, self.size = store, path, start, size
        self.digests, self.field, self.block, self.kept = digests, field, block, kept
        self.counted = counted
        self.fetched = self.requests = 0
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def __len__(self) -> int:
        return self.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}.get(whence)
        if base is None:
            raise ValueError(f"whence={whence!r} is not SEEK_SET, SEEK_CUR or SEEK_END")
        if base + offset < 0:
            raise ValueError(f"seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        end = min(self._pos + len(out), self.size)
        if end <= self._pos:
            return 0
        first, last = self._pos // self.block, (end - 1) // self.block
        self._fetch(range(first, last + 1))
        done = 0
        for b in range(first, last + 1):
            data = self._blocks[b]
            a = max(self._pos, b * self.block) - b * self.block
            e = min(end, (b + 1) * self.block) - b * self.block
            out[done : done + e - a] = data[a:e]
            done += e - a
        self._pos = end
        return done

    def _fetch(self, wanted: range) -> None:
        """Blocks ``wanted`` in the kept ones: those missing fetched at once, each checked."""
        missing = [b for b in wanted if b not in self._blocks]
        for b in wanted:
            if b in self._blocks:
                self._blocks.move_to_end(b)
        if not missing:
            return
        starts = [self.start + b * self.block for b in missing]
        ends = [self.start + min((b + 1) * self.block, self.size) for b in missing]
        bad: dict[int, str] = {}

        def check(i: int, data: bytes) -> str | None:
            b = missing[i]
            if len(data) != ends[i] - starts[i]:
                problem = f"{len(data)} of the {ends[i] - starts[i]} bytes of its block {b} arrived"
            elif (
                hashlib.blake2b(data, digest_size=DIGEST).digest()
                != self.digests[DIGEST * b : DIGEST * (b + 1)]
            ):
                problem = f"its block {b} differs from the digest recorded at pack time"
            else:
                return None
            bad[i] = problem
            return f"field {self.field!r}: {problem}"

        try:
            parts = self.store.read_ranges([self.path] * len(missing), starts, ends, check, _ADVICE)
        except CorruptShardError:
            problem = next(iter(bad.values()), "a block does not match")
            raise CorruptShardError(
                f"field {self.field!r} ({self.size:,} bytes, read by blocks): {problem} on each "
                f"download; {_ADVICE}"
            ) from None
        self.requests += len(missing)
        got = sum(len(p) for p in parts)
        self.fetched += got
        if self.counted is not None:
            self.counted(got)
        for b, data in zip(missing, parts):
            self._blocks[b] = bytes(data)
        while len(self._blocks) > max(self.kept, len(wanted)):
            self._blocks.popitem(last=False)


class MediaRanges:
    """Which fields of a remote sample are read by blocks, and the sample with them as :class:`MemberFile`.

    ``clip_field(name)``: whether field ``name`` is decoded by a media clip; ``threshold``: the bytes
    from which such a field is read by blocks. ``fetched`` counts every byte its samples fetched (their
    blocks and other fields), ``samples`` the samples read this way. Threads may share one."""

    def __init__(
        self,
        store: Any,
        manifest: Any,
        clip_field: Callable[[str], bool],
        threshold: int,
        counted: Callable[[int, int], None] | None = None,
    ):
        self.store, self.manifest, self.clip_field = store, manifest, clip_field
        self.threshold, self.counted = int(threshold), counted
        self.fetched = self.samples = 0
        self._facts: MediaFacts | None = None
        self._loaded = False
        self._lock = threading.Lock()
        self._first = np.concatenate([[0], np.cumsum(np.asarray(manifest.stored_counts))])

    def facts(self) -> MediaFacts | None:
        """The dataset's recorded media facts with their block digests (read once), or None."""
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    media = self.manifest.media
                    if media is not None and "blocks" in media.reference:
                        self._facts = recorded_media(self.store, self.manifest)
                    self._loaded = True
        return self._facts

    def wanted(self, index: SampleIndex, row: int) -> bool:
        """Whether sample ``row`` of a shard with ``index`` has a field to read by blocks."""
        if self.manifest.media is None or index.checksums is None or not index.has_digests:
            return False
        start, stop = int(index.first[row]), int(index.first[row + 1])
        if not any(int(s) >= self.threshold for s in index.sizes[start:stop]):
            return False
        _, fields = index.indexed("").sample(row)
        return any(
            size >= self.threshold and self.clip_field(name) for name, (_, size) in fields.items()
        )

    def _add(self, shard: int, n: int) -> None:
        with self._lock:
            self.fetched += n
        if self.counted is not None:
            self.counted(shard, n)

    def sample(self, shard: int, row: int, index: SampleIndex, where: str) -> dict[str, Any] | None:
        """Sample ``row`` of ``shard``: its large clip fields as :class:`MemberFile`, the others fetched
        and checked against the index's member checksums; None where its block digests are not recorded
        (the caller reads it whole)."""
        facts = self.facts()
        if facts is None:
            return None
        key, fields = index.indexed(where).sample(row)
        stored_row = int(self._first[shard]) + row
        path = self.manifest.paths[shard]
        files, small = {}, []
        for name, (offset, size) in fields.items():
            digests = facts.block_digests(name, stored_row) if self.clip_field(name) else b""
            if size >= self.threshold and len(digests) == DIGEST * -(-size // BLOCK):
                files[name] = MemberFile(
                    self.store,
                    path,
                    offset,
                    size,
                    digests,
                    name,
                    counted=lambda n: self._add(shard, n),
                )
            else:
                small.append((name, offset, size))
        if not files:
            return None
        first = int(index.first[row])
        sums = {
            name: int(index.checksums[first + j])  # type: ignore[index]
            for j, name in enumerate(fields)
        }

        def check(i: int, data: bytes) -> str | None:
            name = small[i][0]
            return (
                None
                if checksum(data) == sums[name]
                else f"field {name!r} differs from its checksum"
            )

        parts = (
            self.store.read_ranges(
                [path] * len(small),
                [o for _, o, _ in small],
                [o + n for _, o, n in small],
                check,
                _ADVICE,
            )
            if small
            else []
        )
        self._add(shard, sum(len(p) for p in parts))
        with self._lock:
            self.samples += 1
        return {"__key__": key, **{n: bytes(p) for (n, _, _), p in zip(small, parts)}, **files}


__all__ = ["KEPT_BLOCKS", "PARTIAL_MEDIA", "MediaRanges", "MemberFile"]
