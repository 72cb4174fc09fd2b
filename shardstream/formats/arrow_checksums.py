"""Checksums of Arrow record batches: one per column and one per row, so that a changed value is found,
named by its row and its field, and the other rows still read.

A pack writes them into each record batch's custom metadata (key :data:`KEY`), which every Arrow reader
ignores: ``pyarrow.ipc.open_file``, ``pyarrow.feather``, Hugging Face ``datasets`` and pyarrow's
``dataset`` see the same columns as before. ``shardstream index`` writes the same checksums for each row
group of a Parquet file into its row-group index (:mod:`.parquet`). The value is JSON::

    {"version": 1, "hash": "xxh3_64", "columns": ["<16 hex>", ...], "rows": "<base64>"}

``columns``: per column, in the batch's order, :func:`column_checksum`, xxh3_64 over the column's values
in a canonical form (its buffers, offsets made to start at 0, its nulls; a column with nulls through its
values' checksums, since the bytes in a null's slot are whatever its writer left), computed with a few
calls per column whatever its length, which is what a reader computes on every read. ``rows``: per row, the low 32
bits of :func:`row_checksums` (all the row's values mixed), little-endian, which a reader computes only
when a column differs, to find the rows that changed. A value is found by its logical content, so the
checksums hold for any slicing or chunking of the same values.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from ..errors import CorruptShardError
from .checksums import NAME, checksum

KEY = b"shardstream.checksums"
VERSION = 1
_NULL = np.uint64(0x9E3779B97F4A7C15)  # the cell checksum of a null
_ROW_SEED = np.uint64(0x2545F4914F6CDD1D)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise over uint64 (a bijection: any change of ``x`` changes it)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _plain(array: pa.Array) -> pa.Array:
    """``array`` as the kind of array its checksums are computed on: dictionaries decoded, extension types
    as their storage, booleans as bytes."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _plain(array.dictionary_decode())
    if isinstance(kind, pa.ExtensionType):
        return _plain(array.storage)
    if pa.types.is_boolean(kind):
        return array.cast(pa.uint8())
    return array


