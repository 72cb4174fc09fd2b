"""The shard table of a large manifest: its per-shard columns in one Arrow IPC file beside the head.

Above a threshold of shards (:data:`TABLE_THRESHOLD`), ``_manifest.json`` keeps only its small,
readable head, and names ``.shardstream/shards-<16 hex of the table's sha256>.arrow`` (datasets written
before: ``_shards-<16 hex>.arrow`` beside the head): columns ``path``
(string), ``samples`` and ``bytes`` (int64), ``sha256`` and, when present, ``index_sha256``
(fixed_size_binary(32), null for none), zstd-compressed. The table is untrusted input: its sha256 is
checked against the head's before it is parsed, and the manifest's schema checks apply to its columns.
Checksums stay 32-byte binaries in memory (:class:`HexColumn`) and are hexed only when read.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

TABLE_THRESHOLD = 10_000  # shards; from here on the columns go to a table
TABLE_PREFIX, TABLE_SUFFIX = "shards-", ".arrow"
# where the table is: .shardstream/shards-<16 hex>.arrow (manifest format 4), _shards-<16 hex>.arrow before
_TABLE_NAME = re.compile(r"^(?:\.shardstream/|_)shards-([0-9a-f]{16})\.arrow$")
# in a path: a shard's number (shard-000000-<run token>.tar: the first one)
_NUMBER = re.compile(r"[0-9]+")


class HexColumn(Sequence[str]):
    """Checksums held as ``n`` 32-byte digests (all-zero where ``valid`` is False: none, ``""``),
    read as a list of lower-case hex strings: ``col[i]``, ``len``, iteration, ``==`` a list."""

    def __init__(self, digests: bytes | memoryview, valid: np.ndarray):
        self.digests, self.valid = digests, valid

    def __reduce__(self) -> tuple[Any, ...]:  # to workers: a memoryview does not pickle
        return HexColumn, (bytes(self.digests), self.valid)

    def __len__(self) -> int:
        return len(self.valid)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"shard {i} is out of range: the manifest lists {n} shards")
        i %= n
        return self.digests[32 * i : 32 * i + 32].hex() if self.valid[i] else ""

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """All checksums as a plain list (hexes them all: about 0.3 s for 10^6)."""
        h = self.digests.hex()
        return [h[64 * i : 64 * i + 64] if ok else "" for i, ok in enumerate(self.valid.tolist())]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HexColumn):
            return self.digests == other.digests and bool((self.valid == other.valid).all())
        return (
            isinstance(other, (list, tuple))
            and len(other) == len(self)
            and self.tolist() == list(other)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HexColumn({len(self)} checksums)"


def _digests(column: Sequence[str]) -> tuple[Any, np.ndarray]:
    """(32-byte binaries, validity) of a checked hex column, for the Arrow table."""
    if isinstance(column, HexColumn):
        return column.digests, column.valid
    valid = np.fromiter(map(bool, column), bool, len(column))
    return bytes.fromhex("".join(d or "0" * 64 for d in column)), valid


def _binary_array(column: Sequence[str]) -> Any:
    import pyarrow as pa

    digests, valid = _digests(column)
    mask = (
        pa.py_buffer(np.packbits(valid, bitorder="little").tobytes()) if not valid.all() else None
    )
    return pa.Array.from_buffers(
        pa.binary(32), len(valid), [mask, pa.py_buffer(digests)], null_count=int((~valid).sum())
    )


def encode_table(
    paths: list[str],
    samples: np.ndarray,
    nbytes: np.ndarray,
    sha256: Sequence[str],
    index_sha256: Sequence[str] | None,
) -> bytes:
    """The Arrow IPC file of a manifest's (checked) shard columns."""
    import pyarrow as pa

    pattern = path_pattern(paths)
    columns = {} if pattern else {"path": pa.array(paths, pa.string())}
    columns |= {
        "samples": pa.array(samples, pa.int64()),
        "bytes": pa.array(nbytes, pa.int64()),
        "sha256": _binary_array(sha256),
    }
    if index_sha256 is not None:
        columns["index_sha256"] = _binary_array(index_sha256)
    table = pa.table(columns, metadata={"path_pattern": json.dumps(pattern)} if pattern else None)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=max(1, len(paths)))
    return sink.getvalue().to_pybytes()


