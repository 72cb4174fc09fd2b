"""What shardstream adds to a folder other tools read stays out of their way: after ``pack`` (tar and
Arrow) and ``index`` (tars, Parquet files in place), every entry of the dataset's folder other than its
data files is ``_``- or ``.``-prefixed, the names folder readers (Hugging Face, pyarrow, pandas, globs of
webdataset users) skip."""

from __future__ import annotations

import shutil

import pytest

import shardstream as ss
from tests.interop.clients import outside_our_namespace


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards", "arrow_pack", "arrow_shards"])
def test_after_pack(pack, request):
    assert outside_our_namespace(request.getfixturevalue(pack)) == []


def test_after_index_of_tars(tar_shards, tmp_path):
    folder = tmp_path / "tars"
    folder.mkdir()
    for shard in sorted(tar_shards.glob("*.tar")):
        shutil.copy(shard, folder / shard.name)
    ss.index(str(folder))
    assert outside_our_namespace(folder) == []


def test_after_index_of_parquet_files_in_place(parquet_hub):
    assert outside_our_namespace(parquet_hub / "data") == []
    assert sorted(p.name for p in parquet_hub.iterdir()) == ["data"]
