"""Arrow IPC shards: readable by plain pyarrow, zstd buffers, schema text, rows, damage."""

from __future__ import annotations

import hashlib
import io

import pyarrow as pa
import pyarrow.feather
import pyarrow.ipc
import pytest

from shardstream.errors import CorruptShardError
from shardstream.formats import arrow as A
from shardstream.formats import count_samples, iter_shard_samples

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SCHEMA = pa.schema(
    [
        ("__key__", pa.string()),
        ("jpg", pa.binary()),
        ("label", pa.int64()),
        ("caption", pa.string()),
    ],
    metadata={b"origin": b"test"},
)


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "__key__": [f"{i:06d}" for i in range(start, start + n)],
            "jpg": [
                b"\xff\xd8" + b"compressible " * 40 + bytes([i % 256])
                for i in range(start, start + n)
            ],
            "label": [i % 7 for i in range(start, start + n)],
            "caption": [f"caption number {i} é" for i in range(start, start + n)],
        },
        schema=SCHEMA,
    )


def write(batches, compression=A.DEFAULT_COMPRESSION) -> tuple[bytes, int, str, A.ArrowShardWriter]:
    buf = io.BytesIO()
    w = A.ArrowShardWriter(buf, SCHEMA, compression)
    for b in batches:
        w.add_batch(b)
    nbytes, digest = w.close()
    return buf.getvalue(), nbytes, digest, w


BATCHES = [batch(0, 50), batch(50, 30), batch(80, 1)]
ROWS = [row for b in BATCHES for row in b.to_pylist()]


def test_close_reports_size_sha_and_samples():
    data, nbytes, digest, w = write(BATCHES)
    assert nbytes == len(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert w.samples == 81


def test_readable_by_pyarrow_ipc_open_file(tmp_path):
    data, *_ = write(BATCHES)
    path = tmp_path / "shard-000000.arrow"
    path.write_bytes(data)
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.open_file(f)
        assert reader.num_record_batches == 3
        assert reader.schema.equals(SCHEMA, check_metadata=True)
        assert reader.read_all().to_pylist() == ROWS


def test_readable_by_feather_read_table(tmp_path):
    data, *_ = write(BATCHES)
    path = tmp_path / "shard-000000.arrow"
    path.write_bytes(data)
    table = pyarrow.feather.read_table(str(path))
    assert table.num_rows == 81
    assert table.column("__key__").to_pylist()[:3] == ["000000", "000001", "000002"]
    assert table.to_pylist() == ROWS


def test_add_batch_accepts_a_table():
    data, _, _, w = write([pa.Table.from_batches(BATCHES[:2])])
    assert w.samples == 80
    assert A.read_table(data).to_pylist() == ROWS[:80]


def test_buffers_are_zstd_compressed():
    compressed, *_ = write(BATCHES)
    plain, *_ = write(BATCHES, compression=None)
    # Arrow writes each compressed body buffer as an 8-byte length and then a zstd frame.
    assert ZSTD_MAGIC in compressed
    assert ZSTD_MAGIC not in plain
    assert len(compressed) < len(plain) / 2
    assert A.read_table(compressed).equals(A.read_table(plain))


def test_lz4_and_none_are_readable_too():
    for compression in ("lz4", None):
        data, *_ = write(BATCHES, compression)
        assert ZSTD_MAGIC not in data
        assert list(A.iter_rows(data)) == ROWS


def test_schema_text_round_trip():
    nested = pa.schema(
        [
            ("__key__", pa.string()),
            ("tensor", pa.list_(pa.float32(), 3)),
            ("meta", pa.struct([("w", pa.int32()), ("tags", pa.list_(pa.string()))])),
            ("when", pa.timestamp("ms", tz="UTC")),
            pa.field("maybe", pa.float64(), nullable=False),
            ("cat", pa.dictionary(pa.int8(), pa.string())),
        ],
        metadata={b"k": b"v"},
    )
    for schema in (SCHEMA, nested, pa.schema([])):
        text = A.schema_to_text(schema)
        assert isinstance(text, str)
        text.encode("ascii")  # JSON-safe
        assert A.schema_from_text(text).equals(schema, check_metadata=True)


def test_describe_schema():
    assert A.describe_schema(SCHEMA) == [
        {"name": "__key__", "type": "string", "nullable": True},
        {"name": "jpg", "type": "binary", "nullable": True},
        {"name": "label", "type": "int64", "nullable": True},
        {"name": "caption", "type": "string", "nullable": True},
    ]


def test_iter_rows_in_order_across_batches():
    data, *_ = write(BATCHES)
    rows = list(A.iter_rows(data, "s"))
    assert rows == ROWS
    assert rows[80] == {
        "__key__": "000080",
        "jpg": b"\xff\xd8" + b"compressible " * 40 + b"\x50",
        "label": 80 % 7,
        "caption": "caption number 80 é",
    }
    assert list(iter_shard_samples("arrow", data, "s")) == ROWS
    assert count_samples("arrow", data, "s") == 81


def test_iter_rows_over_a_memory_map(tmp_path):
    from shardstream.storage import Store

    data, *_ = write(BATCHES)
    store = Store(tmp_path)
    store.write_bytes("s.arrow", data)
    assert list(A.iter_rows(store.read_bytes("s.arrow"))) == ROWS


def test_empty_shard_has_no_rows():
    data, _, _, w = write([])
    assert w.samples == 0
    assert list(A.iter_rows(data)) == []
    assert A.read_table(data).schema.equals(SCHEMA)


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99])
def test_truncated_file(cut):
    data, *_ = write(BATCHES)
    damaged = data[: int(len(data) * cut)]
    for read in (A.open_shard, A.read_table, lambda b, n: list(A.iter_rows(b, n))):
        with pytest.raises(
            CorruptShardError, match="memory://b/shard-000003.arrow: not a readable Arrow IPC"
        ):
            read(damaged, "memory://b/shard-000003.arrow")


