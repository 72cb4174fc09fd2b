"""A local Parquet file changed after ``shardstream index`` is refused, not read, also when the change keeps
its size and row count: its footer is checked against the row-group index when it is opened, each row group
against its sha256 when first read, and its values against their checksums in the row-group index (which
name the row and the field that changed). A one-value fix written with pyarrow's defaults often keeps the
size, the statistics and so the whole footer (measured below): only the row group tells."""

from __future__ import annotations

import hashlib
import os
import random
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream import ShardDataset, ShardMap
from shardstream.errors import CorruptShardError
from shardstream.formats.parquet import INDEX_VERSION
from shardstream.manifest.index_parquet import index_parquet
from shardstream.manifest.side_names import index_name

ROWS = 1000


def footer_sha256(path) -> str:
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<I", data[-8:-4])
    return hashlib.sha256(data[-8 - length :]).hexdigest()


def table(labels, text, metadata=None) -> pa.Table:
    keys = [f"k{i:05d}" for i in range(len(labels))]
    return pa.table({"__key__": keys, "label": labels, "text": text}).replace_schema_metadata(
        metadata
    )


def read_with(reader: str, url: str) -> list:
    if reader == "dataset":
        return list(ShardDataset(url, decode=None, shuffle=False))
    m = ShardMap(url, decode=None)
    return [m[i] for i in range(len(m))]


@pytest.mark.parametrize("reader", ["dataset", "map"])
def test_one_value_fixed_in_place_at_the_same_size_is_refused(tmp_path, reader):
    rng = random.Random(0)
    same_size = same_footer = 0
    for trial in range(12):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        path = folder / "a.parquet"
        labels = [rng.randrange(10) for _ in range(ROWS)]
        text = [f"caption {rng.randrange(10**6)}" for _ in range(ROWS)]
        pq.write_table(table(labels, text), path, row_group_size=250)
        url = index_parquet([str(path)]).url
        size, footer = os.path.getsize(path), footer_sha256(path)
        i = rng.randrange(ROWS)
        if trial % 2:  # a relabelled row
            labels[i] = (labels[i] + 1) % 10
        else:  # a corrected caption of the same length
            text[i] = text[i][:-1] + str((int(text[i][-1]) + 1) % 10)
        pq.write_table(table(labels, text), path, row_group_size=250)
        if os.path.getsize(path) != size:
            continue
        same_size += 1
        same_footer += footer_sha256(path) == footer
        field = "label" if trial % 2 else "text"
        with pytest.raises(
            CorruptShardError,
            match=rf"a\.parquet: sample 'k{i:05d}' \(position {i} in the shard\): field '{field}' differs",
        ):
            read_with(reader, url)
    assert same_size >= 4 and same_footer == same_size  # such fixes keep the whole footer


@pytest.mark.parametrize("reader", ["dataset", "map"])
def test_a_changed_footer_of_the_same_size_is_refused_when_opened(tmp_path, reader):
    path = tmp_path / "a.parquet"
    labels, text = list(range(ROWS)), [f"t{i}" for i in range(ROWS)]
    pq.write_table(table(labels, text, {"origin": "one"}), path)
    url = index_parquet([str(path)]).url
    size = os.path.getsize(path)
    pq.write_table(table(labels, text, {"origin": "two"}), path)  # the same rows, another footer
    assert os.path.getsize(path) == size
    with pytest.raises(CorruptShardError, match="its Parquet footer .* differs from the one"):
        read_with(reader, url)


@pytest.mark.parametrize("reader", ["dataset", "map"])
def test_without_a_row_group_index_the_whole_file_is_checked(tmp_path, reader):
    path = tmp_path / "a.parquet"
    labels, text = [i % 7 for i in range(ROWS)], [f"t{i:04d}" for i in range(ROWS)]
    plain = {"use_dictionary": False, "compression": "none"}  # a same-length edit keeps the size
    pq.write_table(table(labels, text), path, **plain)
    url = index_parquet([str(path)]).url
    # lost, or never written: the file's sha256 in the manifest checks it
    os.remove(tmp_path / index_name(path.name))
    assert [s["text"] for s in read_with(reader, url)] == text
    size = os.path.getsize(path)
    text[500] = "t9999"
    pq.write_table(table(labels, text), path, **plain)
    assert os.path.getsize(path) == size
    with pytest.raises(CorruptShardError, match="its sha256 differs from the manifest's"):
        read_with(reader, url)


def test_verify_checksums_checks_the_whole_file_before_its_first_row(tmp_path):
    path = tmp_path / "a.parquet"
    labels, text = [i % 7 for i in range(ROWS)], [f"t{i:04d}" for i in range(ROWS)]
    plain = {"use_dictionary": False, "compression": "none", "row_group_size": 100}
    pq.write_table(table(labels, text), path, **plain)
    url = index_parquet([str(path)]).url
    text[950] = "t0951"  # in the last row group, inside its minimum and maximum
    pq.write_table(table(labels, text), path, **plain)
    assert ShardMap(url, decode=None)[0]["text"] == "t0000"  # row group 0 did not change
    with pytest.raises(CorruptShardError, match="its sha256 differs from the manifest's"):
        ShardMap(url, decode=None, verify_checksums=True)[0]


def test_an_unchanged_file_reads_and_the_index_format_is_unchanged(tmp_path):
    path = tmp_path / "a.parquet"
    labels, text = [i % 7 for i in range(ROWS)], [f"t{i:04d}" for i in range(ROWS)]
    pq.write_table(table(labels, text), path, row_group_size=100)
    url = index_parquet([str(path)]).url
    with open(tmp_path / index_name(path.name)) as f:
        assert f'"shardstream_parquet_index":{INDEX_VERSION}' in f.read()
    assert [s["label"] for s in read_with("dataset", url)] == labels
    assert [s["text"] for s in read_with("map", url)] == text
