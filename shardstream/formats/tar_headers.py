"""The headers of a tar in a buffer, every byte hostile: one pass to a listing of its members.

Two readers of the same rules. :func:`fast_listing` takes the common case (plain ustar or GNU headers of
regular files and folders, no extended headers) in a few numpy passes over the header blocks; it gives
up (``None``) on anything else, and :class:`Scan` walks the headers one by one: PAX and GNU long names,
hard and symbolic links, GNU sparse files (old GNU, PAX 0.0, 0.1 and 1.0), GNU headers whose prefix
field holds access and change times. Each header moves the position forward a block or more; what
readers could read differently is refused with a :class:`CorruptShardError` naming the shard.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from ..errors import CorruptShardError
from .tar_writer import BLOCK, ZERO_BLOCK, padding

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
_DECIMAL = re.compile(rb"[0-9]{1,20}")
_REGULAR = (b"0", b"\0", b"7")
# links, devices, folders, fifos: tarfile skips no data
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
# PAX (X: Solaris), GNU long name / link: about the next member
_EXTENDED = (b"x", b"X", b"g", b"L", b"K")
_GNU_MAGIC = b"ustar  \0"
_POSIX_MAGIC = b"ustar\0"
REDO = "re-create or re-download the shard"
# a sparse member expands to at most this many bytes (a hostile map must not fill the memory)
MAX_SPARSE_SIZE = 1 << 32

# the kinds of entry a listing holds
REGULAR, LINK, SYMLINK, SPARSE = "regular", "link", "symlink", "sparse"


@dataclass
class Sparse:
    """A sparse member: its stored data at ``offset`` in the tar, placed at the file offsets of ``extents``
    ((file offset, bytes) each, in order), holes of zeros between them, ``size`` bytes in all."""

    offset: int
    extents: list[tuple[int, int]]
    size: int

    def expand(self, buf) -> bytes:
        """The member's bytes: its stored pieces at their places, zeros elsewhere."""
        out = bytearray(self.size)
        at = self.offset
        for where, n in self.extents:
            out[where : where + n] = buf[at : at + n]
            at += n
        return bytes(out)


@dataclass
class Listing:
    """The members of a tar that hold a file, in archive order: their ``names``, data ``offsets`` and
    ``sizes``, and for those that are not regular files, by position, (kind, detail): the target of a
    :data:`LINK` or :data:`SYMLINK`, or the :class:`Sparse` map of a :data:`SPARSE` member (whose size is
    its real size)."""

    names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    special: dict[int, tuple[str, object]] = field(default_factory=dict)

    def add(self, entry: tuple[str, str, int, int, object]) -> None:
        kind, name, offset, size, detail = entry
        if kind != REGULAR:
            self.special[len(self.names)] = kind, detail
        self.names.append(name)
        self.offsets.append(offset)
        self.sizes.append(size)


def number(field: bytes, what: str) -> int:
    """A header number field, strictly; GNU base-256 (first byte 0x80, or 0xff: negative) too."""
    if field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        return value if field[0] == 0x80 else value - 256 ** (len(field) - 1)
    if (match := _NUMBER.fullmatch(field)) is None:
        raise ValueError(f"number field {what} {field!r} is not octal")
    return int(match.group(1) or b"0", 8)


def parse_pax(records: bytes) -> tuple[dict[str, bytes], list[tuple[str, bytes]]]:
    """PAX records ``LENGTH KEY=VALUE\\n``, each exactly LENGTH bytes, then NULs (ValueError otherwise):
    the last value of each key, and every record in order (GNU sparse 0.0 repeats its keys)."""
    out: dict[str, bytes] = {}
    seq: list[tuple[str, bytes]] = []
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
            raise ValueError(f"record {len(seq) + 1} does not frame")
        key, eq, value = records[match.end() : end - 1].partition(b"=")
        if not key or not eq:
            raise ValueError(f"record {len(seq) + 1} is not KEY=VALUE")
        text = key.decode("utf-8", "surrogateescape")
        out[text] = value
        seq.append((text, value))
        pos = end
    return out, seq


