"""A tar shard checked against its sample index, so that reading through the index never returns what the
tar's own headers would refuse or place differently.

A sample index (:mod:`.tar_index`) lets a reader find samples without parsing the tar's headers; its own
sha256 is in the manifest, but the tar's is checked only on request (it costs a hash of the whole
shard). A tar that was damaged, truncated or replaced after packing (the same samples in another order,
say) would then be read through an index that no longer describes it: another sample's bytes under a
key, where the header parse would have given the right ones, or named the damage. :func:`check_index`
reads each indexed member's own 512-byte header, at the offset the index gives, all at once with numpy:
its checksum, its type, its size and number fields, its name, the members following each other with
nothing between them, and a clean end-of-archive marker after the last. When every header is a plain
ustar header that says what the index says, the index describes the tar exactly as the header parse
would. Anything else (a member with extended headers or a name longer than 100 bytes, number fields
another writer laid out otherwise, a mismatch) goes to the header parse itself, which accepts the tar
only if its samples are the index's, and otherwise raises its own error. No I/O: the caller decides how
often (a reader does it once per host for each version of a shard file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CorruptShardError
from . import tar as tar_format
from .tar_index import MemberNames, SampleIndex

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

BLOCK = 512
_FIX = "the shard or its index was replaced or damaged after packing: re-pack the dataset (or re-create its index files)"
# the number fields the header parse reads, as ustar writers lay them out: mode, uid and gid (7 octal
# digits), size and mtime (11), each ending in NUL or space (bytes 100-147); then the two device numbers
# (7 digits, or all NUL: bytes 329-344)
_DIGIT_AT = [i % 8 != 7 for i in range(24)] + [i % 12 != 11 for i in range(24)]
_DEVICE_DIGIT_AT = [i != 7 for i in range(8)]


def check_index(data, index: SampleIndex, name: str) -> None:
    """Raise :class:`CorruptShardError` naming ``name`` unless the tar ``data`` (bytes or a memory map)
    holds, header for header, the members ``index`` (already checked by ``parse_index``) says it does."""
    if not _plain_match(data, index):
        _careful_match(data, index, name)


def _plain_match(data, index: SampleIndex) -> bool:
    """Whether every member lies where the index says, under a plain ustar header that says what the index
    says, one after the other from byte 0 to a clean end-of-archive marker (vectorised; ``False`` when
    anything is otherwise or unusual: the careful path decides)."""
    import numpy as np

    sizes, starts = index.sizes, index.data_offsets
    members = len(sizes)
    if members == 0 or len(data) % BLOCK:
        return False
    heads = starts - BLOCK
    ends = starts + (sizes + BLOCK - 1) // BLOCK * BLOCK  # each member's data, padded
    # one member right after another, each sample starting at its first member's header
    if (
        heads[0] != 0
        or (heads[1:] != ends[:-1]).any()
        or (index.offsets[:-1] != heads[index.first[:-1]]).any()
        or index.offsets[-1] != ends[-1]
    ):
        return False
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(-1, BLOCK)
    last = int(ends[-1]) // BLOCK
    # the end-of-archive marker (two zero blocks at least) and nothing after it
    if len(blocks) - last < 2 or blocks[last:].any():
        return False
    rows = blocks[heads // BLOCK]
    return bool(
        _header_fields_match(rows, sizes)
        and _checksums_match(rows)
        and _names_match(rows, index.names)
    )


def _octal(rows: np.ndarray, start: int, width: int) -> np.ndarray:
    """Per row, the field of ``width - 1`` octal digits then NUL or space; -1 where it is not that."""
    import numpy as np

    digits = rows[:, start : start + width - 1].astype(np.int64) - 48
    plain = ((digits >= 0) & (digits <= 7)).all(axis=1) & np.isin(
        rows[:, start + width - 1], (0, 32)
    )
    return np.where(plain, digits @ (8 ** np.arange(width - 2, -1, -1, dtype=np.int64)), -1)


def _header_fields_match(rows: np.ndarray, sizes: np.ndarray) -> bool:
    """Regular files (type ``0`` or NUL) of the index's sizes, with plain octal number fields."""
    import numpy as np

    if not np.isin(rows[:, 156], (ord("0"), 0)).all():
        return False
    numbers, devices = rows[:, 100:148], rows[:, 329:345].reshape(-1, 2, 8)
    if not _laid_out(numbers, np.array(_DIGIT_AT)).all():
        return False
    if not (_laid_out(devices, np.array(_DEVICE_DIGIT_AT)) | ~devices.any(axis=2)).all():
        return False
    digits = numbers[:, 24:35].astype(np.int64) - 48
    return bool((digits @ (8 ** np.arange(10, -1, -1, dtype=np.int64)) == sizes).all())


def _laid_out(fields: np.ndarray, digit_at: np.ndarray) -> np.ndarray:
    """Per field (the last axis), whether it has octal digits where ``digit_at`` says and NUL or space
    elsewhere."""
    import numpy as np

    digit = (fields >= ord("0")) & (fields <= ord("7"))
    end = (fields == 0) | (fields == ord(" "))
    return np.where(digit_at, digit, end).all(axis=-1)


def _checksums_match(rows: np.ndarray) -> bool:
    """Every header's checksum field (six octal digits, NUL, space, as written) is its unsigned sum."""
    import numpy as np

    actual = rows.sum(axis=1, dtype=np.uint32).astype(np.int64)
    actual -= rows[:, 148:156].sum(axis=1, dtype=np.int64) - 256
    stored = np.where((rows[:, 154] == 0) & (rows[:, 155] == 32), _octal(rows, 148, 7), -1)
    return bool((stored == actual).all())


def _names_match(rows: np.ndarray, names: Sequence[str]) -> bool:
    """Every header's name field is the index's name, NUL-padded, with no ustar prefix."""
    import numpy as np

    encoded = (
        names.encoded()  # the bytes as they are in the index: none decoded
        if isinstance(names, MemberNames)
        else [n.encode("utf-8", "surrogateescape") for n in names]
    )
    if max(map(len, encoded)) > 100 or rows[:, 345].any():
        return False  # prefixes and long names: the careful path joins them as the parser does
    expected = np.frombuffer(b"".join(n.ljust(100, b"\0") for n in encoded), dtype=np.uint8)
    return bool((rows[:, :100] == expected.reshape(-1, 100)).all())


def _careful_match(data, index: SampleIndex, name: str) -> None:
    """The header parse over the whole tar (its errors raised as they are), whose samples must be the index's."""
    keys, fields = tar_format.index_samples(data, name)
    indexed_keys, indexed_fields = index.samples(name)
    if keys == indexed_keys and fields == indexed_fields:
        return
    if len(keys) != len(indexed_keys):
        what = f"the tar holds {len(keys)} samples, its index {len(indexed_keys)}"
    else:
        i = next(
            i
            for i in range(len(keys))
            if keys[i] != indexed_keys[i] or fields[i] != indexed_fields[i]
        )
        # a version 2 index has no sample spans: its first member's header
        start = (
            int(index.data_offsets[index.first[i]]) - BLOCK if index.grouped else index.span(i)[0]
        )
        what = (
            f"sample {i} (at byte {start}) is {keys[i]!r} in the tar, {indexed_keys[i]!r} in its index"
            if keys[i] != indexed_keys[i]
            else f"sample {i} ({keys[i]!r}, at byte {start}) has other fields or offsets in the tar than in its index"
        )
    raise CorruptShardError(
        f"{name}: its tar headers disagree with its sample index ({what}); {_FIX}"
    )


__all__ = ["check_index"]