def path_pattern(paths: list[str]) -> dict[str, Any] | None:
    """``{prefix, width, start, suffix}`` if ``paths`` are ``prefix + f"{start + i:0{width}d}" + suffix``
    (as packs name shards, the run's token in the suffix): stored instead of a path column, a few bytes for
    any number of shards."""
    # which number counts: the first that does
    for number in _NUMBER.finditer(paths[0] if paths else ""):
        prefix, digits, suffix = (
            paths[0][: number.start()],
            number.group(),
            paths[0][number.end() :],
        )
        pattern = {"prefix": prefix, "width": len(digits), "start": int(digits), "suffix": suffix}
        if len(str(pattern["start"] + len(paths) - 1)) > len(digits) or paths[-1] != _pattern_path(
            pattern, len(paths) - 1
        ):
            continue
        if expand_pattern(pattern, len(paths)) == paths:
            return pattern
    return None


def _pattern_path(pattern: dict[str, Any], i: int) -> str:
    return f"{pattern['prefix']}{pattern['start'] + i:0{pattern['width']}d}{pattern['suffix']}"


def expand_pattern(pattern: Any, n: int) -> list[str] | None:
    """The ``n`` paths of a :func:`path_pattern` (None if it is not one), built with numpy."""
    fine = (
        isinstance(pattern, dict)
        and set(pattern) == {"prefix", "width", "start", "suffix"}
        and isinstance(pattern["prefix"], str)
        and isinstance(pattern["suffix"], str)
        and type(pattern["width"]) is int
        and type(pattern["start"]) is int
        and 1 <= pattern["width"] <= 18
        and pattern["start"] >= 0
        and n >= 0
    )
    if not fine or "\n" in pattern["prefix"] + pattern["suffix"]:
        return None
    if n == 0:
        return []
    width = pattern["width"]
    if len(str(pattern["start"] + n - 1)) > width:
        return None
    try:
        prefix, suffix = (
            np.frombuffer(pattern[k].encode(), np.uint8) for k in ("prefix", "suffix")
        )
    except UnicodeEncodeError:
        return None
    import pyarrow as pa

    numbers = np.arange(pattern["start"], pattern["start"] + n, dtype=np.uint64)
    size = len(prefix) + width + len(suffix)
    rows = np.empty((n, size), np.uint8)
    rows[:, : len(prefix)] = prefix
    for k in range(len(prefix) + width - 1, len(prefix) - 1, -1):  # digits, last first
        rows[:, k] = numbers % 10 + 48
        numbers //= 10
    rows[:, len(prefix) + width :] = suffix
    offsets = pa.py_buffer(np.arange(0, size * n + 1, size, dtype=np.int64))
    return pa.Array.from_buffers(
        pa.large_string(), n, [None, offsets, pa.py_buffer(rows)]
    ).to_pylist()


def table_name(data: bytes) -> str:
    """``.shardstream/shards-<first 16 hex of its sha256>.arrow``: a new table never overwrites an old one."""
    return f".shardstream/{TABLE_PREFIX}{hashlib.sha256(data).hexdigest()[:16]}{TABLE_SUFFIX}"


def is_table_name(name: str) -> bool:
    """Whether ``name`` is a shard table's (new or old)."""
    return _TABLE_NAME.match(name) is not None


def table_reference(data: bytes, rows: int) -> dict[str, Any]:
    """What the head holds under ``shards`` for the table ``data``."""
    return {"table": table_name(data), "sha256": hashlib.sha256(data).hexdigest(), "rows": rows}


