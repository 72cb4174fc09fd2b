"""HDF5 sources (``.h5``/``.hdf5``, extra ``hdf5``: h5py): datasets whose first axis is the sample axis.

Every dataset of the file (or those ``fields`` names, by their path in the file) becomes a field; they
must have one length along axis 0. Rows are stored as :mod:`.numpy_arrays` stores them: one number or
string as it is, anything with dimensions as ``.npy`` bytes; variable-length strings as text and
variable-length ``uint8`` (encoded images, say) as raw bytes. The file is opened in each worker process,
never pickled (the classic h5py-with-workers trap): the listing process closes it before any worker starts.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SourceError
from .numpy_arrays import (
    check_dtype,
    field_base,
    field_name,
    npy_bytes,
    row_chunks,
    sample_key,
    take_rows,
)

# how a field's rows are read: "array" (numbers, records: numpy), "text" (strings), "bytes" (vlen uint8)
Column = tuple[str, str, str]  # (field, dataset path, kind)


def _fix(path: str) -> str:
    return f"check that {path} is an HDF5 file (h5dump -H {path}) and readable"


@dataclass
class HDF5Source:
    """One HDF5 file: (field, dataset path, kind) per field, sorted by field, and the rows they share."""

    root: str
    columns: list[Column]
    num_samples: int
    row_bytes: int
    layout: str = "hdf5"
    classes: None = None

    def sample_jobs(
        self, shuffle_seed: int | None
    ) -> tuple[Callable[[Any], list[dict[str, Any]]], list[Any]]:
        return (
            functools.partial(read_hdf5_rows, self.root, tuple(self.columns)),
            row_chunks(self.num_samples, self.row_bytes, shuffle_seed),
        )


_OPEN: dict[str, tuple[int, Any]] = {}  # path -> (pid, h5py.File): one open file per worker process


@contextlib.contextmanager
def _file(path: str) -> Iterator[Any]:
    """The file, open for reading: kept open in a pool worker, closed after use in the process that
    lists sources and forks workers (an h5py file open across a fork is the trap to avoid)."""
    import h5py

    held = _OPEN.get(path)
    if held is not None and held[0] == os.getpid() and held[1].id.valid:
        yield held[1]
        return
    try:
        file = h5py.File(path, "r")
    except OSError as exc:
        raise SourceError(
            f"cannot read HDF5 file {path}: {' '.join(str(exc).split())}; {_fix(path)}"
        ) from None
    if multiprocessing.parent_process() is not None:  # a worker
        _OPEN[path] = (os.getpid(), file)
        yield file
        return
    try:
        yield file
    finally:
        file.close()


def _row(kind: str, field: str, value: Any) -> Any:
    if kind == "text":
        return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)
    if kind == "bytes":
        return np.asarray(value, np.uint8).tobytes()
    if field.endswith(".npy"):
        return npy_bytes(np.asarray(value))
    return value.item() if isinstance(value, (np.generic, np.ndarray)) else value


def read_hdf5_rows(path: str, columns: Sequence[Column], job: Any) -> list[dict[str, Any]]:
    """The samples of one job (runs in a worker, which opens the file itself)."""
    rows = None
    data = []
    with _file(path) as file:
        for field, name, kind in columns:
            try:
                rows, values = take_rows(file[name], job)
            except (OSError, KeyError, ValueError, TypeError) as exc:
                raise SourceError(
                    f"cannot read dataset {name!r} of {path}: {' '.join(str(exc).split())}; "
                    f"{_fix(path)}"
                ) from None
            data.append((field, kind, values))
    assert rows is not None
    return [
        {"__key__": sample_key(int(i)), **{f: _row(k, f, v[j]) for f, k, v in data}}
        for j, i in enumerate(rows.tolist())
    ]


def _column(path: str, name: str, dataset: Any) -> tuple[Column, int]:
    """A dataset's field, and its bytes per row; a :class:`SourceError` for dtypes that cannot be packed."""
    import h5py

    where = f"{path}: dataset {name!r}"
    row_shape = tuple(dataset.shape[1:])
    dtype = dataset.dtype
    base = field_base(name)
    per_row = int(np.prod(row_shape, dtype=np.int64))
    if h5py.check_string_dtype(dtype) is not None:
        if row_shape:
            raise SourceError(
                f"{where} holds arrays of strings per row ({dataset.shape}), which cannot be packed; "
                "store one string per row, or pack it with fn= from Python"
            )
        return (base, name, "text" if dtype.kind == "O" else "array"), 64
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is not None:
        if vlen != np.uint8 or row_shape:
            raise SourceError(
                f"{where} has variable-length rows of {vlen}, which cannot be packed; only "
                "variable-length uint8 (bytes, e.g. encoded images) is supported"
            )
        return (base, name, "bytes"), 4096
    if h5py.check_ref_dtype(dtype) is not None:
        raise SourceError(
            f"{where} holds HDF5 references, which cannot be packed; dereference them first"
        )
    check_dtype(dtype, where)
    return (field_name(base, dtype, row_shape), name, "array"), per_row * dtype.itemsize


