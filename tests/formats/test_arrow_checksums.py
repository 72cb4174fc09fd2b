"""Checksums of Arrow record batches: of the values, whatever their layout; one changed value found by its
row and field; the metadata that carries them read strictly."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from shardstream.errors import CorruptShardError
from shardstream.formats import arrow_checksums as A

N = 600


def table() -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "__key__": [f"k{i:04d}" for i in range(N)],
            "jpg": [rng.bytes(300 + i % 50) for i in range(N)],  # large values: one hash each
            "txt": [f"caption {i}" if i % 7 else None for i in range(N)],  # small ones, nulls
            "cls": pa.array(rng.integers(0, 10, N), pa.int64()),
            "score": pa.array(rng.random(N).astype(np.float32)),
            "flag": pa.array([i % 3 == 0 for i in range(N)]),
            "emb": pa.array(
                [rng.random(4).astype(np.float32).tolist() for _ in range(N)],
                pa.list_(pa.float32(), 4),
            ),
            "tags": [[f"t{j}" for j in range(i % 4)] for i in range(N)],
            "box": [{"x": i, "y": float(i) / 2} for i in range(N)],
            "day": pa.array(np.arange(N), pa.int32()).cast(pa.date32()),
            "cat": pa.array([f"c{i % 5}" for i in range(N)]).dictionary_encode(),
            "dec": pa.array([i for i in range(N)], pa.decimal128(12, 2)),
        }
    )


def sums(t: pa.Table | pa.RecordBatch) -> tuple[list[int], np.ndarray]:
    return [A.column_checksum(c) for c in t.columns], A.row_checksums(t)


def test_the_checksums_are_of_the_values_whatever_the_layout():
    t = table()
    cols, rows = sums(t.slice(100, 300))
    # the same values: sliced from a whole batch, copied, chunked, with wider offsets
    again = pa.Table.from_pylist(t.slice(100, 300).to_pylist(), schema=t.schema)
    assert sums(again)[0] == cols and (sums(again)[1] == rows).all()
    chunked = pa.concat_tables([t.slice(100, 150), t.slice(250, 150)])
    assert sums(chunked)[0] == cols and (sums(chunked)[1] == rows).all()
    wide = t.slice(100, 300).cast(
        pa.schema([f.with_type(pa.large_string()) if f.name == "__key__" else f for f in t.schema])
    )
    assert A.column_checksum(wide.column("__key__")) == cols[0]
    assert (A.row_checksums(wide) == rows).all()


@pytest.mark.parametrize(
    "field", ["jpg", "txt", "cls", "score", "flag", "emb", "tags", "box", "day", "dec"]
)
def test_one_changed_value_is_found_by_its_row_and_field(field):
    t = table()
    cols, rows = sums(t)
    values = t.to_pylist()
    old = values[76][field]
    values[76][field] = {
        "jpg": lambda v: v[:10] + bytes([v[10] ^ 1]) + v[11:],
        "txt": lambda v: v[:-1] + "X",
        "cls": lambda v: v + 1,
        "score": lambda v: v + 1.0,
        "flag": lambda v: not v,
        "emb": lambda v: [v[0] + 1.0, *v[1:]],
        "tags": lambda v: [*v, "extra"],
        "box": lambda v: {**v, "y": v["y"] + 1},
        "day": lambda v: v.replace(year=v.year + 1),
        "dec": lambda v: v + 1,
    }[field](old)
    changed = pa.Table.from_pylist(values, schema=t.schema)
    damaged = A.damaged_rows(changed, cols, rows.astype("<u4"))
    assert damaged == {76: [field]}


def test_a_null_that_appears_is_a_change():
    t = table()
    cols, rows = sums(t)
    values = t.to_pylist()
    values[8]["txt"] = None
    changed = pa.Table.from_pylist(values, schema=t.schema)
    assert A.damaged_rows(changed, cols, rows.astype("<u4")) == {8: ["txt"]}


def test_the_metadata_round_trips_and_is_read_strictly():
    batch = table().combine_chunks().to_batches()[0]
    doc = A.batch_metadata(batch)[A.KEY]
    cols, rows = A.parse_checksums(doc, batch.num_columns, batch.num_rows, "b")
    assert A.damaged_rows(batch, cols, rows) == {}
    with pytest.raises(CorruptShardError, match="b: its checksums are of 12 columns and 600 rows"):
        A.parse_checksums(doc, batch.num_columns, 5, "b")
    for bad in (b"{", json.dumps({**json.loads(doc), "hash": "md5"}).encode(), b'{"version": 1}'):
        with pytest.raises(CorruptShardError, match="its checksums do not read"):
            A.parse_checksums(bad, batch.num_columns, batch.num_rows, "b")
