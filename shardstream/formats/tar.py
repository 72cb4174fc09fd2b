"""Tar shards in the WebDataset convention, written and parsed without ``tarfile``.

A sample is a run of consecutive members ``KEY.EXT`` sharing ``KEY`` (the member name
up to the first dot of its base name). Members are plain POSIX ustar entries with
fixed metadata (mode 0644, owner 0, mtime 0), so the same samples always give the
same bytes; a PAX header is added only for a name that ustar cannot hold. The reader
walks headers by offset over a buffer (bytes or a memory map) and hands out slices."""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable, Iterator

from ..errors import CorruptShardError
from .compression import decompress  # noqa: F401 - tar.decompress, as in 0.1
from .tar_index import IndexBuilder
from .tar_writer import (  # noqa: F401 - the writing side, under the names it had here
    BLOCK,
    END_OF_ARCHIVE,
    ZERO_BLOCK,
    TarShardWriter,
    member_header,
    member_size,
    padding,
    sample_size,
)

# -- reading: every byte is hostile. Each header moves forward a block or more (n / 512 headers at most);
# what the reader yields, tarfile reads the same way; what readers could read differently is refused.

_NUMBER = re.compile(rb" *([0-7]*)[ \0]*")  # octal digits between spaces, then spaces or NULs
_NUMBER_FIELDS = (
    ("mode", 100, 8),
    ("uid", 108, 8),
    ("gid", 116, 8),
    ("mtime", 136, 12),
    ("dev", 329, 8),
    ("dev", 337, 8),
)
# mode uid gid size mtime, as written
_USUAL = re.compile(rb"(?:[0-7]{7}[ \0]){3}([0-7]{11})[ \0][0-7]{11}[ \0]")
_DEVICES = re.compile(rb"(?:[0-7]{7}[ \0]|\0{8}){2}")
_PAX_LENGTH = re.compile(rb"([0-9]{1,20}) ")
_PAX_SIZE = re.compile(rb"[0-9]{1,20}")
_REGULAR = (b"0", b"\0", b"7")
# links, devices, folders, fifos: tarfile skips no data
_NO_DATA = (
    b"1",
    b"2",
    b"3",
    b"4",
    b"5",
    b"6",
)
# PAX (X: Solaris), GNU long name / link: about the next member
_EXTENDED = (
    b"x",
    b"X",
    b"g",
    b"L",
    b"K",
)
_REDO = "re-create or re-download the shard"


def _number(field: bytes, what: str) -> int:
    """A header number field, strictly; GNU base-256 (first byte 0x80, or 0xff: negative) too."""
    if field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        return value if field[0] == 0x80 else value - 256 ** (len(field) - 1)
    if (match := _NUMBER.fullmatch(field)) is None:
        raise ValueError(f"number field {what} {field!r} is not octal")
    return int(match.group(1) or b"0", 8)


def _parse_pax(records: bytes) -> dict[str, bytes]:
    """PAX records ``LENGTH KEY=VALUE\\n``, each exactly LENGTH bytes, then NULs (ValueError otherwise)."""
    out: dict[str, bytes] = {}
    records, pos = records.rstrip(b"\0"), 0
    while pos < len(records):
        match = _PAX_LENGTH.match(records, pos)
        end = pos + int(match.group(1)) if match else 0
        if (
            match is None
            or end > len(records)
            or end - 1 <= match.end()
            or records[end - 1] != 0x0A
        ):
            raise ValueError(f"record {len(out) + 1} does not frame")
        key, eq, value = records[match.end() : end - 1].partition(b"=")
        if not key or not eq:
            raise ValueError(f"record {len(out) + 1} is not KEY=VALUE")
        out[key.decode("utf-8", "surrogateescape")] = value
        pos = end
    return out


def _has_data(view: memoryview, start: int) -> bool:
    """Whether ``view[start:]`` holds a byte other than NUL (without a copy)."""
    import numpy as np

    return start < len(view) and bool(np.frombuffer(view, dtype=np.uint8, offset=start).any())


def _octal_fields(rows, start: int, width: int):
    """Per header row: the value of a field of ``width - 1`` octal digits then NUL or space, else -1."""
    import numpy as np

    digits = rows[:, start : start + width - 1].astype(np.int64) - 48
    plain = ((digits >= 0) & (digits <= 7)).all(axis=1) & np.isin(
        rows[:, start + width - 1], (0, 32)
    )
    return np.where(plain, digits @ (8 ** np.arange(width - 2, -1, -1, dtype=np.int64)), -1)