def _width(kind: pa.DataType) -> int:
    """Bytes per value of a fixed-width type (0: not one)."""
    if (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_temporal(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        bits = getattr(kind, "bit_width", 0)
        return bits // 8 if bits and bits % 8 == 0 else 0
    return 0


def _binary(kind: pa.DataType) -> np.dtype | None:
    """The offsets' dtype of a binary or string type, None for any other."""
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        return np.dtype("<i4")
    if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        return np.dtype("<i8")
    return None


def _values(array: pa.Array, width: int) -> np.ndarray:
    """A fixed-width array's values as an (n, width) uint8 matrix (no copy)."""
    buf = array.buffers()[1]
    n = len(array)
    if buf is None or n == 0:
        return np.zeros((n, width), dtype=np.uint8)
    raw = np.frombuffer(buf, dtype=np.uint8)
    return raw[array.offset * width : (array.offset + n) * width].reshape(n, width)


def _offsets(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """A binary array's n + 1 offsets into its data buffer (absolute, as stored)."""
    n = len(array)
    buf = array.buffers()[1]
    if buf is None:
        return np.zeros(n + 1, dtype=np.int64)
    return np.frombuffer(buf, dtype=dtype)[array.offset : array.offset + n + 1].astype(np.int64)


def _nulls(array: pa.Array) -> np.ndarray | None:
    """Per row whether it is null, or None when none is."""
    if array.null_count == 0:
        return None
    return np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def column_checksum(array: pa.Array | pa.ChunkedArray) -> int:
    """xxh3_64 of one column's values in canonical form (see the module)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    array = _plain(array)
    h = xxhash.xxh3_64()
    nulls = _nulls(array)
    h.update(len(array).to_bytes(8, "little"))
    if nulls is not None:
        h.update(nulls.tobytes())
    width, offsets_type = _width(array.type), _binary(array.type)
    if nulls is not None and not pa.types.is_null(array.type):
        # a null's slot holds whatever its writer left there: through each value's checksum, nulls masked
        h.update(cell_checksums(array).tobytes())
    elif width:
        h.update(np.ascontiguousarray(_values(array, width)))
    elif offsets_type is not None:
        offsets = _offsets(array, offsets_type)
        h.update((offsets - offsets[0]).tobytes())
        data = array.buffers()[2]
        if data is not None and len(array):
            h.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
    elif pa.types.is_null(array.type):
        pass
    else:  # nested and other kinds: through each value's checksum
        h.update(cell_checksums(array).tobytes())
    return h.intdigest()


def cell_checksums(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row, a uint64 checksum of the value (``_NULL`` for a null), for any type."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    array = _plain(array)
    n, kind = len(array), array.type
    width, offsets_type = _width(kind), _binary(kind)
    if width:
        cells = _fixed_cells(_values(array, width))
    elif offsets_type is not None:
        cells = _binary_cells(array, offsets_type)
    elif pa.types.is_null(kind):
        return np.full(n, _NULL, dtype=np.uint64)
    elif pa.types.is_struct(kind):
        cells = np.full(n, np.uint64(kind.num_fields), dtype=np.uint64)
        for i in range(kind.num_fields):
            cells = cells * _PRIME + cell_checksums(array.field(i))
        cells = _mix(cells)
    elif pa.types.is_fixed_size_list(kind):
        size = kind.list_size
        child = cell_checksums(array.values)[array.offset * size : (array.offset + n) * size]
        cells = _fixed_cells(child.reshape(n, size).view(np.uint8).reshape(n, 8 * size))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        child = memoryview(cell_checksums(array.values).tobytes())
        bounds = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64) * 8
        cells = np.fromiter(
            (checksum(child[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())),
            dtype=np.uint64,
            count=n,
        )
    else:  # anything else: each value's text (slow, and rare)
        cells = np.fromiter(
            (checksum(repr(v.as_py()).encode()) for v in array), dtype=np.uint64, count=n
        )
    nulls = _nulls(array)
    return cells if nulls is None else np.where(nulls, _NULL, cells)


def _fixed_cells(values: np.ndarray) -> np.ndarray:
    """Per row of an (n, width) uint8 matrix, a uint64 that any change of the row's bytes changes: the value
    itself for widths up to 8 bytes, else its 8-byte words combined."""
    n, width = values.shape
    if width in (1, 2, 4, 8):
        return np.ascontiguousarray(values).view(f"<u{width}").reshape(n).astype(np.uint64)
    lanes = -(-width // 8)
    if width != 8 * lanes:
        padded = np.zeros((n, 8 * lanes), dtype=np.uint8)
        padded[:, :width] = values
        values = padded
    words = np.ascontiguousarray(values).view("<u8").reshape(n, lanes)
    cells = np.zeros(n, dtype=np.uint64)
    for k in range(lanes):
        cells = cells * _PRIME + words[:, k]
    return _mix(cells)


_PRIME = np.uint64(0x100000001B3)  # odd: a multiplication by it (mod 2^64) can be undone
_PRIME_INVERSE = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_SMALL = 256  # mean bytes per value under which a binary column is hashed all at once (numpy)
_CHUNK = 1 << 20  # bytes of values hashed at once that way
_POWERS: tuple[np.ndarray, np.ndarray] | None = None  # _PRIME ** j and its inverse's, j < _CHUNK
_POWERS_LOCK = threading.Lock()  # packs and readers compute checksums in several threads at once


def _powers() -> tuple[np.ndarray, np.ndarray]:
    """The tables of :func:`_polynomial`, made once per process (both at once, under a lock: a thread
    never sees half of them)."""
    global _POWERS
    if _POWERS is None:
        with _POWERS_LOCK:
            if _POWERS is None:
                made = []
                for base in (_PRIME, _PRIME_INVERSE):
                    steps = np.full(_CHUNK, base, dtype=np.uint64)
                    steps[0] = 1
                    made.append(np.cumprod(steps, dtype=np.uint64))
                _POWERS = (made[0], made[1])
    return _POWERS


def _binary_cells(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """Per value of a binary or string array, a uint64 of its bytes: xxh3_64 of each for values of
    :data:`_SMALL` bytes or more on average, else a polynomial of its bytes (sum of byte x prime^position,
    mod 2^64, with its length: any one changed byte changes it), all values at once."""
    n = len(array)
    offsets = _offsets(array, dtype)
    data = array.buffers()[2]
    view = memoryview(data) if data is not None else memoryview(b"")
    if n == 0 or int(offsets[-1] - offsets[0]) >= _SMALL * n:
        return np.fromiter(
            (checksum(view[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())),
            dtype=np.uint64,
            count=n,
        )
    raw = np.frombuffer(view, dtype=np.uint8) if len(view) else np.zeros(0, np.uint8)
    cells = np.empty(n, dtype=np.uint64)
    row = 0
    while row < n:
        base = int(offsets[row])  # rows row..last, their bytes at most _CHUNK
        last = int(np.searchsorted(offsets, base + _CHUNK, side="right")) - 1
        if last <= row:  # one value longer than a chunk
            cells[row] = checksum(view[base : int(offsets[row + 1])])
            row += 1
            continue
        cells[row:last] = _polynomial(raw, offsets[row : last + 1] - base, base)
        row = last
    return cells ^ (np.diff(offsets).astype(np.uint64) * _ROW_SEED)


def _polynomial(raw: np.ndarray, bounds: np.ndarray, base: int) -> np.ndarray:
    """For the values between ``bounds`` (offsets from ``base`` in ``raw``, under :data:`_CHUNK` bytes in
    all), sum of byte x prime^(its place in the value), mod 2^64."""
    powers, inverse = _powers()
    chunk = raw[base : base + int(bounds[-1])].astype(np.uint64)
    sums = np.zeros(len(chunk) + 1, dtype=np.uint64)
    np.cumsum(chunk * powers[: len(chunk)], dtype=np.uint64, out=sums[1:])
    starts, ends = bounds[:-1], bounds[1:]
    return (sums[ends] - sums[starts]) * inverse[starts]


def row_checksums(batch: pa.RecordBatch | pa.Table) -> np.ndarray:
    """Per row, a uint64 of every value of the row (columns in order): their cells combined, then mixed."""
    rows = np.full(batch.num_rows, _ROW_SEED, dtype=np.uint64)
    for column in batch.columns:
        rows = rows * _PRIME + cell_checksums(column)
    return _mix(rows)


def batch_metadata(batch: pa.RecordBatch | pa.Table) -> dict[bytes, bytes]:
    """The custom metadata that carries ``batch``'s checksums (see the module)."""
    doc = {
        "version": VERSION,
        "hash": NAME,
        "columns": [f"{column_checksum(c):016x}" for c in batch.columns],
        "rows": base64.b64encode(row_checksums(batch).astype("<u4").tobytes()).decode("ascii"),
    }
    return {KEY: json.dumps(doc, separators=(",", ":")).encode()}


def parse_checksums(doc: Any, columns: int, rows: int, where: str) -> tuple[list[int], np.ndarray]:
    """(column checksums, row checksums) from a batch's metadata document ``doc`` (bytes or a parsed dict),
    checked to fit a batch of ``columns`` columns and ``rows`` rows; :class:`CorruptShardError` naming
    ``where`` for anything else."""
    try:
        if isinstance(doc, (bytes, str)):
            doc = json.loads(doc)
        if doc["version"] != VERSION or doc["hash"] != NAME:
            raise ValueError(f"checksums of version {doc['version']!r}, {doc['hash']!r}")
        sums = [int(c, 16) for c in doc["columns"]]
        per_row = np.frombuffer(base64.b64decode(doc["rows"], validate=True), dtype="<u4")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptShardError(
            f"{where}: its checksums do not read ({exc}); the file was damaged or replaced"
        ) from None
    if len(sums) != columns or len(per_row) != rows:
        raise CorruptShardError(
            f"{where}: its checksums are of {len(sums)} columns and {len(per_row)} rows, not "
            f"{columns} and {rows}; the file was damaged or replaced"
        )
    return sums, per_row


def damaged_rows(
    batch: pa.RecordBatch | pa.Table, sums: list[int], per_row: np.ndarray
) -> dict[int, list[str]]:
    """The rows of ``batch`` whose values differ from the checksums ``sums`` (per column) and ``per_row``,
    with the fields that differ: ``{}`` when every column matches. A column that differs where no row does
    (a change no row's checksum shows) makes every row of the batch damaged."""
    names = batch.schema.names
    fields = [names[c] for c, col in enumerate(batch.columns) if column_checksum(col) != sums[c]]
    if not fields:
        return {}
    changed = np.flatnonzero(row_checksums(batch).astype("<u4") != per_row)
    rows = changed.tolist() if len(changed) else range(batch.num_rows)
    return {int(r): fields for r in rows}


__all__ = [
    "KEY",
    "batch_metadata",
    "cell_checksums",
    "column_checksum",
    "damaged_rows",
    "parse_checksums",
    "row_checksums",
]