def has_data(view: memoryview, start: int) -> bool:
    """Whether ``view[start:]`` holds a byte other than NUL (without a copy)."""
    import numpy as np

    return start < len(view) and bool(np.frombuffer(view, dtype=np.uint8, offset=start).any())


def octal_fields(rows, start: int, width: int):
    """Per header row: the value of a field of ``width - 1`` octal digits then NUL or space, else -1."""
    import numpy as np

    digits = rows[:, start : start + width - 1].astype(np.int64) - 48
    last = rows[:, start + width - 1]
    plain = ((digits >= 0) & (digits <= 7)).all(axis=1) & ((last == 0) | (last == 32))
    return np.where(plain, digits @ (8 ** np.arange(width - 2, -1, -1, dtype=np.int64)), -1)


def check_sums(view: memoryview, positions: list[int], name: str, rows=None) -> None:
    """Check the checksums of the headers at ``positions`` (their numpy ``rows`` if at hand) all at once."""
    import numpy as np

    if rows is None:
        rows = np.frombuffer(
            b"".join([view[p : p + BLOCK] for p in positions]), dtype=np.uint8
        ).reshape(-1, BLOCK)
    actual = rows.sum(axis=1, dtype=np.uint32).astype(np.int64)
    actual += 256 - rows[:, 148:156].sum(axis=1, dtype=np.int64)
    # "%06o\0 ", as written by us
    stored = np.where(rows[:, 155] == 32, octal_fields(rows, 148, 7), -1)
    for i in np.flatnonzero(stored != actual).tolist():
        header = bytes(view[positions[i] : positions[i] + BLOCK])
        try:  # other writers' layouts, and the signed sums of old Sun tars, as tarfile takes them
            other: int | None = number(header[148:156], "checksum")
        except ValueError:
            other = None
        if other not in (int(actual[i]), 256 + sum(struct.unpack_from("148b8x356b", header))):
            raise CorruptShardError(
                f"{name}: bad tar header at byte {positions[i]} (checksum {other} != "
                f"{int(actual[i])}); the shard is damaged, {REDO}"
            )


# -- the common case, in numpy ------------------------------------------------------------------------------


def _header_blocks(data, blocks):
    """Block numbers of the headers, found by their magic, when they chain exactly from the first block
    to an end-of-archive marker with nothing after it; None otherwise."""
    import numpy as np

    nblocks = len(blocks)
    heads = np.flatnonzero(blocks[:, 257] == 0x75)  # 'u': a strided look at one byte per block
    if len(heads):
        heads = heads[(blocks[heads, 257:262] == np.frombuffer(b"ustar", np.uint8)).all(axis=1)]
    if len(heads) == 0 or heads[0] != 0:
        return None, None
    rows = blocks[heads]
    sizes = octal_fields(rows, 124, 12)
    following = heads + 1 + (sizes + BLOCK - 1) // BLOCK
    if (sizes < 0).any() or not (following[:-1] == heads[1:]).all():
        return None, None  # odd sizes, a magic inside member data, or a gap: not plain
    end = int(following[-1])
    if end + 2 > nblocks or blocks[end:].any():
        return None, None  # truncated, or something after the members: the careful parser says what
    return heads, rows


