"""A tar shard's sample index: where each sample and each of its members lie, and each sample's sha256.

Written at pack time for each uncompressed tar shard (where: :mod:`shardstream.manifest.side_names`,
``.shardstream/<shard>.idx``). A reader opens a local
shard from it without parsing the tar's headers (a shard of 2,400 samples: about 2 ms instead of
20-35), and fetches single samples from object storage with ranged reads (an epoch's first batch,
before whole shards arrive), each checked against its own sha256, as a whole shard is checked
against the manifest's. Sample ``i`` is the bytes ``offsets[i]:offsets[i + 1]`` of the tar: its
members' headers, data and padding, a tar of its own once an end-of-archive marker follows.

Layout (little-endian): ``MAGIC``; the sample count ``n``, the member count ``m`` and the length of
the names (uint64 each); ``n + 1`` sample offsets (uint64); ``n`` sha256 digests (32 bytes each);
``n + 1`` first-member numbers (uint64: sample ``i`` has members ``first[i]:first[i + 1]``); ``m``
member data offsets and ``m`` member sizes (uint64); the ``m`` member names, UTF-8, each followed by a
NUL. A hand-written format because it is read with a few ``numpy.frombuffer`` calls and its size is
exact. The file is untrusted input: its own sha256 is in the manifest, and :func:`parse_index` checks
that every number lies where the tar can hold it.

Version 2 (``MAGIC_GROUPED``, same layout) indexes a tar whose samples are no runs of members: a key's
members apart (a tar written in folder order), hard links (a member's bytes are an earlier member's).
Its members' data lie anywhere in the tar; its sample offsets are all 0 but the last, the end of the
members, and its digests are zeros: a sample of it has no span of its own, so it is read from the whole
shard (never by a ranged read of a span). :func:`shardstream.formats.tar.build_index` writes version 1 wherever it can, so
readers of version 1 read every index of a tar packed or written in order.

Version 3 (``MAGIC_CHECKED``, written by every pack and by ``shardstream index``) adds what a reader checks
every value against: after the three counts, a flags word (uint64: :data:`GROUPED`, a version 2 index's
samples without spans; :data:`COMPRESSED`, the index of a compressed tar, whose offsets are in the
decompressed tar and whose sample digests are zeros: such a shard is never read by ranged reads), and
after the member sizes, ``m`` member checksums (uint64: :func:`~shardstream.formats.checksums.checksum`,
xxh3_64, of each member's data). Versions 1 and 2 stay readable; they have no member checksums.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import CorruptShardError, sample_name
from .checksums import checksum

MAGIC = b"SSTARIX1"
MAGIC_GROUPED = b"SSTARIX2"  # version 2: samples without spans (see the module)
MAGIC_CHECKED = b"SSTARIX3"  # version 3: flags and member checksums (see the module)
GROUPED = 1  # version 3 flag: samples without spans, as version 2
COMPRESSED = 2  # version 3 flag: offsets in the decompressed tar, no sample digests
_FLAGS = GROUPED | COMPRESSED
_HEAD = len(MAGIC) + 24

if TYPE_CHECKING:
    import numpy as np
_FIX = "re-pack the dataset (or re-create its index files)"


def index_size(samples: int, members: int, names: int, checked: bool = False) -> int:
    """Bytes of the index of a shard with ``samples`` samples, ``members`` members and ``names`` bytes of names
    (``checked``: version 3, with flags and member checksums)."""
    size = _HEAD + 8 * (samples + 1) + 32 * samples + 8 * (samples + 1) + 16 * members + names
    return size + 8 + 8 * members if checked else size


class IndexBuilder:
    """Collects a sample index while a tar shard is written: :meth:`add` each sample as it is written.

    ``compressed``: the shard is compressed whole (offsets are in the decompressed tar; no sample sha256 is
    computed, since no ranged read can fetch a span of it). ``checked`` (default): version 3, with each
    member's checksum; ``False``: version 1 (an index built from a tar that no pack vouched for)."""

    def __init__(self, compressed: bool = False, checked: bool = True) -> None:
        self.offsets = [0]
        self.digests: list[bytes] = []
        self.first = [0]
        self.data_offsets: list[int] = []
        self.sizes: list[int] = []
        self.names: list[bytes] = []
        self.checksums: list[int] = []
        self.compressed, self.checked = compressed, checked or compressed

    def add(
        self, pieces: list, members: list[tuple[str, int, int]], sums: list[int] | None = None
    ) -> None:
        """One sample: its ``pieces`` (as written, headers and padding included), per member (name, header
        bytes, data bytes), and each member's data checksum (``sums``; without them the index is a version
        1 index, which has none)."""
        digest = None
        if not self.compressed:
            h = hashlib.sha256()
            for piece in pieces:
                h.update(piece)
            digest = h.digest()
        self.add_hashed(digest, members, sums)

    def add_hashed(
        self,
        digest: bytes | None,
        members: list[tuple[str, int, int]],
        sums: list[int] | None = None,
    ) -> None:
        """One sample whose bytes were hashed by the caller (``digest``: their sha256; None for a compressed
        shard's), with its members' data checksums (``sums``, as for :meth:`add`)."""
        if sums is None:
            if self.compressed:
                raise ValueError("the index of a compressed shard needs each member's checksum")
            self.checked = False
        at = self.offsets[-1]
        for name, header, size in members:
            self.data_offsets.append(at + header)
            self.sizes.append(size)
            self.names.append(name.encode("utf-8", "surrogateescape"))
            at += header + size + (-size % 512)
        self.offsets.append(at)
        self.digests.append(_NO_DIGEST if digest is None else digest)
        self.checksums += sums or ()
        self.first.append(len(self.sizes))

    def to_bytes(self) -> bytes:
        import numpy as np  # here, not at import: a pack without indexes never needs it

        names = b"".join(n + b"\0" for n in self.names)
        u8 = lambda values: np.asarray(values, dtype="<u8").tobytes()  # noqa: E731
        counts = (len(self.digests), len(self.sizes), len(names))
        head = (
            MAGIC_CHECKED + struct.pack("<QQQQ", *counts, COMPRESSED if self.compressed else 0)
            if self.checked
            else MAGIC + struct.pack("<QQQ", *counts)
        )
        return b"".join(
            (
                head,
                u8(self.offsets),
                *self.digests,
                u8(self.first),
                u8(self.data_offsets),
                u8(self.sizes),
                u8(self.checksums) if self.checked else b"",
                names,
            )
        )


