"""LMDB sources (extra ``lmdb``): each key/value of an environment is a sample.

The value is stored as raw bytes under one field (``field_name``, default ``bin``), or turned into a
sample dict by ``decode_value(key, value)`` when packing from Python. The sample key comes from the LMDB
key: its UTF-8 text percent-encoded (``quote``, with ``.`` as ``%2E``), so every key gives a distinct,
safe sample key, the same on every run. Keys are listed in LMDB's (sorted) order; the environment is
opened read-only in each worker process, never shared across a fork.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..errors import SourceError
from .table import sample_permutation

CHUNK = 256  # keys per worker job
DEFAULT_FIELD = "bin"


def sample_key(key: bytes) -> str:
    """A safe, distinct sample key for an LMDB key (percent-encoded; '.' too, as tar readers split there)."""
    return quote(key, safe="").replace(".", "%2E")


def _fix(path: str) -> str:
    return f"check that {path} is an LMDB environment (a folder holding data.mdb, or a .mdb file) and readable"


def _open(path: str) -> Any:
    import lmdb

    try:
        return lmdb.open(
            path, readonly=True, lock=False, readahead=False, subdir=os.path.isdir(path), max_dbs=0
        )
    except lmdb.Error as exc:
        raise SourceError(
            f"cannot read LMDB environment {path}: {' '.join(str(exc).split())}; {_fix(path)}"
        ) from None


@dataclass
class LMDBSource:
    """An LMDB environment's keys, in LMDB's order; how values become samples."""

    root: str
    keys: list[bytes]
    field: str = DEFAULT_FIELD
    decode_value: Callable[[bytes, bytes], Any] | None = None
    layout: str = "lmdb"
    classes: None = None

    @property
    def num_samples(self) -> int:
        return len(self.keys)

    def sample_jobs(
        self, shuffle_seed: int | None
    ) -> tuple[Callable[[Any], list[dict[str, Any]]], list[Any]]:
        keys = self.keys
        if shuffle_seed is not None:
            keys = [keys[i] for i in sample_permutation(len(keys), shuffle_seed).tolist()]
        jobs = [keys[start : start + CHUNK] for start in range(0, len(keys), CHUNK)]
        return functools.partial(read_lmdb_values, self.root, self.field, self.decode_value), jobs


def read_lmdb_values(
    path: str, field: str, decode_value: Callable[[bytes, bytes], Any] | None, keys: list[bytes]
) -> list[dict[str, Any]]:
    """The samples of one job's keys (runs in a worker). The environment is opened for the job and closed
    after it: py-lmdb refuses a second open of one environment in a process, and forbids sharing one across
    a fork, so none stays open in a process that may fork workers."""
    import lmdb

    env = _open(path)
    samples = []
    try:
        with env.begin(buffers=False) as txn:
            for key in keys:
                value = txn.get(key)
                if value is None:
                    raise SourceError(
                        f"{path}: key {key!r} was removed while packing; pack a copy that nobody "
                        "writes to"
                    )
                samples.append(_sample(path, key, value, field, decode_value))
    except lmdb.Error as exc:
        raise SourceError(
            f"cannot read LMDB environment {path}: {' '.join(str(exc).split())}; {_fix(path)}"
        ) from None
    finally:
        env.close()
    return samples


def _sample(
    path: str,
    key: bytes,
    value: bytes,
    field: str,
    decode_value: Callable[[bytes, bytes], Any] | None,
) -> dict[str, Any]:
    if decode_value is None:
        return {"__key__": sample_key(key), field: value}
    try:
        out = decode_value(key, value)
    except Exception as exc:  # the user's decoder
        raise SourceError(
            f"{path}: decode_value failed on key {key!r}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())}; fix the decoder or the value"
        ) from None
    if not isinstance(out, Mapping):
        raise SourceError(
            f"{path}: decode_value gave a {type(out).__name__} for key {key!r}, not a dict of fields "
            "like {'jpg': data, 'cls': 3}"
        )
    return {"__key__": sample_key(key), **out}


def open_lmdb_source(
    path: str,
    field_name: str | None = None,
    decode_value: Callable[[bytes, bytes], Any] | None = None,
) -> LMDBSource:
    """List the keys of the LMDB environment at ``path`` (a folder with ``data.mdb``, or a ``.mdb`` file)."""
    import lmdb

    field = field_name or DEFAULT_FIELD
    if decode_value is not None and field_name is not None:
        raise SourceError(
            "give field_name (--field-name) or decode_value, not both: decode_value names the fields"
        )
    if not field or "/" in field or field.startswith("_"):
        raise SourceError(f"--field-name {field!r} is not a field name; give e.g. 'bin' or 'jpg'")
    env = _open(path)
    try:
        with env.begin() as txn:
            keys = list(txn.cursor().iternext(keys=True, values=False))
    except lmdb.Error as exc:
        raise SourceError(
            f"cannot read LMDB environment {path}: {' '.join(str(exc).split())}; {_fix(path)}"
        ) from None
    finally:
        env.close()  # never inherited by the worker processes
    if not keys:
        raise SourceError(f"LMDB environment {path} holds no keys; nothing to pack")
    return LMDBSource(path, keys, field, decode_value)