def open_hdf5_source(path: str, fields: Sequence[str] | None = None) -> HDF5Source:
    """List the datasets of the HDF5 file ``path`` (``fields``: their paths in the file, to take some)."""
    import h5py

    if os.path.isdir(path):
        raise SourceError(f"{path} is a folder; give one HDF5 file (.h5, .hdf5)")
    found: dict[str, Any] = {}
    try:
        with h5py.File(path, "r") as file:

            def visit(name: str, obj: Any) -> None:  # a value other than None would stop the visit
                if isinstance(obj, h5py.Dataset):
                    found[name] = obj

            file.visititems(visit)
            wanted = _wanted(path, found, fields)
            n = _rows(path, {name: found[name] for name in wanted})
            columns, row_bytes = [], 0
            for name in wanted:
                column, nbytes = _column(path, name, found[name])
                if any(c[0] == column[0] for c in columns):
                    raise SourceError(
                        f"{path}: datasets {name!r} and another both give field {column[0]!r} "
                        "(lower case, '/' as '_'); pick one with --fields"
                    )
                columns.append(column)
                row_bytes += nbytes
    except OSError as exc:
        raise SourceError(
            f"cannot read HDF5 file {path}: {' '.join(str(exc).split())}; {_fix(path)}"
        ) from None
    if n == 0:
        raise SourceError(f"{path}: the datasets have no rows; nothing to pack")
    return HDF5Source(path, sorted(columns), n, row_bytes)


def _wanted(path: str, found: dict[str, Any], fields: Sequence[str] | None) -> list[str]:
    """The datasets to pack: those ``fields`` names (each must exist), else every one with rows."""
    wanted = sorted(found) if fields is None else [f.strip("/") for f in fields]
    missing = [f for f in wanted if f not in found]
    if missing:
        names = ", ".join(sorted(found)) or "none"
        raise SourceError(f"{path}: no dataset {missing[0]!r} (datasets: {names}); fix --fields")
    if fields is None:
        wanted = [
            f for f in wanted if found[f].ndim >= 1
        ]  # one value: an attribute of the file, not rows
    if not wanted:
        raise SourceError(f"{path} holds no datasets with rows (first axis); nothing to pack")
    return wanted


def _rows(path: str, datasets: dict[str, Any]) -> int:
    """Rows along axis 0, which every dataset must have as many of."""
    lengths = {}
    for name, dataset in datasets.items():
        if dataset.ndim == 0:
            raise SourceError(
                f"{path}: dataset {name!r} holds one value, not rows along axis 0; fix --fields"
            )
        lengths[name] = int(dataset.shape[0])
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{n}: {k}" for n, k in lengths.items())
        raise SourceError(
            f"{path}: datasets have different lengths along axis 0 ({detail}); pick datasets "
            "of one length with --fields (fields=)"
        )
    return next(iter(lengths.values()))
