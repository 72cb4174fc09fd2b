"""Datasets written up to manifest format 3 (indexes beside the shards, ``_versions/``, ``_shards-…``,
``_image_sizes-…``) read as they are, and what this release writes over them (an append, an overwrite,
gc) keeps them whole until it publishes, then leaves the format-4 layout."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardstream as ss
from shardstream.dataset.shards import tar_indexes
from shardstream.manifest import files, load_manifest
from shardstream.manifest.index_parquet import index_parquet
from shardstream.manifest.side_names import NAMESPACE, old_index_name
from shardstream.manifest.verify import verify
from shardstream.manifest.versions import list_versions
from shardstream.packing import destination
from shardstream.packing.gc import collect
from shardstream.storage import Store
from tests.folders import as_format_3, folder_bytes, folder_files


def image_folder(root: Path, n: int, salt: int = 0) -> Path:
    from PIL import Image

    for i in range(n):
        folder = root / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8 + i, 8), (salt, i, 0)).save(folder / f"{salt}-{i}.jpg")
    return root


def keys(url, **kw) -> list[str]:
    return sorted(s["__key__"] for s in ss.ShardDataset(str(url), decode=None, **kw))


def no_index_built(monkeypatch) -> None:
    """A reader that built a tar's sample index (instead of taking the stored one) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a sample index was built: the stored one was not found")

    monkeypatch.setattr(tar_indexes, "build_index", refuse)


@pytest.fixture(params=["json", "table"])
def old(request, tmp_path, monkeypatch) -> tuple[Path, list[list[str]]]:
    """A dataset of two versions (a pack, an append) as format 3 wrote it: ``json`` heads, or heads naming a
    shard table (``_shards-…``; as from 10,000 shards, here from one); and each version's keys."""
    if request.param == "table":
        monkeypatch.setattr(
            destination, "manifest_files", lambda m: files.manifest_files(m, table_threshold=1)
        )
    ds = tmp_path / "ds"
    ss.pack(image_folder(tmp_path / "src", 10), ds, samples_per_shard=3, progress=False)
    first = keys(ds)
    ss.pack(
        image_folder(tmp_path / "more", 4, 5), ds, samples_per_shard=3, progress=False, append=True
    )
    both = keys(ds)
    as_format_3(ds)
    monkeypatch.undo()
    names = folder_files(ds)
    assert not [n for n in names if n.startswith(NAMESPACE)]
    assert {"_versions/000001.json", "_versions/000002.json"} <= set(names)
    m = load_manifest(str(ds))
    assert all(old_index_name(p) in names for p in m.paths)
    assert any(n.startswith("_image_sizes-") for n in names)
    assert (m.table is not None and m.table.startswith("_shards-")) == (request.param == "table")
    return ds, [first, both]


def test_a_format_3_dataset_reads_every_version_as_it_is(old, monkeypatch):
    ds, versions = old
    before = folder_bytes(ds)
    m = load_manifest(str(ds))
    assert (m.version, m.format) == (2, 3) and list_versions(Store(str(ds))) == [1, 2]
    assert load_manifest(str(ds), version=1).format == 3
    no_index_built(monkeypatch)  # the indexes beside the shards are the ones taken
    for version, expected in enumerate(versions, 1):
        assert keys(ds, version=version) == expected
        shards = ss.ShardMap(str(ds), decode=None, version=version)
        assert sorted(s["__key__"] for s in shards) == expected
    assert keys(ds) == versions[-1]
    bucketed = ss.Bucketed(ss.ShardDataset(str(ds), decode=None), ss.aspect_ratio("jpg"), [1.2])
    assert bucketed.planned_up_front  # from the recorded image sizes, _image_sizes-…
    assert verify(str(ds)).ok
    assert folder_bytes(ds) == before  # reading, verifying: nothing written


def test_a_changed_index_beside_a_shard_of_a_format_3_dataset_is_reported(old):
    ds, _ = old
    m = load_manifest(str(ds))
    idx = ds / old_index_name(m.paths[1])
    idx.write_bytes(idx.read_bytes()[:-1] + b"x")
    (problem,) = verify(str(ds)).problems
    assert "not the index the manifest names" in problem and m.paths[1] in problem


