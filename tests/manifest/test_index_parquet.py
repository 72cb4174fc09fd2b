"""Parquet in place: ``index`` writes a manifest whose shards are the Parquet files themselves (rows, sizes,
sha256, schema, a row-group index each), and ShardDataset / MixedDataset read it like any dataset:
every row once, shuffled, resumed, mixed, HF Image structs decoded."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from shardstream import MixedDataset, ShardDataset, ShardMap
from shardstream.cli import cli
from shardstream.errors import CorruptShardError, ShardstreamError
from shardstream.formats import parquet as parquet_format
from shardstream.manifest.index_parquet import index_parquet
from shardstream.manifest.side_names import index_name
from tests.folders import folder_files, indexed

ROWS = [7, 1, 12, 5]


def png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), i, np.uint8)).save(out, "PNG")
    return out.getvalue()


def write_files(folder, rows=ROWS, prefix="train", group=3) -> list:
    """Parquet files with an HF ``Image`` struct column, a label and a key, ``group`` rows per row group."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, first = [], 0
    for f, n in enumerate(rows):
        ids = list(range(first, first + n))
        table = pa.table(
            {
                "__key__": [f"k{i:03d}" for i in ids],
                "image": [{"bytes": png(i), "path": f"{i}.png"} for i in ids],
                "label": ids,
            }
        )
        path = folder / f"{prefix}-{f:05d}-of-{len(rows):05d}.parquet"
        pq.write_table(table, path, row_group_size=group)
        paths.append(path)
        first += n
    return paths


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("pq")
    paths = write_files(root / "data")
    url = index_parquet([str(root / "data" / "*.parquet")]).url
    return url, paths


def test_the_public_index_reads_parquet_in_place_as_the_command_does(tmp_path):
    import shardstream as ss

    paths = write_files(tmp_path / "data")
    result = ss.index(str(tmp_path / "data" / "*.parquet"))
    assert result.url == str(tmp_path / "data") and result.manifest.shard_format == "parquet"
    assert result.manifest.paths == [p.name for p in paths]
    assert ss.ShardMap(result.url, decode=None)[8]["label"] == 8
    again = ss.index(paths, output=tmp_path / "data", overwrite=True)  # paths, as a list
    assert again.manifest.fingerprint == result.manifest.fingerprint
    with pytest.raises(ss.UsageError, match="force indexes the tars of an unfinished pack"):
        ss.index(paths, overwrite=True, force=True)
    from click.testing import CliRunner

    done = CliRunner().invoke(cli, ["index", "--force", "--overwrite", *map(str, paths)])
    assert done.exit_code == 2 and "--force indexes the tars of an unfinished pack" in done.output


def test_the_manifest_lists_the_files_themselves(files):
    url, paths = files
    doc = json.loads((paths[0].parent / "_manifest.json").read_bytes())
    assert doc["shard_format"] == "parquet"
    shards = doc["shards"]
    assert shards["path"] == [p.name for p in paths]
    assert shards["samples"] == ROWS
    assert shards["bytes"] == [p.stat().st_size for p in paths]
    assert shards["sha256"] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert [f["name"] for f in doc["fields"]] == ["__key__", "image", "label"]
    # each file's row-group index is in .shardstream/ beside it, checked by the manifest; nothing else
    # is added beside the files (a folder reader of Parquet files skips .shardstream/)
    names = [p.name for p in paths]
    assert folder_files(paths[0].parent) == sorted([*indexed(*names), "_manifest.json"])
    for p, digest in zip(paths, shards["index_sha256"]):
        raw = (p.parent / index_name(p.name)).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == digest
        index = parquet_format.parse_row_index(
            raw, p.name, pq.read_metadata(p).num_rows, p.stat().st_size
        )
        assert index.rows == [3] * (pq.read_metadata(p).num_rows // 3) + (
            [pq.read_metadata(p).num_rows % 3] if pq.read_metadata(p).num_rows % 3 else []
        )


def test_an_unshuffled_epoch_equals_pyarrow_read_table(files):
    url, paths = files
    expected = pa.concat_tables(pq.read_table(p) for p in paths).to_pylist()
    got = list(ShardDataset(url, shuffle=False, decode=None, rank=0, world_size=1))
    assert got == expected
    m = ShardMap(url, decode=None)
    assert [m[i] for i in range(len(m))] == expected


def test_image_structs_decode_and_batches_are_columns(files):
    url, _ = files
    ds = ShardDataset(url, shuffle=True, seed=3, decode="torch", rank=0, world_size=1)
    labels = []
    for batch in ds.loader(batch_size=5, num_workers=2):
        assert batch["image"].shape[1:] == (3, 4, 6)
        assert (batch["image"][:, 0, 0, 0] == batch["label"].to(torch.uint8)).all()
        labels += batch["label"].tolist()
    assert sorted(labels) == list(range(sum(ROWS)))  # every row once, shuffled
    assert labels != sorted(labels)
    raw = ShardDataset(url, decode=None, fields=["label"], rank=0, world_size=1)
    assert ShardDataset(url, decode=None, rank=0, world_size=1).columnar
    assert sorted(t for b in raw.loader(batch_size=4) for t in b["label"].tolist()) == list(
        range(sum(ROWS))
    )