_NO_DIGEST = bytes(32)


@dataclass(frozen=True)
class SampleIndex:
    """The parsed index of one shard (see the module): per sample its span and sha256, per member its
    data offset, size and name."""

    offsets: np.ndarray  # n + 1 sample offsets (int64)
    digests: bytes  # n x 32
    first: np.ndarray  # n + 1 first-member numbers
    data_offsets: np.ndarray  # m
    sizes: np.ndarray  # m
    names: Sequence[str]  # m (:class:`MemberNames`: decoded when read)
    grouped: bool = False  # version 2: no sample spans, no per-sample digests
    checksums: np.ndarray | None = None  # version 3: m member checksums (uint64)
    compressed: bool = False  # offsets in the decompressed tar, no per-sample digests

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def has_digests(self) -> bool:
        """Whether each sample has a span of the stored shard and its sha256 (for ranged reads)."""
        return not self.grouped and not self.compressed

    def span(self, i: int) -> tuple[int, int]:
        """Sample ``i``'s bytes in the tar: (start, end)."""
        if self.grouped:
            raise ValueError("a version 2 index gives no sample spans")
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def sample_name(self, i: int) -> str:
        """Sample ``i`` named for a message: its key from its members' names (where they form one) and
        its position in the shard."""
        try:
            key = IndexedSamples(self, "").sample(i)[0]
        except (CorruptShardError, IndexError):
            key = None
        return sample_name(i, key)

    def check(self, i: int, data: bytes | memoryview, name: str, key: str | None = None) -> None:
        """Raise unless ``data`` are sample ``i``'s bytes as packed (``key``: its key, for the message)."""
        if not self.has_digests:
            raise ValueError("this index holds no per-sample digests")
        if hashlib.sha256(data).digest() != self.digests[32 * i : 32 * i + 32]:
            raise CorruptShardError(
                f"{name}: {sample_name(i, key)}: its bytes differ from its sha256 in the shard's index; the "
                f"shard or its index was replaced or damaged: {_FIX}"
            )

    def samples(self, name: str) -> tuple[list[str], list[dict[str, tuple[int, int]]]]:
        """Keys and per-field (offset, size) of every sample, as ``tar.index_samples`` gives them from the
        tar itself; :class:`CorruptShardError` if the names do not form samples (one key, distinct fields)."""
        read = IndexedSamples(self, name)
        found = [read.sample(i) for i in range(len(self))]
        return [k for k, _ in found], [f for _, f in found]

    def lazy_samples(self, name: str) -> tuple[Sequence[str], Sequence[dict[str, tuple[int, int]]]]:
        """Like :meth:`samples`, as sequences that read a sample's names when it is asked for: opening a
        shard costs no pass over all its samples (the first batch of a shuffled epoch opens many shards
        for a few samples of each); a sample whose names do not form one raises when it is read."""
        return IndexedSamples(self, name).columns()

    def indexed(self, name: str) -> IndexedSamples:
        """Each sample's key and fields together (:meth:`IndexedSamples.sample`), read when asked for, as
        :meth:`lazy_samples` reads them: a reader that wants both parses a sample's names once."""
        return IndexedSamples(self, name)