def _check_sums(view: memoryview, positions: list[int], name: str, rows=None) -> None:
    """Check the checksums of the headers at ``positions`` (their numpy ``rows`` if at hand) all at once."""
    import numpy as np

    if rows is None:
        rows = np.frombuffer(
            b"".join([view[p : p + BLOCK] for p in positions]), dtype=np.uint8
        ).reshape(-1, BLOCK)
    actual = rows.sum(axis=1, dtype=np.int64) - rows[:, 148:156].sum(axis=1, dtype=np.int64) + 256
    # "%06o\0 ", as written by us
    stored = np.where(rows[:, 155] == 32, _octal_fields(rows, 148, 7), -1)
    for i in np.flatnonzero(stored != actual).tolist():
        header = bytes(view[positions[i] : positions[i] + BLOCK])
        try:  # other writers' layouts, and the signed sums of old Sun tars, as tarfile takes them
            other: int | None = _number(header[148:156], "checksum")
        except ValueError:
            other = None
        if other not in (int(actual[i]), 256 + sum(struct.unpack_from("148b8x356b", header))):
            raise CorruptShardError(
                f"{name}: bad tar header at byte {positions[i]} (checksum {other} != "
                f"{int(actual[i])}); the shard is damaged, {_REDO}"
            )


def iter_members(buf, name: str = "shard", check: bool = True) -> Iterator[tuple[str, int, int]]:
    """(member name, data offset, data size) of every regular file in the tar ``buf``.

    Raises :class:`CorruptShardError` naming ``name`` and the byte offset for anything but a well-formed
    tar (bad checksums unless ``check=False``, odd numbers, truncation, data after the end, an empty file,
    what readers disagree on). Checksums are checked in batches: a consumer that stops early may have been
    handed members whose header is unchecked; one that reads to the end has had every header checked."""
    scan = _Scan(memoryview(buf), name, check)
    while scan.pos + BLOCK <= scan.total:
        header = bytes(scan.view[scan.pos : scan.pos + BLOCK])
        if header == ZERO_BLOCK:
            break
        member = scan.member(header)
        if member is not None:
            yield member
    scan.finish()


