"""An error about one damaged sample names its shard and its key, and its position in that shard
(never a position in the epoch's shuffled order), in every reader: ShardDataset in this process and
in workers, under on_error="skip", ShardMap by index and by key, tar, Arrow and Parquet shards."""

from __future__ import annotations

import io
import logging
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import shardstream as ss
from shardstream.dataset.samples.decode import DecodeError
from shardstream.manifest.index_parquet import index_parquet
from shardstream.manifest.verify import verify
from tests.sample_datasets import make_files

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

BAD = "img017"


def jpeg(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(out, "JPEG")
    return out.getvalue()


def image(i: int) -> bytes:
    return b"<html>not found</html>" if f"img{i:03d}" == BAD else jpeg(i)


@pytest.fixture(scope="module", params=["tar", "arrow"])
def packed(request, tmp_path_factory) -> tuple[str, str, int]:
    """40 images packed shuffled in shards of 16, one of them no image: (dataset, its shard, position)."""
    root = tmp_path_factory.mktemp("names")
    files = {f"img{i:03d}.jpg": image(i) for i in range(40)}
    files.update({f"img{i:03d}.cls": str(i % 3).encode() for i in range(40)})
    src = make_files(root / "src", files)
    url = ss.pack(
        src, root / "ds", format=request.param, samples_per_shard=16, seed=2, progress=False
    ).url
    m = ss.ShardMap(url, decode=None)
    at = m.index_of(BAD)
    shard, position = m.locate(at)
    assert at != position  # the position in the shard is not the one in the dataset
    return url, m.store.url_of(m.manifest.paths[shard]), position


def named(shard: str, position: int) -> str:
    return (
        f"{shard}: sample {BAD!r} (position {position} in the shard): field 'jpg' does not decode"
    )


@pytest.mark.parametrize("num_workers", [0, 1])
def test_shard_dataset_names_the_shard_and_the_key(packed, num_workers):
    url, shard, position = packed
    ds = ss.ShardDataset(url, shuffle=True, seed=3, decode="torch", rank=0, world_size=1)
    with pytest.raises(Exception) as caught:
        list(ds.loader(batch_size=8, num_workers=num_workers))
    assert named(shard, position) in str(caught.value)


def test_shard_dataset_without_batches_names_the_key(packed):
    url, shard, position = packed
    with pytest.raises(DecodeError) as caught:
        list(ss.ShardDataset(url, shuffle=True, seed=3, decode="torch", rank=0, world_size=1))
    assert named(shard, position) in str(caught.value)


def test_a_skipped_sample_is_logged_by_its_key(packed, caplog):
    url, shard, position = packed
    ds = ss.ShardDataset(url, shuffle=True, decode="torch", on_error="skip", rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        list(ds.loader(batch_size=8, num_workers=0))
    assert ds.skipped == 1
    assert f"the first, sample {BAD!r} (position {position} in the shard): " in caplog.text


def test_shard_map_names_the_shard_and_the_key(packed):
    url, shard, position = packed
    m = ss.ShardMap(url)
    for read in (lambda: m.get(BAD), lambda: m[m.index_of(BAD)]):
        with pytest.raises(DecodeError) as caught:
            read()
        assert str(caught.value).startswith(named(shard, position))


def test_a_transform_error_in_a_map_names_the_key(packed):
    url, shard, position = packed

    def broken(sample):
        raise ValueError("boom")

    m = ss.ShardMap(url, decode=None, transform=broken)
    with pytest.raises(ss.errors.TransformError) as caught:
        m.get(BAD)
    assert f"on sample {BAD!r} (position {position} in the shard) of {shard}: boom" in str(
        caught.value
    )


def test_verify_names_the_key(packed):
    url, shard, position = packed
    (problem,) = verify(url, decode=True).problems
    assert problem.startswith(named(shard, position))


def test_a_parquet_file_read_in_place_names_the_row_key(tmp_path):
    rows = list(range(12))
    table = pa.table(
        {"__key__": [f"img{i + 10:03d}" for i in rows], "jpg": [image(i + 10) for i in rows]}
    )
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "part-0.parquet", row_group_size=5)
    url = index_parquet([str(tmp_path / "data" / "*.parquet")]).url
    shard = f"{url}/part-0.parquet"
    with pytest.raises(DecodeError) as caught:
        list(ss.ShardDataset(url, shuffle=True, seed=1, rank=0, world_size=1))
    assert named(shard, 7) in str(caught.value)
    with pytest.raises(DecodeError, match=re.escape(named(shard, 7))):
        ss.ShardMap(url)[7]