class MemberNames(Sequence):
    """An index's member names, decoded when one is read (opening a shard decodes none of them): the
    names' bytes, each followed by a NUL, and where each NUL lies."""

    def __init__(self, text: bytes, ends: Sequence[int] | np.ndarray):
        import numpy as np

        self.text = text
        self.stops = np.asarray(ends, dtype=np.int64)  # where each name's NUL lies
        self._ends: list[int] | None = None
        self._begins: np.ndarray | None = None

    @property
    def ends(self) -> list[int]:
        """Where each name's NUL lies, as a list (made when a name is first read one at a time)."""
        if self._ends is None:
            self._ends = self.stops.tolist()
        return self._ends

    @property
    def begins(self) -> np.ndarray:
        """Where each name starts in the names' bytes (an array, for gathering a batch's)."""
        if self._begins is None:
            import numpy as np

            begins = np.empty_like(self.stops)
            begins[:1] = 0
            begins[1:] = self.stops[:-1] + 1
            self._begins = begins
        return self._begins

    def __len__(self) -> int:
        return len(self.stops)

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        ends = self.ends
        end = ends[j]  # IndexError outside
        j %= len(ends)
        start = ends[j - 1] + 1 if j else 0
        return self.text[start:end].decode("utf-8", "surrogateescape")

    def encoded(self) -> list[bytes]:
        """Every name as its bytes in the index (what ``name.encode("utf-8", "surrogateescape")`` gives)."""
        return self.text.split(b"\0")[:-1]

    def run(self, start: int, stop: int) -> list[str]:
        """The names of members ``start:stop`` (``start < stop``), decoded at once."""
        ends = self.ends
        begin = ends[start - 1] + 1 if start else 0
        return self.text[begin : ends[stop - 1]].decode("utf-8", "surrogateescape").split("\0")


class IndexedSamples:
    """Sample ``i``'s key and fields, read from an index's member names when asked for."""

    def __init__(self, index: SampleIndex, name: str):
        self.index, self.name = index, name
        self.first = index.first.tolist()
        self.offsets, self.sizes = index.data_offsets, index.sizes
        names = index.names
        self.run = (
            names.run
            if isinstance(names, MemberNames)
            else lambda start, stop: list(names[start:stop])
        )

    def __len__(self) -> int:
        return len(self.first) - 1

    def columns(self) -> tuple[Sequence[str], Sequence[dict[str, tuple[int, int]]]]:
        """The keys and the fields of the samples, as :meth:`SampleIndex.lazy_samples` gives them."""
        return _Column(self, 0), _Column(self, 1)

    def sample(self, i: int) -> tuple[str, dict[str, tuple[int, int]]]:
        """Sample ``i``'s key and per field its (offset, size); ``i`` in ``range(len(self))``."""
        start, stop = self.first[i], self.first[i + 1]
        # (a sample's few numbers as Python ints: no list of all of them made at open)
        offsets, sizes = self.offsets[start:stop].tolist(), self.sizes[start:stop].tolist()
        return self._entry(i, start, stop, offsets, sizes, 0)

    def _entry(
        self, i: int, start: int, stop: int, offsets: list[int], sizes: list[int], at: int
    ) -> tuple[str, dict[str, tuple[int, int]]]:
        """Sample ``i``'s key and fields from its members ``start:stop``, whose numbers are ``offsets`` and
        ``sizes`` from ``at`` on."""
        key = None
        entry: dict[str, tuple[int, int]] = {}
        for member in self.run(start, stop):
            slash = member.rfind("/") + 1
            dot = member.find(".", slash)
            if dot <= slash or dot == len(member) - 1 or key not in (None, member[:dot]):
                raise CorruptShardError(
                    f"{self.name}: sample {i}'s members in the index do not form one sample "
                    f"({member!r}); {_FIX}"
                )
            key = member[:dot]
            entry[member[dot + 1 :].lower()] = (offsets[at], sizes[at])
            at += 1
        if len(entry) != stop - start:
            raise CorruptShardError(
                f"{self.name}: sample {i} ({key!r}) has a field twice in the index; {_FIX}"
            )
        return key, entry  # type: ignore[return-value]