def fast_listing(buf, name: str) -> Listing | None:
    """The listing of a tar of plain ustar or GNU headers of regular files and folders, found with numpy;
    None when it has anything else (the careful :class:`Scan` reads it, or says what is wrong)."""
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8)
    nblocks = len(data) // BLOCK
    if nblocks < 3 or len(data) % BLOCK:
        return None
    heads, rows = _header_blocks(data, data.reshape(nblocks, BLOCK))
    if heads is None:
        return None
    sizes = octal_fields(rows, 124, 12)
    kinds = rows[:, 156]
    numbers = [
        (octal_fields(rows, s, w) >= 0) | ~rows[:, s : s + w].any(axis=1)
        for _, s, w in _NUMBER_FIELDS
    ]
    posix = (rows[:, 257:263] == np.frombuffer(_POSIX_MAGIC, dtype=np.uint8)).all(axis=1)
    folders = kinds == ord("5")
    if (
        not np.all(numbers)
        or not ((kinds == ord("0")) | (kinds == 0) | folders).all()
        or (sizes[folders] != 0).any()
        or ((rows[:, 345] != 0) & ~posix).any()
    ):
        # 12-digit or base-256 numbers, other member types, GNU times or a prefix: the careful parser
        return None
    offsets = (heads * BLOCK).tolist()
    check_sums(memoryview(buf), offsets, name, rows)
    raw_names = rows[:, :100].tobytes()
    names = [raw_names[i : i + 100].split(b"\0", 1)[0] for i in range(0, len(raw_names), 100)]
    if rows[:, 345].any():
        prefixes = rows[:, 345:500].tobytes()
        for i in np.flatnonzero(rows[:, 345]).tolist():
            names[i] = prefixes[i * 155 : (i + 1) * 155].split(b"\0", 1)[0] + b"/" + names[i]
    starts = (heads * BLOCK + BLOCK).tolist()
    sizes_list = sizes.tolist()
    if folders.any() or any(n.endswith(b"/") for n in names):
        keep = []
        for i, (n, kind) in enumerate(zip(names, kinds.tolist())):
            if kind != 0x35 and n.endswith(b"/") and (sizes_list[i] or kind):
                return None  # a regular file with a folder's name: the careful parser refuses it
            if kind != 0x35 and not n.endswith(b"/"):
                keep.append(i)  # not a folder (type 5, or old style)
        names = [names[i] for i in keep]
        starts = [starts[i] for i in keep]
        sizes_list = [sizes_list[i] for i in keep]
    # one decode for all the names (none holds a NUL)
    text = b"\0".join(names).decode("utf-8", "surrogateescape").split("\0") if names else []
    return Listing(text, starts, sizes_list)


# -- the careful parser, header by header ----------------------------------------------------------------