def test_resume_reads_every_row_once(files):
    url, _ = files

    def loader():
        return ShardDataset(
            url, seed=5, decode=None, fields=["label"], rank=0, world_size=1
        ).loader(batch_size=3, num_workers=2)

    first = loader()
    seen = []
    for n, batch in enumerate(first, 1):
        seen += batch["label"].tolist()
        if n == 3:
            break
    state = json.loads(json.dumps(first.state_dict()))
    second = loader()
    second.load_state_dict(state)
    seen += [x for b in second for x in b["label"].tolist()]
    assert sorted(seen) == list(range(sum(ROWS)))


def test_a_mix_with_an_indexed_parquet_dataset(files, tmp_path):
    url, _ = files
    other = write_files(tmp_path / "other", rows=[4, 4], prefix="train")
    other_url = index_parquet([str(p) for p in other]).url
    a = ShardDataset(url, decode=None, fields=["__key__", "label"], seed=1)
    b = ShardDataset(other_url, decode=None, fields=["__key__", "label"], seed=2)
    mix = MixedDataset([a, b], [0.5, 0.5], samples_per_epoch=16, rank=0, world_size=1)
    got = Counter()
    for batch in mix.loader(batch_size=4, num_workers=0):
        got.update(batch["__source__"].tolist())
    assert got == {0: 8, 1: 8}


def test_a_hub_folder_of_one_split_is_indexed_and_of_several_refused(tmp_path):
    hub = tmp_path / "hub"
    write_files(hub / "data", rows=[3, 2], prefix="train")
    result = index_parquet([str(hub)])
    assert result.manifest.paths == [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
    ]
    write_files(hub / "data", rows=[2], prefix="test")
    with pytest.raises(ShardstreamError, match=r"several splits \(test, train\).*train\*\.parquet"):
        index_parquet([str(hub)], overwrite=True)


def test_files_of_another_schema_are_refused(tmp_path):
    write_files(tmp_path / "a", rows=[2])
    pq.write_table(pa.table({"x": [1]}), tmp_path / "a" / "train-zz.parquet")
    with pytest.raises(ShardstreamError, match="another schema"):
        index_parquet([str(tmp_path / "a" / "*.parquet")])


def test_a_changed_file_is_refused_not_read(tmp_path):
    paths = write_files(tmp_path / "c", rows=[4])
    url = index_parquet([str(paths[0])]).url
    table = pq.read_table(paths[0]).slice(0, 3)
    pq.write_table(table, paths[0])
    with pytest.raises(CorruptShardError, match="bytes, the manifest says"):
        list(ShardDataset(url, decode=None, shuffle=False))


def test_the_command_indexes_a_glob(tmp_path):
    from click.testing import CliRunner

    write_files(tmp_path / "d", rows=[2, 3])
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "d" / "*.parquet"), "-q"])
    assert result.exit_code == 0, result.output
    assert "indexed 2 shards, 5 samples" in result.output
    listed = CliRunner().invoke(cli, ["ls", str(tmp_path / "d"), "--keys"])
    assert listed.output.splitlines()[4].split("\t")[:2] == ["4", "k004"]
    shown = CliRunner().invoke(
        cli, ["cat", str(tmp_path / "d"), "--key", "k003", "--field", "label"]
    )
    assert shown.stdout_bytes == b"3"


def test_parquet_indexed_over_a_dataset_with_versions_is_its_next_version(tmp_path):
    """Parquet files indexed in place into a folder that held an appended dataset: readers read them, not the
    old version files' shards."""
    from shardstream import ShardWriter
    from shardstream.manifest import load_manifest

    folder = tmp_path / "ds"
    for append in (False, True):
        with ShardWriter(str(folder), samples_per_shard=2, append=append) as w:
            w.write({"__key__": f"old-{append}", "txt": "old"})
    write_files(folder)
    result = index_parquet([str(folder / "*.parquet")], str(folder), overwrite=True)
    assert result.manifest.version == 3
    latest = load_manifest(str(folder))
    assert (latest.version, latest.shard_format, latest.num_samples) == (3, "parquet", sum(ROWS))
    rows = [s["__key__"] for s in ShardDataset(str(folder), decode=None, shuffle=False)]
    assert sorted(rows) == [f"k{i:03d}" for i in range(sum(ROWS))]
    assert load_manifest(str(folder), version=2).num_samples == 2