class _Column(Sequence):
    """The keys (``part`` 0) or the fields (1) of an :class:`IndexedSamples`, as a sequence."""

    def __init__(self, read: IndexedSamples, part: int):
        self.read, self.part = read, part

    def __len__(self) -> int:
        return len(self.read)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} of {n}")
        return self.read.sample(i % n)[self.part]


def parse_index(data: bytes, name: str, samples: int, tar_size: int) -> SampleIndex:
    """Check and parse ``data``, the index of a tar of ``tar_size`` bytes holding ``samples`` samples
    (both from the manifest); :class:`CorruptShardError` naming ``name`` for anything else."""

    import numpy as np

    def bad(what: str) -> CorruptShardError:
        return CorruptShardError(f"{name}: {what}; {_FIX}")

    magic = bytes(data[: len(MAGIC)])
    checked = magic == MAGIC_CHECKED
    if len(data) < _HEAD + 8 * checked or magic not in (MAGIC, MAGIC_GROUPED, MAGIC_CHECKED):
        raise bad("not a shardstream sample index")
    n, m, names_len = struct.unpack_from("<QQQ", data, len(MAGIC))
    flags = struct.unpack_from("<Q", data, _HEAD)[0] if checked else 0
    if flags & ~_FLAGS:
        raise bad(f"it has flags {flags:#x} this version of shardstream does not know; upgrade it")
    grouped = magic == MAGIC_GROUPED or bool(flags & GROUPED)
    if n != samples:
        raise bad(f"it indexes {n} samples, the manifest says the shard has {samples}")
    if m > len(data) or names_len > len(data) or len(data) != index_size(n, m, names_len, checked):
        raise bad(f"{len(data)} bytes, not the size its counts give")
    at = _HEAD + 8 * checked

    def numbers(count: int) -> np.ndarray:
        nonlocal at
        out = np.frombuffer(data, dtype="<u8", count=count, offset=at)
        at += 8 * count
        return out

    offsets = numbers(n + 1)
    digests = bytes(data[at : at + 32 * n])
    at += 32 * n
    first, data_offsets, sizes = numbers(n + 1), numbers(m), numbers(m)
    checksums = numbers(m).astype(np.uint64) if checked else None
    text = bytes(data[at:])
    ends = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 0)
    names = (
        len(ends),
        not text or text[-1] == 0,
    )  # how many, and whether the last ends with its NUL
    if grouped:
        _check_grouped(offsets, first, data_offsets, sizes, names, m, tar_size, bad)
    else:
        _check_spans(offsets, first, data_offsets, sizes, names, m, tar_size, bad)
    return SampleIndex(
        offsets.astype(np.int64),
        digests,
        first.astype(np.int64),
        data_offsets.astype(np.int64),
        sizes.astype(np.int64),
        MemberNames(text, ends),
        grouped=grouped,
        checksums=checksums,
        compressed=bool(flags & COMPRESSED),
    )


def _check_spans(offsets, first, data_offsets, sizes, names, m: int, tar_size: int, bad) -> None:
    """The checks of a version 1 index: samples start at 0 and follow each other in 512-byte blocks, the
    end-of-archive marker after the last, each member's data inside its sample."""
    import numpy as np

    n = len(offsets) - 1
    if (
        offsets[0] != 0
        or (offsets % 512).any()
        or (np.diff(offsets.astype(np.int64)) <= 0).any()
        or int(offsets[-1]) + 1024 > tar_size
    ):
        raise bad("its sample offsets are not increasing 512-byte blocks inside the shard")
    if first[0] != 0 or int(first[-1]) != m or (np.diff(first.astype(np.int64)) <= 0).any():
        raise bad("its member numbers do not give each sample its members")
    if names != (m, True):
        raise bad(f"it names {names[0]} members, not {m}")
    owner = np.repeat(np.arange(n), np.diff(first.astype(np.int64)))  # the sample of each member
    ends = data_offsets + sizes
    if (
        m
        and (
            (data_offsets < offsets[owner] + 512)
            | (ends < data_offsets)
            | (ends > offsets[owner + 1])
        ).any()
    ):
        raise bad("a member's data lies outside its sample")


