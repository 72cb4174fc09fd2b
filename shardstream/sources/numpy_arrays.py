"""NumPy sources: a ``.npy`` file read along axis 0 (memory-mapped), or a folder of them, one field per file.

Each sample ``i`` takes row ``i`` of every array. A row that is one number or string is stored as it is
(field ``name``: the manifest records it as a number or text, so it reads back as one); a row with
dimensions is stored as ``.npy`` bytes (field ``name.npy``), which ``ShardDataset`` decodes back into an
array. The helpers here (sample order, chunks, field values) serve the HDF5 source too.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SourceError
from .table import sample_permutation

CHUNK_BYTES = 8 << 20  # about this many bytes of rows per worker job
MAX_CHUNK = 1024  # rows per job, at most


def field_base(name: str) -> str:
    """A field name from a file stem or an HDF5 path: lower case (tar readers lower-case names), no '/'."""
    return name.strip("/").replace("/", "_").lower()


def field_name(base: str, dtype: np.dtype, row_shape: tuple[int, ...]) -> str:
    """``base`` for rows of one number or string (stored as they are), ``base.npy`` for the others."""
    scalar = not row_shape and dtype.kind in "biufSU"
    return base if scalar else f"{base}.npy"


def check_dtype(dtype: np.dtype, where: str) -> None:
    """Refuse a dtype whose rows cannot be stored without pickling (Python objects)."""
    if dtype.hasobject or dtype.kind not in "biufcSUVMm":
        raise SourceError(
            f"{where} has dtype {dtype}, which holds Python objects or another unsupported type; "
            "store numbers, strings or fixed-size records, or pack it with fn= from Python"
        )


def npy_bytes(row: np.ndarray) -> bytes:
    """A row as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(row), allow_pickle=False)
    return buf.getvalue()


def stored_value(field: str, row: Any) -> Any:
    """The value written for one row of the array behind ``field`` (see :func:`field_name`)."""
    if field.endswith(".npy"):
        return npy_bytes(np.asarray(row))
    return row.item() if isinstance(row, (np.generic, np.ndarray)) else row


def sample_key(index: int) -> str:
    return f"{index:09d}"


def row_chunks(n: int, row_bytes: int, seed: int | None) -> list[Any]:
    """Worker jobs over ``n`` rows: ``(start, stop)`` ranges in order, or with ``seed`` arrays of row
    numbers, in a random order drawn from it (every row once)."""
    size = int(max(1, min(MAX_CHUNK, CHUNK_BYTES // max(row_bytes, 1))))
    if seed is None:
        return [(start, min(start + size, n)) for start in range(0, n, size)]
    order = sample_permutation(n, seed)
    return [order[start : start + size] for start in range(0, n, size)]


def take_rows(array: Any, job: Any) -> tuple[np.ndarray, Any]:
    """(row numbers, rows) of ``array`` (a memory map or an h5py dataset) for one job from :func:`row_chunks`.
    Random rows are read in increasing order (as h5py requires) and given back in the job's order."""
    if isinstance(job, tuple):
        start, stop = job
        return np.arange(start, stop), array[start:stop]
    rows = np.asarray(job)
    ascending = np.sort(rows)
    data = array[ascending]
    return rows, data[np.searchsorted(ascending, rows)]


@dataclass
class NumpySource:
    """``.npy`` arrays of equal length along axis 0: (field, path) per array, sorted by field."""

    root: str
    arrays: list[tuple[str, str]]
    num_samples: int
    row_bytes: int
    layout: str = "numpy"
    classes: None = None

    def sample_jobs(
        self, shuffle_seed: int | None
    ) -> tuple[Callable[[Any], list[dict[str, Any]]], list[Any]]:
        return (
            functools.partial(read_numpy_rows, tuple(self.arrays)),
            row_chunks(self.num_samples, self.row_bytes, shuffle_seed),
        )


_MAPS: dict[
    str, tuple[int, np.ndarray]
] = {}  # path -> (pid, memory map): opened once per worker process


def _open_npy(path: str) -> np.ndarray:
    held = _MAPS.get(path)
    if held is not None and held[0] == os.getpid():
        return held[1]
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SourceError(
            f"cannot read {path}: {' '.join(str(exc).split())}; is it a .npy file of numbers?"
        ) from None
    _MAPS[path] = (os.getpid(), array)
    return array


def read_numpy_rows(arrays: Sequence[tuple[str, str]], job: Any) -> list[dict[str, Any]]:
    """The samples of one job (runs in a worker): the arrays are memory-mapped there, never pickled."""
    rows = None
    columns = []
    for field, path in arrays:
        rows, data = take_rows(_open_npy(path), job)
        columns.append((field, data))
    assert rows is not None
    return [
        {"__key__": sample_key(int(i)), **{f: stored_value(f, d[j]) for f, d in columns}}
        for j, i in enumerate(rows.tolist())
    ]


def _header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from a ``.npy`` file's header, without reading its data."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(f)
    except ValueError as exc:
        raise SourceError(
            f"cannot read {path}: {' '.join(str(exc).split())}; is it a .npy file?"
        ) from None
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if dtype.hasobject:
        raise SourceError(
            f"{path} holds Python objects (dtype {dtype}), which cannot be packed without "
            "pickling; store numbers or strings, or pack it with fn= from Python"
        )
    return tuple(shape), dtype


def open_numpy_source(path: str, fields: Sequence[str] | None = None) -> NumpySource:
    """List a ``.npy`` file, or a folder of them (``fields``: the file names, without ``.npy``, to take)."""
    if os.path.isdir(path):
        names = sorted(
            n for n in os.listdir(path) if n.lower().endswith(".npy") and not n.startswith(".")
        )
        files = [(n[: -len(".npy")], os.path.join(path, n)) for n in names]
    else:
        files = [(os.path.splitext(os.path.basename(path))[0], path)]
    if fields is not None:
        known = {stem for stem, _ in files}
        missing = [f for f in fields if f not in known]
        if missing:
            raise SourceError(
                f"{path}: no array {missing[0]!r} (arrays: {', '.join(sorted(known)) or 'none'}); "
                "fix --fields"
            )
        files = [(stem, p) for stem, p in files if stem in fields]
    if not files:
        raise SourceError(f"{path} holds no .npy files; nothing to pack")
    arrays: list[tuple[str, str]] = []
    lengths: dict[str, int] = {}
    row_bytes = 0
    for stem, file in files:
        shape, dtype = _header(file)
        if not shape:
            raise SourceError(
                f"{file} holds one value (shape ()), not rows along axis 0; save an array of rows"
            )
        check_dtype(dtype, file)
        field = field_name(field_base(stem), dtype, tuple(shape[1:]))
        if any(f == field for f, _ in arrays):
            raise SourceError(
                f"{file} and another file both give field {field!r} (field names are lower case); "
                "rename one of them"
            )
        arrays.append((field, file))
        lengths[os.path.basename(file)] = int(shape[0])
        row_bytes += int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{name}: {n}" for name, n in lengths.items())
        raise SourceError(
            f"{path}: the arrays have different lengths along axis 0 ({detail}); give arrays of "
            "one length (--fields picks some)"
        )
    n = next(iter(lengths.values()))
    if n == 0:
        raise SourceError(f"{path}: the arrays have no rows; nothing to pack")
    return NumpySource(path, sorted(arrays), n, row_bytes)