class Scan:
    """One pass over a tar's headers: where it is, what the extended headers since the last member say
    about the next one (and which they were), and the headers whose checksums are still to check."""

    def __init__(self, view: memoryview, name: str, check: bool):
        self.view, self.total, self.name, self.check = view, len(view), name, check
        self.pos = 0
        self.ext: dict[str, bytes] = {}
        self.sparse_records: list[tuple[str, bytes]] = []
        self.kinds: list[bytes] = []
        self.unchecked: list[int] = []

    def verify(self) -> None:
        if self.check and self.unchecked:
            check_sums(self.view, self.unchecked, self.name)
        self.unchecked.clear()

    def damaged(self, message: str) -> CorruptShardError:
        self.verify()  # a bad checksum explains a structural error best
        return CorruptShardError(f"{self.name}: {message}; {REDO}")

    def entries(self):
        """Every entry (see :class:`Listing`), then the end of the archive checked."""
        while self.pos + BLOCK <= self.total:
            header = bytes(self.view[self.pos : self.pos + BLOCK])
            if header == ZERO_BLOCK:
                break
            entry = self.member(header)
            if entry is not None:
                yield entry
        self.finish()

    def member(self, header: bytes) -> tuple[str, str, int, int, object] | None:
        """Read the header at :attr:`pos` and move past its member: the entry it is, else None."""
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
        if kind == b"S":
            data += BLOCK * self._old_sparse_blocks(header, pos)
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
            found = self._old_sparse(header, pos, data, size)
        elif kind in _REGULAR and not folder:
            found = self._regular(header, pos, data, size)
        elif kind in (b"1", b"2"):
            found = self._link(header, pos, kind)
        if self.sparse_records and kind not in _EXTENDED and (found is None or found[0] != SPARSE):
            raise self.damaged(f"GNU sparse records before byte {pos} describe no regular file")
        if kind not in _EXTENDED:
            self.ext, self.kinds, self.sparse_records = {}, [], []
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
                    number(header[start : start + width], what)
                size = number(header[124:136], "size")
            if size < 0:
                raise ValueError(f"negative size {size}")
        except ValueError as exc:
            raise self.damaged(f"bad tar header at byte {pos} ({exc})") from None
        return size

    def _extended(self, kind: bytes, pos: int, data: int, size: int, end: int) -> None:
        """Take in a PAX or GNU long-name header, which speaks of the next member."""
        kinds, ext = self.kinds, self.ext
        if kind != b"g" and (
            (b"x" if kind in b"xX" else kind) in kinds
            or kind == b"L"
            and "path" in ext
            or kind == b"K"
            and "linkpath" in ext
        ):
            raise self.damaged(f"extended header at byte {pos} ({kind!r}) repeats one before it")
        if kind in (b"L", b"K"):
            ext["path" if kind == b"L" else "linkpath"] = bytes(self.view[data:end]).split(
                b"\0", 1
            )[0]
            kinds.append(kind)
            return
        try:
            records, seq = parse_pax(bytes(self.view[data : data + size]))
            if has_data(self.view[:end], data + size):
                raise ValueError("bytes after the records")
            if not _DECIMAL.fullmatch(records.get("size", b"0")):
                raise ValueError(f"size {records['size'][:30]!r}")
        except ValueError as exc:
            raise self.damaged(f"bad PAX header at byte {pos} ({exc})") from None
        odd = [k for k in records if kind == b"g" and (k in ("path", "size", "linkpath"))]
        odd += [k for k in records if kind == b"g" and k.startswith("GNU.sparse.")]
        if odd or ("path" in records and "path" in ext and kind != b"g"):
            raise self.damaged(
                f"PAX header at byte {pos} sets {(odd or ['path'])[0]!r}, which readers take "
                "differently"
            )
        if kind != b"g":
            if "linkpath" in records and "linkpath" in ext:
                raise self.damaged(f"PAX header at byte {pos} sets 'linkpath' a second time")
            ext.update(records)
            self.sparse_records += [(k, v) for k, v in seq if k.startswith("GNU.sparse.")]
        kinds.append(b"g" if kind == b"g" else b"x")

    def _name(self, header: bytes, pos: int) -> str:
        """A member's name: from its extended headers, else its header (with a ustar prefix; a GNU header
        holds access and change times there, not a prefix)."""
        raw = self.ext.get("path")
        if raw is None:
            raw = header[:100].split(b"\0", 1)[0]
            prefix = header[345:500].split(b"\0", 1)[0]
            if prefix and header[257:263] == _POSIX_MAGIC:
                raw = prefix + b"/" + raw
            elif prefix and not self._gnu_times(header):
                raise self.damaged(
                    f"member at byte {pos} has a name prefix in a header that is not ustar"
                )
        if raw.endswith(b"/"):
            raise self.damaged(f"regular file at byte {pos} has a folder's name {raw[-40:]!r}")
        return raw.decode("utf-8", "surrogateescape")

    @staticmethod
    def _gnu_times(header: bytes) -> bool:
        """Whether a GNU header's bytes 345-369 are its access and change times (octal numbers)."""
        if header[257:265] != _GNU_MAGIC:
            return False
        try:
            number(header[345:357], "atime")
            number(header[357:369], "ctime")
        except ValueError:
            return False
        return not any(header[369:386]) or header[156:157] == b"S"

    def _regular(self, header: bytes, pos: int, data: int, size: int):
        name = self._name(header, pos)
        if not self.sparse_records:
            return REGULAR, name, data, size, None
        try:
            sparse, name = self._pax_sparse(name, data, size)
        except ValueError as exc:
            raise self.damaged(f"PAX header before byte {pos} sets {exc}") from None
        return SPARSE, name, sparse.offset, sparse.size, sparse

    def _link(self, header: bytes, pos: int, kind: bytes):
        name = self._name(header, pos)
        target = self.ext.get("linkpath")
        if target is None:
            target = header[157:257].split(b"\0", 1)[0]
        return (
            LINK if kind == b"1" else SYMLINK,
            name,
            0,
            0,
            target.decode("utf-8", "surrogateescape"),
        )

    # -- sparse files --------------------------------------------------------------------------------------

    def _old_sparse_blocks(self, header: bytes, pos: int) -> int:
        """How many extension blocks of sparse map follow an old GNU sparse header."""
        if header[257:265] != _GNU_MAGIC:
            raise self.damaged(
                f"member at byte {pos} is a GNU sparse file in a header that is not GNU"
            )
        blocks, more, at = 0, header[482], pos + BLOCK
        while more:
            if at + BLOCK > self.total:
                raise self.damaged(
                    f"truncated at byte {self.total}: the sparse map of byte {pos} is cut"
                )
            if more != 1:
                raise self.damaged(f"sparse header at byte {pos} has a bad extension flag {more}")
            more, blocks, at = self.view[at + 504], blocks + 1, at + BLOCK
        return blocks

    def _old_sparse(self, header: bytes, pos: int, data: int, size: int):
        """An old GNU sparse member: up to 4 map entries in its header, 21 in each extension block."""
        raw = [header[386 + 24 * i : 410 + 24 * i] for i in range(4)]
        for at in range(pos + BLOCK, data, BLOCK):
            block = bytes(self.view[at : at + BLOCK])
            raw += [block[24 * i : 24 * i + 24] for i in range(21)]
        pairs: list[tuple[int, int]] = []
        try:
            for entry in raw:
                if not any(entry):
                    continue
                pairs.append((number(entry[:12], "offset"), number(entry[12:], "numbytes")))
            real = number(header[483:495], "realsize")
            sparse = _sparse(data, pairs, real, size)
        except ValueError as exc:
            raise self.damaged(f"bad sparse map in the header at byte {pos} ({exc})") from None
        if self.sparse_records:
            raise self.damaged(f"member at byte {pos} is sparse twice (PAX and old GNU)")
        return SPARSE, self._name(header, pos), sparse.offset, sparse.size, sparse

    def _pax_sparse(self, name: str, data: int, size: int) -> tuple[Sparse, str]:
        """A PAX GNU sparse member (0.0, 0.1, 1.0): its map and its real name; ValueError if malformed."""
        ext = self.ext
        keys = {k for k, _ in self.sparse_records}
        if "GNU.sparse.name" in ext:
            name = ext["GNU.sparse.name"].decode("utf-8", "surrogateescape")
        if ext.get("GNU.sparse.major") == b"1" and ext.get("GNU.sparse.minor") == b"0":
            if keys - {
                "GNU.sparse.major",
                "GNU.sparse.minor",
                "GNU.sparse.name",
                "GNU.sparse.realsize",
            }:
                raise ValueError(f"{sorted(keys)[0]!r} next to a 1.0 sparse map")
            real = _decimal(ext.get("GNU.sparse.realsize"), "GNU.sparse.realsize")
            numbers, skip = _map_numbers(self.view, data, size)
            return _sparse(data + skip, _pairs(numbers), real, size - skip), name
        if "GNU.sparse.map" in ext:  # 0.1
            if keys - {
                "GNU.sparse.map",
                "GNU.sparse.size",
                "GNU.sparse.numblocks",
                "GNU.sparse.name",
            }:
                raise ValueError(f"{sorted(keys)[0]!r} next to a 0.1 sparse map")
            numbers = [_decimal(x, "GNU.sparse.map") for x in ext["GNU.sparse.map"].split(b",")]
        elif "GNU.sparse.numblocks" in ext:  # 0.0: offset and numbytes records in turn
            seq = [
                (k, v)
                for k, v in self.sparse_records
                if k in ("GNU.sparse.offset", "GNU.sparse.numbytes")
            ]
            if [k for k, _ in seq] != ["GNU.sparse.offset", "GNU.sparse.numbytes"] * (
                len(seq) // 2
            ):
                raise ValueError(
                    "'GNU.sparse.offset' and 'GNU.sparse.numbytes' records out of turn"
                )
            numbers = [_decimal(v, k) for k, v in seq]
            if len(numbers) != 2 * _decimal(ext["GNU.sparse.numblocks"], "GNU.sparse.numblocks"):
                raise ValueError("'GNU.sparse.numblocks' other than the map's length")
        else:
            raise ValueError(f"{sorted(keys)[0]!r} without a sparse map")
        real = _decimal(ext.get("GNU.sparse.size"), "GNU.sparse.size")
        return _sparse(data, _pairs(numbers), real, size), name

    def finish(self) -> None:
        """After the last member: a whole end-of-archive marker and nothing after it, every header checked."""
        pos, total = self.pos, self.total
        if total - pos >= BLOCK:  # the loop met a zero block: the end-of-archive marker
            if self.kinds:
                raise self.damaged(
                    f"the extended header before byte {pos} is followed by no member"
                )
            if has_data(self.view, pos):
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
            if has_data(self.view, pos)
            else f"truncated at byte {total}: the tar has no end-of-archive marker"
            if pos
            else f"only {total} bytes, too short to be a tar"
            if total
            else "empty file, not a tar"
        )