def _check_grouped(offsets, first, data_offsets, sizes, names, m: int, tar_size: int, bad) -> None:
    """The checks of a version 2 index: members inside the tar's members, each sample some of them."""
    import numpy as np

    end = int(offsets[-1])
    if offsets[:-1].any() or end % 512 or end + 1024 > tar_size:
        raise bad("its end of members is no 512-byte block inside the shard")
    if first[0] != 0 or int(first[-1]) != m or (np.diff(first.astype(np.int64)) <= 0).any():
        raise bad("its member numbers do not give each sample its members")
    if names != (m, True):
        raise bad(f"it names {names[0]} members, not {m}")
    ends = data_offsets + sizes
    if m and ((data_offsets < 512) | (ends < data_offsets) | (ends > end)).any():
        raise bad("a member's data lies outside the tar's members")


def index_bytes(
    buf,
    samples: list[tuple[str, dict[str, tuple[int, int]]]],
    checked: bool = False,
    compressed: bool = False,
) -> bytes:
    """The sample index of the tar ``buf`` (uncompressed) whose samples, as its headers give them, are
    ``samples`` ((key, fields) pairs): see :func:`shardstream.formats.tar.build_index`. Sample ``i`` spans
    from the end of sample ``i - 1``'s last member (0 for the first) to the end of its own last member's
    padding, so what lies between two samples' members (extended headers, folders, members that are no
    sample's) belongs to the sample after it; its sha256 covers that span. Samples that are no such runs
    (members apart, hard links) give a version 2 index (see the module). ``checked``: version 3, with each
    member's checksum of the bytes as they are now (for a tar whose bytes a manifest's sha256 vouches for:
    ``shardstream index``); ``compressed``: ``buf`` is a compressed shard's tar (version 3, no digests)."""
    view = memoryview(buf)
    builder = IndexBuilder(compressed, checked)
    at = 0
    for key, entry in samples:
        members, sums = [], []
        start = cursor = at
        for ext, (offset, size) in entry.items():
            if offset - cursor < 512:  # before the previous member, or no room for a header
                return _grouped_index(view, samples, builder.checked, compressed)
            members.append((f"{key}.{ext}", offset - cursor, size))
            if builder.checked:
                sums.append(checksum(view[offset : offset + size]))
            cursor = offset + size + (-size % 512)
        digest = None if compressed else hashlib.sha256(view[start:cursor]).digest()
        builder.add_hashed(digest, members, sums)
        at = cursor
    return builder.to_bytes()


def _grouped_index(
    view: memoryview,
    samples: list[tuple[str, dict[str, tuple[int, int]]]],
    checked: bool,
    compressed: bool,
) -> bytes:
    """A version 2 index of ``samples`` (see the module); ``checked``: version 3 with the ``GROUPED`` flag
    and each member's checksum."""
    import numpy as np

    first, offsets, sizes, names, sums = [0], [], [], [], []
    for key, entry in samples:
        for ext, (offset, size) in entry.items():
            offsets.append(offset)
            sizes.append(size)
            names.append(f"{key}.{ext}".encode("utf-8", "surrogateescape"))
            if checked:
                sums.append(checksum(view[offset : offset + size]))
        first.append(len(sizes))
    end = max((o + s + (-s % 512) for o, s in zip(offsets, sizes)), default=0)
    n = len(samples)
    text = b"".join(x + b"\0" for x in names)
    u8 = lambda values: np.asarray(values, dtype="<u8").tobytes()  # noqa: E731
    flags = GROUPED | (COMPRESSED if compressed else 0)
    return b"".join(
        (
            MAGIC_CHECKED if checked else MAGIC_GROUPED,
            struct.pack("<QQQ", n, len(sizes), len(text)),
            struct.pack("<Q", flags) if checked else b"",
            u8([0] * n + [end]),
            bytes(32 * n),
            u8(first),
            u8(offsets),
            u8(sizes),
            u8(sums) if checked else b"",
            text,
        )
    )
