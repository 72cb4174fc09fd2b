"""What shardstream adds to a dataset's folder lives in ``.shardstream/``; another tool's files are never
touched; datasets of the older layout read unchanged and ``upgrade`` moves them (manifest format 4)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.manifest.side_names import NAMESPACE
from shardstream.manifest.verify import verify
from shardstream.packing.gc import collect
from shardstream.storage import Store

CLAIM = ".shardstream-writing"


def image_folder(root: Path, n: int = 8, salt: int = 0) -> Path:
    from PIL import Image

    for i in range(n):
        folder = root / ("ab"[i % 2])
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8 + i, 8), (salt, i, 0)).save(folder / f"{salt}-{i}.jpg")
    return root


def top_level(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def keys(url: str, **kw) -> list[str]:
    return sorted(s["__key__"] for s in ss.ShardDataset(url, decode=None, **kw))


def data_only(folder: Path, data_suffixes: tuple[str, ...]) -> list[str]:
    """The entries of ``folder`` that are neither data files nor ``_``/``.``-prefixed."""
    return [
        n
        for n in os.listdir(folder)
        if not n.startswith(("_", ".")) and not n.endswith(data_suffixes)
    ]


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_a_pack_folder_holds_its_shards_the_manifest_and_the_namespace_only(tmp_path, fmt):
    src = image_folder(tmp_path / "src")
    ss.pack(src, tmp_path / "ds", format=fmt, samples_per_shard=3, progress=False)
    names = top_level(tmp_path / "ds")
    assert names[0] == NAMESPACE and names[1] == "_manifest.json"
    assert all(n.startswith("shard-") and n.endswith(f".{fmt}") for n in names[2:])
    assert not data_only(tmp_path / "ds", (f".{fmt}",))
    inside = sorted(os.listdir(tmp_path / "ds" / NAMESPACE))
    if fmt == "tar":  # each shard's sample index, and the recorded image sizes
        assert [n for n in inside if n.endswith(".idx")] == [f"{n}.idx" for n in names[2:]]
    assert any(n.startswith("image_sizes-") for n in inside)
    ss.pack(src, tmp_path / "ds", format=fmt, samples_per_shard=4, progress=False, append=True)
    assert not data_only(tmp_path / "ds", (f".{fmt}",))
    assert (tmp_path / "ds" / NAMESPACE / "versions" / "000002.json").exists()
    assert len(keys(str(tmp_path / "ds"))) == 16


def test_index_of_tars_and_parquet_writes_nothing_beside_the_data(tmp_path):
    import webdataset as wds

    (tmp_path / "tars").mkdir()
    with wds.TarWriter(str(tmp_path / "tars" / "train-0000.tar")) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": f"t{i}".encode()})
    ss.index(str(tmp_path / "tars" / "train-0000.tar"))
    assert top_level(tmp_path / "tars") == [NAMESPACE, "_manifest.json", "train-0000.tar"]
    assert os.listdir(tmp_path / "tars" / NAMESPACE) == ["train-0000.tar.idx"]
    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    for part in range(2):
        table = pa.table({"__key__": [f"p{part}{i}" for i in range(4)], "x": list(range(4))})
        pq.write_table(table, data / f"train-0000{part}-of-00002.parquet", row_group_size=2)
    ss.index(str(data / "*.parquet"), tmp_path / "hub")
    assert top_level(data) == [
        NAMESPACE,
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    # the folder readers that failed on <file>.parquet.idx read the rows
    assert pq.read_table(data).num_rows == 8
    assert len(list(ss.ShardMap(str(tmp_path / "hub"), decode=None))) == 8


def test_another_tools_index_beside_a_shard_is_never_written_replaced_or_removed(tmp_path):
    """Megatron-Energon and DALI keep ``<shard>.tar.idx`` beside the tar: index, overwrite, append and gc
    leave theirs byte for byte (even once the shard it indexes is gone)."""
    src = image_folder(tmp_path / "src")
    ds = tmp_path / "ds"
    ss.pack(src, ds, samples_per_shard=3, progress=False)
    theirs = {p.name + ".idx": f"energon {p.name}".encode() for p in ds.glob("*.tar")}
    for name, data in theirs.items():
        (ds / name).write_bytes(data)
    ss.index(str(ds), overwrite=True)  # a manifest for the same tars, as the next version
    ss.pack(src, ds, samples_per_shard=4, progress=False, overwrite=True)  # their shards replaced
    ss.pack(image_folder(tmp_path / "more", 2, 9), ds, progress=False, append=True)
    collect(Store(str(ds)), keep=1, delete=True)
    assert {n: (ds / n).read_bytes() for n in theirs} == theirs
    assert verify(str(ds)).ok
    assert len(keys(str(ds))) == 10


def old_layout(url: Path) -> None:
    """``url`` (a fresh pack) as shardstream 0.5 and this release's predecessors wrote it: manifest format
    1, each sample index beside its shard, the recorded image sizes as a ``_``-prefixed file."""
    own = url / NAMESPACE
    head = json.loads((url / "_manifest.json").read_text())
    for name in os.listdir(own):
        if name.endswith(".idx"):
            os.replace(own / name, url / name)
        elif name.startswith("image_sizes-"):
            os.replace(own / name, url / f"_{name}")
            head["image_sizes"]["file"] = f"_{name}"
    shutil.rmtree(own)
    head["shardstream_manifest"] = 1
    (url / "_manifest.json").write_text(json.dumps(head))


def test_a_dataset_of_the_older_layout_reads_and_upgrade_moves_it(tmp_path):
    src = image_folder(tmp_path / "src", 10)
    ds = tmp_path / "ds"
    ss.pack(src, ds, samples_per_shard=3, progress=False)
    expected = keys(str(ds))
    old_layout(ds)
    before = {n: (ds / n).read_bytes() for n in os.listdir(ds)}
    assert ss.load_manifest(str(ds)).format == 1
    # read as it is: the stored indexes beside the shards are taken (none built), the sizes planned from
    m = ss.ShardMap(str(ds), decode=None)
    assert sorted(s["__key__"] for s in m) == expected == keys(str(ds))
    bucketed = ss.Bucketed(ss.ShardDataset(str(ds), decode=None), ss.aspect_ratio("jpg"), [1.2])
    assert bucketed.planned_up_front
    checked = CliRunner().invoke(cli, ["verify", str(ds)])
    assert checked.exit_code == 0 and "shardstream upgrade" in checked.output
    assert {n: (ds / n).read_bytes() for n in os.listdir(ds)} == before  # reading changes nothing
    # upgrade: the next version, everything of ours in .shardstream/, no shard changed
    shards = {p.name: p.read_bytes() for p in ds.glob("*.tar")}
    done = CliRunner().invoke(cli, ["upgrade", str(ds)])
    assert done.exit_code == 0, done.output
    assert "as version 2" in done.output
    m2 = ss.load_manifest(str(ds))
    assert (
        m2.version == 2
        and m2.format == 4
        and m2.image_sizes.reference["file"].startswith(NAMESPACE)
    )
    assert {p.name: p.read_bytes() for p in ds.glob("*.tar")} == shards
    assert keys(str(ds)) == expected == keys(str(ds), version=1)
    assert CliRunner().invoke(cli, ["upgrade", str(ds)]).output.strip().endswith("nothing to do")
    # gc of the older version removes the older layout's files: the folder is data, manifest, namespace
    collect(Store(str(ds)), keep=1, delete=True)
    assert not [n for n in os.listdir(ds) if n.startswith("_") and n != "_manifest.json"]
    assert not [n for n in os.listdir(ds) if n.endswith(".idx")]
    assert keys(str(ds)) == expected and ss.ShardMap(str(ds), decode=None)[0]["__key__"]


def test_a_split_of_the_older_layout_is_read_and_upgraded(tmp_path):
    src = image_folder(tmp_path / "src", 12)
    ss.pack(src, tmp_path / "ds", samples_per_shard=4, progress=False)
    parts = ss.split(str(tmp_path / "ds"), str(tmp_path / "parts"), {"a": 0.5, "b": 0.5}, seed=1)
    part = tmp_path / "parts" / "a"
    head = json.loads((part / "_manifest.json").read_text())
    name = head["selection"]["file"]
    os.replace(part / name, part / f"_{name.split('/')[-1]}")
    head["selection"]["file"] = f"_{name.split('/')[-1]}"
    head["shardstream_manifest"] = 1
    (part / "_manifest.json").write_text(json.dumps(head))
    want = keys(str(part))
    assert len(want) == parts["a"].num_samples
    ss.upgrade(str(part))
    assert ss.load_manifest(str(part)).selection.reference["file"].startswith(NAMESPACE)
    assert keys(str(part)) == want == keys(str(part), version=1)


def test_upgrade_adds_checksums_to_a_dataset_of_this_format_without_them(tmp_path):
    """A tar pack written with --no-index (no per-sample checksums): upgrade writes each shard's index, with
    its values' checksums, as the next version; a damaged value is then named; once done, nothing to do."""
    src = image_folder(tmp_path / "src", 9)
    ds = tmp_path / "ds"
    ss.pack(src, ds, samples_per_shard=4, index=False, progress=False)
    assert ss.load_manifest(str(ds)).index_sha256 is None
    assert "per-sample checksums: none" in CliRunner().invoke(cli, ["verify", str(ds)]).output
    shards = {p.name: p.read_bytes() for p in ds.glob("*.tar")}
    done = CliRunner().invoke(cli, ["upgrade", str(ds)])
    assert done.exit_code == 0 and "as version 2" in done.output, done.output
    m = ss.load_manifest(str(ds))
    assert m.version == 2 and m.index_sha256 is not None and all(m.index_sha256)
    assert {p.name: p.read_bytes() for p in ds.glob("*.tar")} == shards  # no shard changed
    assert sorted((ds / NAMESPACE).glob("*.idx")) and not list(ds.glob("*.idx"))
    checked = CliRunner().invoke(cli, ["verify", str(ds)])
    assert checked.exit_code == 0 and "every shard has them" in checked.output, checked.output
    assert CliRunner().invoke(cli, ["upgrade", str(ds)]).output.strip().endswith("nothing to do")
    # the checksums are read: one flipped bit inside a value is an error naming it
    shard = ds / m.paths[0]
    with tarfile.open(shard) as tar:
        jpg = next(t for t in tar.getmembers() if t.name.endswith(".jpg"))
    data = bytearray(shard.read_bytes())
    data[jpg.offset_data + jpg.size // 2] ^= 1  # same size, valid headers
    shard.write_bytes(bytes(data))
    with pytest.raises(ss.CorruptSampleError, match=m.paths[0]):
        keys(str(ds), shuffle=False)