def _decimal(value: bytes | None, what: str) -> int:
    if value is None or not _DECIMAL.fullmatch(value):
        raise ValueError(f"{what!r} to {value[:30] if value else value!r}, not a number")
    return int(value)


def _pairs(numbers: list[int]) -> list[tuple[int, int]]:
    if len(numbers) % 2:
        raise ValueError("a sparse map of an odd count of numbers")
    return list(zip(numbers[::2], numbers[1::2]))


def _map_numbers(view: memoryview, data: int, size: int) -> tuple[list[int], int]:
    """A 1.0 sparse map at the start of a member's data (decimal lines: the count, then the pairs, up to
    a block boundary): its numbers and the bytes it takes."""
    numbers: list[int] = []
    count, at, end = None, data, data + size
    while count is None or len(numbers) < 2 * count:
        stop = bytes(view[at : min(end, at + 21)]).find(b"\n")
        if stop < 0:
            raise ValueError("'GNU.sparse.major' 1 with a sparse map that does not end")
        value = _decimal(bytes(view[at : at + stop]), "the sparse map")
        at += stop + 1
        if count is None:
            count = value
            if 2 * count * 2 > size:
                raise ValueError(
                    f"'GNU.sparse.major' 1 with a map of {count} entries in {size} bytes"
                )
        else:
            numbers.append(value)
    skip = at - data + padding(at - data)
    if skip > size or has_data(view[: data + skip], at):
        raise ValueError("'GNU.sparse.major' 1 with bytes after its sparse map")
    return numbers, skip


def _sparse(data: int, pairs: list[tuple[int, int]], real: int, stored: int) -> Sparse:
    """A checked sparse map: extents in order, apart, inside the real size, holding the stored bytes."""
    if real > MAX_SPARSE_SIZE:
        raise ValueError(f"a real size of {real} bytes, more than {MAX_SPARSE_SIZE} allowed")
    end = 0
    for where, n in pairs:
        if where < end or where + n > real:
            raise ValueError(f"extent ({where}, {n}) overlaps another or ends past {real} bytes")
        end = where + n
    if sum(n for _, n in pairs) != stored:
        raise ValueError(f"extents of {sum(n for _, n in pairs)} bytes for {stored} stored")
    return Sparse(data, pairs, real)


def listing(buf, name: str, check: bool = True) -> Listing:
    """The members of the tar ``buf`` (see :class:`Listing`), by the numpy path when it can."""
    found = fast_listing(buf, name) if check else None
    if found is not None:
        return found
    out = Listing()
    for entry in Scan(memoryview(buf), name, check).entries():
        out.add(entry)
    return out