class _Scan:
    """One pass over a tar's headers: where it is, what the extended headers since the last member say
    about the next one (and which they were), and the headers whose checksums are still to check."""

    def __init__(self, view: memoryview, name: str, check: bool):
        self.view, self.total, self.name, self.check = view, len(view), name, check
        self.pos = 0
        self.ext: dict[str, bytes] = {}
        self.kinds: list[bytes] = []
        self.unchecked: list[int] = []

    def verify(self) -> None:
        if self.check and self.unchecked:
            _check_sums(self.view, self.unchecked, self.name)
        self.unchecked.clear()

    def damaged(self, message: str) -> CorruptShardError:
        self.verify()  # a bad checksum explains a structural error best
        return CorruptShardError(f"{self.name}: {message}; {_REDO}")

    def member(self, header: bytes) -> tuple[str, int, int] | None:
        """Read the header at :attr:`pos` and move past its member: the regular file it is, else None."""
        pos = self.pos
        self.unchecked.append(pos)
        if len(self.unchecked) >= 1024:
            self.verify()
        kind = header[156:157]
        size = self._size(header, pos)
        size = int(self.ext["size"]) if kind not in _EXTENDED and "size" in self.ext else size
        # a folder, old style
        folder = kind == b"\0" and header[:100].split(b"\0", 1)[0].endswith(b"/")
        if size and (kind in _NO_DATA or folder):
            raise self.damaged(
                f"member at byte {pos} of type {kind!r} has {size} bytes of data, which readers skip"
            )
        if (
            folder
            and self.kinds
            or kind == b"5"
            and b"L" in self.kinds
            and not self.ext["path"].endswith(b"/")
        ):
            raise self.damaged(
                f"member at byte {pos} is a folder to some readers only (type {kind!r}, extended)"
            )
        data = pos + BLOCK
        if size > self.total - data:
            raise self.damaged(
                f"truncated at byte {self.total}: member at byte {pos} needs {size} bytes "
                f"but only {self.total - data} remain"
            )
        end = data + size + padding(size)
        found = None
        if kind in _EXTENDED:
            self._extended(kind, pos, data, size, end)
        elif kind == b"S":
            raise self.damaged(
                f"member at byte {pos} is a GNU sparse file, which a shard cannot hold"
            )
        elif kind in _REGULAR and not folder:
            found = self._name(header, pos), data, size
        if kind not in _EXTENDED:
            self.ext, self.kinds = {}, []
        self.pos = end
        return found

    def _size(self, header: bytes, pos: int) -> int:
        """The header's size field, its other number fields checked as tarfile reads them."""
        try:
            if (usual := _USUAL.fullmatch(header, 100, 148)) and _DEVICES.fullmatch(
                header, 329, 345
            ):
                size = int(usual.group(1), 8)
            else:
                for (
                    what,
                    start,
                    width,
                ) in _NUMBER_FIELDS:  # unused, but tarfile stops at one it cannot parse
                    _number(header[start : start + width], what)
                size = _number(header[124:136], "size")
            if size < 0:
                raise ValueError(f"negative size {size}")
        except ValueError as exc:
            raise self.damaged(f"bad tar header at byte {pos} ({exc})") from None
        return size

    def _extended(self, kind: bytes, pos: int, data: int, size: int, end: int) -> None:
        """Take in a PAX or GNU long-name header, which speaks of the next member."""
        kinds, ext = self.kinds, self.ext
        if kind != b"g" and (
            (b"x" if kind in b"xX" else kind) in kinds or kind == b"L" and "path" in ext
        ):
            raise self.damaged(f"extended header at byte {pos} ({kind!r}) repeats one before it")
        if kind in (b"L", b"K"):
            ext.update(
                {"path": bytes(self.view[data:end]).split(b"\0", 1)[0]} if kind == b"L" else {}
            )
            kinds.append(kind)
            return
        try:
            records = _parse_pax(bytes(self.view[data : data + size]))
            if _has_data(self.view[:end], data + size):
                raise ValueError("bytes after the records")
            if not _PAX_SIZE.fullmatch(records.get("size", b"0")):
                raise ValueError(f"size {records['size'][:30]!r}")
        except ValueError as exc:
            raise self.damaged(f"bad PAX header at byte {pos} ({exc})") from None
        odd = [
            k
            for k in records
            if k.startswith("GNU.sparse.") or (kind == b"g" and k in ("path", "size"))
        ]
        if odd or ("path" in records and "path" in ext and kind != b"g"):
            raise self.damaged(
                f"PAX header at byte {pos} sets {(odd or ['path'])[0]!r}, which readers take "
                "differently"
            )
        if kind != b"g":
            ext.update(records)
        kinds.append(b"g" if kind == b"g" else b"x")

    def _name(self, header: bytes, pos: int) -> str:
        """A regular file's name: from its extended headers, else its header (with a ustar prefix)."""
        raw = self.ext.get("path")
        if raw is None:
            raw = header[:100].split(b"\0", 1)[0]
            prefix = header[345:500].split(b"\0", 1)[0]
            if prefix and header[257:263] != b"ustar\0":
                raise self.damaged(
                    f"member at byte {pos} has a name prefix in a header that is not ustar"
                )
            raw = prefix + b"/" + raw if prefix else raw
        if raw.endswith(b"/"):
            raise self.damaged(f"regular file at byte {pos} has a folder's name {raw[-40:]!r}")
        return raw.decode("utf-8", "surrogateescape")

    def finish(self) -> None:
        """After the last member: a whole end-of-archive marker and nothing after it, every header checked."""
        pos, total = self.pos, self.total
        if total - pos >= BLOCK:  # the loop met a zero block: the end-of-archive marker
            if self.kinds:
                raise self.damaged(
                    f"the extended header before byte {pos} is followed by no member"
                )
            if _has_data(self.view, pos):
                raise self.damaged(
                    f"data after the end-of-archive marker at byte {pos} (a zeroed header, or tars "
                    "joined)"
                )
            if total - pos < 2 * BLOCK:
                raise self.damaged(
                    f"truncated at byte {total}: the end-of-archive marker at byte {pos} is cut"
                    if pos
                    else f"only {total} bytes, too short to be a tar"
                )
            self.verify()
            return
        raise self.damaged(
            f"truncated tar header at byte {pos}"
            if _has_data(self.view, pos)
            else f"truncated at byte {total}: the tar has no end-of-archive marker"
            if pos
            else f"only {total} bytes, too short to be a tar"
            if total
            else "empty file, not a tar"
        )


def split_name(member: str) -> tuple[str, str] | None:
    """(key, lower-cased extension) of a member name, as WebDataset splits it; None without an extension."""
    slash = member.rfind("/") + 1
    dot = member.find(".", slash)
    if dot <= slash or dot == len(member) - 1:
        return None
    return member[:dot], member[dot + 1 :].lower()


def _group(
    members: Iterable[tuple[str, int, int]], name: str, unkeyed: list[str] | None
) -> Iterator[tuple[str, dict[str, tuple[int, int]]]]:
    key: str | None = None
    fields: dict[str, tuple[int, int]] = {}
    for member, offset, size in members:
        parts = split_name(member)
        if parts is None:
            if unkeyed is not None:
                unkeyed.append(member)
            continue
        k, ext = parts
        if k != key:
            if key is not None:
                yield key, fields
            key, fields = k, {}
        elif ext in fields:
            raise CorruptShardError(f"{name}: sample {key!r} has the member {member!r} twice")
        fields[ext] = (offset, size)
    if key is not None:
        yield key, fields