def reference_problem(ref: dict[str, Any]) -> str | None:
    """What is wrong with a head's table reference, or None."""
    name, digest, rows = ref.get("table"), ref.get("sha256"), ref.get("rows")
    if set(ref) - {"table", "sha256", "rows"}:
        return f"the shard table reference has unknown keys {sorted(set(ref) - {'table', 'sha256', 'rows'})}"
    found = _TABLE_NAME.match(name) if isinstance(name, str) else None
    if found is None:
        return f"the shard table's name {name!r:.80} is not .shardstream/shards-<16 hex>.arrow"
    if not (
        isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
        and digest.startswith(found[1])
    ):
        return f"the shard table's sha256 {digest!r:.80} is not 64 lower-case hex digits that start as its name"
    if type(rows) is not int or rows < 0:
        return f"the shard table's row count {rows!r:.40} is not a whole number"
    return None


def decode_table(data: bytes, ref: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(problem or None, columns) of a table's bytes, after checking them against the head's ``ref``."""
    import pyarrow as pa

    if hashlib.sha256(data).hexdigest() != ref["sha256"]:
        return f"its shard table {ref['table']} does not match its sha256 (changed or damaged)", {}
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowException, ValueError, OSError) as exc:
        return f"its shard table {ref['table']} is not a readable Arrow file ({str(exc)[:100]})", {}
    want = {
        "path": pa.string(),
        "samples": pa.int64(),
        "bytes": pa.int64(),
        "sha256": pa.binary(32),
        "index_sha256": pa.binary(32),
    }
    names = table.schema.names
    meta = table.schema.metadata or {}
    paths = None
    if "path" not in names and set(meta) == {b"path_pattern"}:
        try:
            paths = expand_pattern(json.loads(meta[b"path_pattern"]), table.num_rows)
        except ValueError:
            paths = None
        if paths is None:
            return f"its shard table {ref['table']} has a damaged path pattern", {}
        names = ["path", *names]
    if (
        not {"path", "samples", "bytes", "sha256"} <= set(names)
        or set(names) - set(want)
        or len(set(names)) != len(names)
        or any(table.schema.field(n).type != want[n] for n in names if n != "path" or paths is None)
    ):
        return (
            f"its shard table {ref['table']} has columns {table.schema.to_string()[:200]!r}, not {want}",
            {},
        )
    if meta and paths is None:
        return f"its shard table {ref['table']} has unknown metadata", {}
    if table.num_rows != ref["rows"]:
        return (
            f"its shard table {ref['table']} has {table.num_rows} rows, the head says {ref['rows']}",
            {},
        )
    for name in ("path", "samples", "bytes") if paths is None else ("samples", "bytes"):
        if table.column(name).null_count:
            return f"its shard table {ref['table']} has empty (null) {name} values", {}
    table = table.combine_chunks()
    columns: dict[str, Any] = {
        "path": table.column("path").to_pylist() if paths is None else paths,
        "samples": table.column("samples").to_numpy(),
        "bytes": table.column("bytes").to_numpy(),
        "sha256": _hex_column(table.column("sha256")),
        "index_sha256": _hex_column(table.column("index_sha256"))
        if "index_sha256" in names
        else None,
    }
    return None, columns


def _hex_column(column: Any) -> HexColumn:
    chunk = column.chunk(0) if column.num_chunks else None
    if chunk is None:
        return HexColumn(b"", np.zeros(0, bool))
    valid = chunk.is_valid().to_numpy(zero_copy_only=False)
    start = chunk.offset * 32
    digests = memoryview(chunk.buffers()[1])[start : start + 32 * len(chunk)]  # no copy
    # null slots may hold anything: make them zeros, so equal columns have equal bytes
    if not valid.all():
        raw = np.frombuffer(digests, np.uint8).reshape(-1, 32).copy()
        raw[~valid] = 0
        digests = raw.tobytes()
    return HexColumn(digests, valid)