def test_an_append_to_a_format_3_dataset_publishes_format_4_and_leaves_its_files(old, tmp_path):
    ds, versions = old
    before = folder_bytes(ds)
    ss.pack(image_folder(tmp_path / "late", 3, 9), ds, progress=False, append=True)
    after = folder_bytes(ds)
    # every file there was is there unchanged, but the head, which moved to the new version
    assert {n for n in before if after.get(n) != before[n]} == {"_manifest.json"}
    new = sorted(set(after) - set(before))
    assert f"{NAMESPACE}/versions/000003.json" in new
    assert all(n.startswith(NAMESPACE) or n.startswith("shard-") for n in new)
    m = load_manifest(str(ds))
    assert (m.version, m.format) == (3, 4) and list_versions(Store(str(ds))) == [1, 2, 3]
    assert [load_manifest(str(ds), version=v).format for v in (1, 2)] == [3, 3]
    assert keys(ds, version=2) == versions[1] and keys(ds, version=1) == versions[0]
    assert len(keys(ds)) == len(versions[1]) + 3
    assert verify(str(ds)).ok
    # gc of the older versions: their version files go; the shards and indexes the newest names stay
    collect(Store(str(ds)), keep=1, delete=True)
    assert list_versions(Store(str(ds))) == [3]
    assert not [n for n in folder_files(ds) if n.startswith("_versions/")]
    assert all(old_index_name(p) in folder_files(ds) for p in m.paths[: len(m.paths) - 1])
    assert len(keys(ds)) == len(versions[1]) + 3 and verify(str(ds)).ok


def test_an_overwrite_of_a_format_3_dataset_leaves_the_format_4_layout_and_others_files(
    old, tmp_path
):
    ds, _ = old
    theirs = {"extra.tar": b"another tool's tar", "extra.tar.idx": b"its index, as DALI writes it"}
    for name, data in theirs.items():
        (ds / name).write_bytes(data)
    ss.pack(
        image_folder(tmp_path / "new", 5, 7),
        ds,
        samples_per_shard=2,
        progress=False,
        overwrite=True,
    )
    m = load_manifest(str(ds))
    assert m.format == 4 and len(keys(ds)) == 5
    collect(Store(str(ds)), keep=1, delete=True)
    m = load_manifest(str(ds))
    names = folder_files(ds)
    ours = [n for n in names if n not in theirs]
    assert [n for n in ours if not n.startswith(NAMESPACE)] == sorted(["_manifest.json", *m.paths])
    assert not [n for n in names if n.startswith("_") and n != "_manifest.json"]
    assert {n: (ds / n).read_bytes() for n in theirs} == theirs
    assert verify(str(ds)).ok and len(keys(ds)) == 5


def test_parquet_indexed_by_format_3_reads_its_row_group_index_beside_each_file(tmp_path):
    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    for part in range(2):
        table = pa.table({"__key__": [f"p{part}{i}" for i in range(5)], "x": list(range(5))})
        pq.write_table(table, data / f"train-{part}.parquet", row_group_size=2)
    index_parquet([str(data / "*.parquet")], str(tmp_path / "hub"))
    as_format_3(tmp_path / "hub")
    assert folder_files(tmp_path / "hub") == [
        "_manifest.json",
        "data/train-0.parquet",
        "data/train-0.parquet.idx",
        "data/train-1.parquet",
        "data/train-1.parquet.idx",
    ]
    assert load_manifest(str(tmp_path / "hub")).format == 3
    m = ss.ShardMap(str(tmp_path / "hub"), decode=None)
    assert sorted(m[i]["__key__"] for i in range(len(m))) == [
        f"p{p}{i}" for p in range(2) for i in range(5)
    ]
    assert verify(str(tmp_path / "hub")).ok
    idx = data / "train-1.parquet.idx"
    idx.write_bytes(idx.read_bytes().replace(b'"rows":[2,2,1]', b'"rows":[2,1,2]'))
    (problem,) = verify(str(tmp_path / "hub")).problems
    assert "train-1.parquet" in problem and "not the index the manifest names" in problem