def iter_samples(
    buf, name: str = "shard", check: bool = True, unkeyed: list[str] | None = None
) -> Iterator[tuple[str, dict[str, tuple[int, int]]]]:
    """(key, {extension: (offset, size)}) for each sample of the tar ``buf``, in order. Members
    without ``KEY.EXT`` form are skipped and, when ``unkeyed`` is given, appended to it."""
    return _group(iter_members(buf, name, check), name, unkeyed)


def _index_plain(buf, name: str) -> tuple[list[str], list[int], list[int]] | None:
    """(names, data offsets, sizes) of a tar of plain ustar regular files, found with numpy; None when it
    has anything else. Headers are found by their magic and accepted only if they chain exactly from the
    first block to an end-of-archive marker with nothing after it."""
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    nblocks = len(data) // BLOCK
    if nblocks < 3 or len(data) % BLOCK:
        return None
    blocks = data.reshape(nblocks, BLOCK)
    heads = np.flatnonzero(
        (blocks[:, 257:262] == np.frombuffer(b"ustar", dtype=np.uint8)).all(axis=1)
    )
    if len(heads) == 0 or heads[0] != 0:
        return None
    rows = blocks[heads]
    sizes = _octal_fields(rows, 124, 12)
    numbers = [
        (_octal_fields(rows, s, w) >= 0) | ~rows[:, s : s + w].any(axis=1)
        for _, s, w in _NUMBER_FIELDS
    ]
    posix = (rows[:, 257:263] == np.frombuffer(b"ustar\0", dtype=np.uint8)).all(axis=1)
    if (
        (sizes < 0).any()
        or not np.all(numbers)
        or not np.isin(rows[:, 156], (ord("0"), 0)).all()
        or ((rows[:, 345] != 0) & ~posix).any()
    ):
        return None  # 12-digit or base-256 numbers, other member types, GNU headers with a prefix: the careful parser
    following = heads + 1 + (sizes + BLOCK - 1) // BLOCK
    if not (following[:-1] == heads[1:]).all():  # a magic inside member data, or a gap: not plain
        return None
    end = int(following[-1])
    if end + 2 > nblocks or blocks[end:].any():
        return None  # truncated, or something after the members: the careful parser says what
    offsets = (heads * BLOCK).tolist()
    _check_sums(memoryview(buf), offsets, name, rows)
    raw_names = rows[:, :100].tobytes()
    names = [raw_names[i : i + 100].split(b"\0", 1)[0] for i in range(0, len(raw_names), 100)]
    if rows[:, 345].any():
        prefixes = rows[:, 345:500].tobytes()
        for i in np.flatnonzero(rows[:, 345]).tolist():
            names[i] = prefixes[i * 155 : (i + 1) * 155].split(b"\0", 1)[0] + b"/" + names[i]
    if any(n.endswith(b"/") for n in names):
        return None  # folders, old style
    return (
        [n.decode("utf-8", "surrogateescape") for n in names],
        [o + BLOCK for o in offsets],
        sizes.tolist(),
    )


def index_samples(buf, name: str = "shard") -> tuple[list[str], list[dict[str, tuple[int, int]]]]:
    """Keys and per-field (offset, size) of every sample, as :func:`iter_samples` gives them,
    by the numpy fast path when the tar allows it."""
    plain = _index_plain(buf, name)
    found = list(iter_samples(buf, name) if plain is None else _group(zip(*plain), name, None))
    return [k for k, _ in found], [f for _, f in found]


def build_index(
    buf, name: str, samples: list[tuple[str, dict[str, tuple[int, int]]]] | None = None
) -> bytes:
    """The sample index of the tar ``buf`` (uncompressed), from its own headers parsed strictly: for a tar
    packed without one (another tool's, or ``--no-index``). Sample ``i`` spans from the end of sample
    ``i - 1``'s last member (0 for the first) to the end of its own last member's padding, so what lies
    between two samples' members (extended headers, folders, members that are no sample's) belongs to
    the sample after it; its sha256 covers that span. ``samples``: the tar's (key, fields) as
    :func:`iter_samples` gave them, if the caller parsed it already."""
    view = memoryview(buf)
    if samples is None:
        samples = list(zip(*index_samples(buf, name)))
    builder = IndexBuilder()
    at = 0
    for key, entry in samples:
        members = []
        start = cursor = at
        for ext, (offset, size) in entry.items():
            members.append((f"{key}.{ext}", offset - cursor, size))
            cursor = offset + size + (-size % 512)
        builder.add_hashed(hashlib.sha256(view[start:cursor]).digest(), members)
        at = cursor
    return builder.to_bytes()