@pytest.mark.parametrize("junk", [b"", b"ARROW1", b"PAR1" + bytes(100), b"not arrow at all" * 100])
def test_not_an_arrow_file(junk):
    with pytest.raises(CorruptShardError, match="bad.arrow"):
        A.read_table(junk, "bad.arrow")


def test_damaged_record_batch():
    data, *_ = write(BATCHES)
    last_frame = data.rindex(ZSTD_MAGIC)  # inside the last record batch's body
    damaged = bytearray(data)
    damaged[last_frame] ^= 0xFF
    damaged = bytes(damaged)
    with pytest.raises(CorruptShardError, match=r"s\.arrow: damaged record batch 2"):
        list(A.iter_rows(damaged, "s.arrow"))
    with pytest.raises(CorruptShardError, match=r"s\.arrow: damaged record batch"):
        A.read_table(damaged, "s.arrow")
    with pytest.raises(CorruptShardError):
        count_samples("arrow", damaged, "s.arrow")


@pytest.mark.parametrize(
    ("offsets", "data", "says"),
    [
        # pyarrow's to_pylist: SystemError, or worse
        (
            [0, 5, 2, 9],
            b"alphabetagamma",
            "non-monotonic offset",
        ),
        ([0, 2, 4, 6], b"ab\xff\xfeef", "Invalid UTF8"),  # to_pylist: UnicodeDecodeError
    ],
)
def test_damaged_buffers_are_a_named_error_not_a_crash(offsets, data, says):
    import numpy as np

    text = pa.StringArray.from_buffers(
        3, pa.py_buffer(np.array(offsets, np.int32).tobytes()), pa.py_buffer(data)
    )
    sink = io.BytesIO()
    writer = A.ArrowShardWriter(sink, pa.schema([("text", pa.string())]), compression=None)
    # written unvalidated, as damage would read
    writer.add_batch(pa.record_batch([text], names=["text"]))
    writer.close()
    shard = sink.getvalue()
    for read in (
        lambda: list(A.iter_rows(shard, "s.arrow")),
        lambda: A.read_table(shard, "s.arrow"),
        lambda: list(iter_shard_samples("arrow", shard, "s.arrow")),
    ):
        with pytest.raises(CorruptShardError, match=f"s.arrow: damaged record batch.*{says}"):
            read()
