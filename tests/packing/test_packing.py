"""pack(): folders and tables into tar or Arrow shards, deterministic, and clean failures."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.feather as pfeather
import pyarrow.parquet as pq
import pytest
import zstandard

from shardstream import ShardMap, pack
from shardstream.errors import DatasetExistsError, ShardstreamError, SourceError
from shardstream.formats import iter_shard_samples
from shardstream.formats.hf_features import unwrap
from shardstream.manifest.side_names import VERSIONS, version_name
from tests.folders import folder_bytes, folder_files, indexed
from tests.oslimits import permission_preexec
from tests.sample_datasets import doc_without_runs, make_files, without_run

pack_module = importlib.import_module("shardstream.packing.driver")


# -- helpers ------------------------------------------------------------------------------------------------


def load_doc(dest: Path) -> dict:
    return json.loads((dest / "_manifest.json").read_bytes())


def doc_without_created(dest: Path) -> dict:
    """The manifest without its creation info and version (an overwrite is the next version), its shard
    paths without the run's token."""
    doc = doc_without_runs(load_doc(dest))
    doc.pop("created")
    doc.pop("version", None)
    return doc


def shard_files(dest: Path) -> dict[str, bytes]:
    """Every file under ``dest`` except the manifest, its versions and the shards' sample indexes, by path
    without the run's token."""
    return {
        without_run(name): data
        for name, data in folder_bytes(dest).items()
        if name != "_manifest.json"
        and not name.startswith((f"{VERSIONS}/", "_versions/"))
        and not name.endswith(".idx")
    }


def read_samples(dest: Path) -> list[dict]:
    """All samples of the dataset at ``dest``, in order, read straight from the shard files."""
    doc = load_doc(dest)
    out = []
    for path in doc["shards"]["path"]:
        out += list(iter_shard_samples(doc["shard_format"], (dest / path).read_bytes(), path))
    return out


def read_arrow(dest: Path) -> pa.Table:
    doc = load_doc(dest)
    assert doc["shard_format"] == "arrow"
    tables = [
        pa.ipc.open_file(pa.py_buffer((dest / p).read_bytes())).read_all()
        for p in doc["shards"]["path"]
    ]
    return pa.concat_tables(tables)


def check_manifest_matches_shards(dest: Path) -> None:
    doc = load_doc(dest)
    shards = doc["shards"]
    for path, n, size, digest in zip(
        shards["path"], shards["samples"], shards["bytes"], shards["sha256"]
    ):
        data = (dest / path).read_bytes()
        assert len(data) == size
        assert hashlib.sha256(data).hexdigest() == digest
        assert len(list(iter_shard_samples(doc["shard_format"], data, path))) == n
    assert doc["num_samples"] == sum(shards["samples"])
    assert doc["num_shards"] == len(shards["path"])


def varied_folder(root: Path, n: int = 24, seed: int = 3) -> Path:
    """``n`` samples of one to three files of a few hundred bytes to a few KB, in two sub-folders."""
    rng = random.Random(seed)
    files = {}
    for i in range(n):
        for ext in rng.sample(["jpg", "txt", "json"], rng.randint(1, 3)):
            files[f"part{i % 2}/s{i:03d}.{ext}"] = rng.randbytes(rng.randint(100, 3000))
    return make_files(root, files)


def run_python(code: str, preexec) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        preexec_fn=preexec,
        timeout=120,
    )


# -- folders into tar ---------------------------------------------------------------------------------------


def test_folder_to_tar_is_identical_for_any_worker_count_and_run(tmp_path):
    src = varied_folder(tmp_path / "src")
    outs = {}
    for name, workers in (("w1", 1), ("w2", 2), ("w3", 3), ("again", 1)):
        result = pack(src, tmp_path / name, shard_size="8KB", workers=workers, progress=False)
        assert result.samples == 24
        outs[name] = (shard_files(tmp_path / name), doc_without_created(tmp_path / name))
    reference_shards, reference_doc = outs["w1"]
    assert len(reference_shards) >= 4
    assert reference_doc["num_shards"] == len(reference_shards)
    for name in ("w2", "w3", "again"):
        shards, doc = outs[name]
        assert shards.keys() == reference_shards.keys(), name
        for shard in shards:
            assert shards[shard] == reference_shards[shard], (name, shard)
        assert doc == reference_doc, name
    check_manifest_matches_shards(tmp_path / "w1")


def test_repack_with_overwrite_gives_the_same_bytes(tmp_path):
    src = varied_folder(tmp_path / "src", n=10)
    dest = tmp_path / "out"
    pack(src, dest, samples_per_shard=3, workers=1, progress=False)
    first = (shard_files(dest), doc_without_created(dest))
    pack(src, dest, samples_per_shard=3, workers=2, progress=False, overwrite=True)
    assert (shard_files(dest), doc_without_created(dest)) == first


def test_folder_tar_samples_come_back_in_sorted_order_with_their_bytes(tmp_path):
    src = varied_folder(tmp_path / "src", n=15)
    dest = tmp_path / "out"
    result = pack(src, dest, samples_per_shard=4, workers=2, progress=False, shuffle=False)
    samples = read_samples(dest)
    expected_keys = sorted({f"part{i % 2}/s{i:03d}" for i in range(15)})
    assert [s["__key__"] for s in samples] == expected_keys
    for s in samples:
        for field, value in s.items():
            if field != "__key__":
                assert value == (src / f"{s['__key__']}.{field}").read_bytes()
    assert result.manifest.classes is None
    assert load_doc(dest)["created"]["layout"] == "files"


def test_imagefolder_gives_cls_and_classes(tmp_path):
    files = {
        f"{cls}/{i:02d}.jpg": f"{cls}{i}".encode() * 10
        for cls in ("zebra", "ant", "cat")
        for i in range(4)
    }
    src = make_files(tmp_path / "src", files)
    dest = tmp_path / "out"
    result = pack(src, dest, samples_per_shard=5, workers=2, progress=False, shuffle=False)
    doc = load_doc(dest)
    assert doc["classes"] == ["ant", "cat", "zebra"]
    assert doc["created"]["layout"] == "imagefolder"
    assert result.manifest.classes == ["ant", "cat", "zebra"]
    assert doc["shards"]["samples"] == [5, 5, 2]
    samples = read_samples(dest)
    assert [s["__key__"] for s in samples] == sorted(k.rsplit(".", 1)[0] for k in files)
    for s in samples:
        cls_name = s["__key__"].split("/")[0]
        assert s["cls"] == str(doc["classes"].index(cls_name)).encode()
        assert s["jpg"] == files[s["__key__"] + ".jpg"]
    assert {f["name"]: f["samples"] for f in doc["fields"]} == {"cls": 12, "jpg": 12}
    check_manifest_matches_shards(dest)


ODD_FILES = {
    "plain.txt": b"plain",
    "with space.txt": b"space",
    "ünïcødé/日本語 ファイル.json": '{"k": "vé"}'.encode(),
    "a/b/c/d/e/deep.bin.gz": bytes(range(256)),
    "a/" + "long folder name " * 8 + "/x.txt": b"long path",  # > 100 bytes: needs a PAX header
    "README": b"no extension",
    "sub/Makefile": b"all:",
    "zero.txt": b"",
    "zero.json": b"",
    "a.seg.png": b"segmentation",
    "a.png": b"image",
    "a.cls": b"2",
    "v1.0/config.yaml": b"x: 1",
}
ODD_HIDDEN = {
    ".DS_Store": b"junk",
    ".git/HEAD": b"ref",
    "sub/.hidden.txt": b"secret",
    "ünïcødé/.x": b"x",
}


def expected_odd_samples(src: Path) -> dict[str, dict[str, bytes]]:
    expected: dict[str, dict[str, bytes]] = {}
    for rel, data in ODD_FILES.items():
        folder, _, base = rel.rpartition("/")
        stem, dot, ext = base.partition(".")
        key = f"{folder}/{stem}" if folder else stem
        expected.setdefault(key, {})[ext if dot else "bin"] = data
    return expected


@pytest.mark.parametrize(
    ("compression", "workers"), [(None, 1), (None, 2), ("zstd", 2), ("gzip", 1)]
)
def test_odd_folder_round_trips(tmp_path, compression, workers):
    src = make_files(tmp_path / "src", {**ODD_FILES, **ODD_HIDDEN})
    dest = tmp_path / "out"
    result = pack(
        src,
        dest,
        samples_per_shard=3,
        compression=compression,
        workers=workers,
        progress=False,
        shuffle=False,
    )
    samples = read_samples(dest)
    got = {s.pop("__key__"): s for s in samples}
    assert len(got) == len(samples)  # no key twice
    assert got == expected_odd_samples(src)
    assert [s["__key__"] for s in read_samples(dest)] == sorted(got)
    assert result.skipped_hidden == 4
    assert "skipped 4 hidden" in result.summary()
    check_manifest_matches_shards(dest)


def test_odd_folder_is_readable_by_tarfile(tmp_path):
    src = make_files(tmp_path / "src", ODD_FILES)
    dest = tmp_path / "out"
    result = pack(src, dest, workers=1, progress=False)
    members = {}
    with tarfile.open(dest / result.manifest.paths[0]) as tf:
        for member in tf.getmembers():
            members[member.name] = tf.extractfile(member).read()
    expected = {
        (rel if "." in rel.rpartition("/")[2] else rel + ".bin"): data
        for rel, data in ODD_FILES.items()
    }
    assert "README.bin" in expected and "sub/Makefile.bin" in expected
    assert members == expected


def test_shard_size_is_respected(tmp_path):
    src = make_files(tmp_path / "src", {f"{i:02d}.bin": bytes([i]) * 1000 for i in range(20)})
    big = 6000
    (src / "10.bin").write_bytes(b"B" * big)  # bigger than a shard: alone in its own
    dest = tmp_path / "out"
    result = pack(src, dest, shard_size=4096, workers=2, progress=False, shuffle=False)
    doc = load_doc(dest)
    sizes = dict(zip(doc["shards"]["path"], doc["shards"]["bytes"]))
    alone = [p for p, n in zip(doc["shards"]["path"], doc["shards"]["samples"]) if n == 1]
    for path, size in sizes.items():
        assert size == (dest / path).stat().st_size
        if path not in alone:
            assert size <= 4096
    assert any(
        s["__key__"] == "10"
        for p in alone
        for s in iter_shard_samples("tar", (dest / p).read_bytes())
    )
    assert result.samples == 20
    # a 1000-byte file takes 1536 bytes, the end of the tar 1024: two per 4096-byte shard
    assert doc["shards"]["samples"] == [2, 2, 2, 2, 2, 1, 2, 2, 2, 2, 1]


def test_shard_size_string_is_parsed(tmp_path):
    src = make_files(tmp_path / "src", {f"{i:02d}.bin": b"x" * 1000 for i in range(10)})
    result = pack(src, tmp_path / "out", shard_size="3KB", workers=1, progress=False)
    # a sample takes 512 + 1024 bytes and the end of a tar 1024: one sample per 3000-byte shard
    assert result.manifest.stored_counts.tolist() == [1] * 10


def test_samples_per_shard_is_respected(tmp_path):
    src = make_files(tmp_path / "src", {f"{i:02d}.txt": b"x" for i in range(10)})
    result = pack(
        src, tmp_path / "out", samples_per_shard=3, workers=3, progress=False, shuffle=False
    )
    assert result.manifest.stored_counts.tolist() == [3, 3, 3, 1]
    assert [s["__key__"] for s in read_samples(tmp_path / "out")] == [f"{i:02d}" for i in range(10)]


@pytest.mark.parametrize(("compression", "suffix"), [("zstd", "tar.zst"), ("gzip", "tar.gz")])
def test_compressed_tar_holds_the_plain_tar(tmp_path, compression, suffix):
    src = varied_folder(tmp_path / "src", n=8)
    plain = tmp_path / "plain"
    packed = tmp_path / "packed"
    pack(src, plain, samples_per_shard=3, workers=1, progress=False)
    result = pack(
        src, packed, samples_per_shard=3, compression=compression, workers=2, progress=False
    )
    assert result.manifest.shard_format == suffix
    doc = load_doc(packed)
    assert [without_run(p) for p in doc["shards"]["path"]] == [
        f"shard-{i:06d}.{suffix}" for i in range(3)
    ]
    plain_paths = load_doc(plain)["shards"]["path"]
    for i, path in enumerate(doc["shards"]["path"]):
        data = (packed / path).read_bytes()
        if compression == "zstd":
            raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
        else:
            raw = gzip.decompress(data)
        assert raw == (plain / plain_paths[i]).read_bytes()
    check_manifest_matches_shards(packed)


def test_compressed_tar_is_deterministic(tmp_path):
    src = varied_folder(tmp_path / "src", n=8)
    for name, workers in (("a", 1), ("b", 2)):
        pack(
            src,
            tmp_path / name,
            samples_per_shard=3,
            compression="gzip",
            workers=workers,
            progress=False,
        )
    assert shard_files(tmp_path / "a") == shard_files(tmp_path / "b")


def test_folder_to_arrow(tmp_path):
    src = make_files(
        tmp_path / "src", {"a.jpg": b"jpeg", "a.txt": b"caption", "b.jpg": b"other", "c.txt": b""}
    )
    dest = tmp_path / "out"
    result = pack(src, dest, format="arrow", progress=False, shuffle=False)
    assert result.manifest.shard_format == "arrow"
    table = read_arrow(dest)
    assert table.column("__key__").to_pylist() == ["a", "b", "c"]
    rows = {r["__key__"]: r for r in table.to_pylist()}
    # images are stored as Hugging Face Image structs (bytes, no path), the rest as binary
    assert rows["a"]["jpg"] == {"bytes": b"jpeg", "path": None} and rows["a"]["txt"] == b"caption"
    assert rows["b"]["jpg"] == {"bytes": b"other", "path": None} and rows["b"]["txt"] is None
    assert rows["c"]["jpg"] is None and rows["c"]["txt"] == b""
    check_manifest_matches_shards(dest)
    # shardstream reads them back as the bytes they were
    m = ShardMap(str(dest), decode=None)
    got = {m[i]["__key__"]: m[i] for i in range(len(m))}
    assert got["a"]["jpg"] == b"jpeg" and got["b"]["jpg"] == b"other" and got["c"]["jpg"] is None


def test_imagefolder_to_arrow_has_integer_cls(tmp_path):
    src = make_files(tmp_path / "src", {"b/1.png": b"b1", "a/1.png": b"a1", "a/2.png": b"a2"})
    dest = tmp_path / "out"
    result = pack(src, dest, format="arrow", samples_per_shard=2, progress=False, shuffle=False)
    table = read_arrow(dest)
    assert table.column("__key__").to_pylist() == ["a/1", "a/2", "b/1"]
    assert table.column("cls").to_pylist() == [0, 0, 1]
    assert pa.types.is_integer(table.schema.field("cls").type)
    assert result.manifest.classes == ["a", "b"]
    assert result.manifest.stored_counts.tolist() == [2, 1]


def test_folder_to_arrow_with_fields_that_vary_between_shards(tmp_path):
    src = make_files(
        tmp_path / "src",
        {"a.jpg": b"1", "b.jpg": b"2", "c.txt": b"3", "d.jpg": b"4", "d.txt": b"5"},
    )
    dest = tmp_path / "out"
    pack(src, dest, format="arrow", samples_per_shard=1, progress=False, shuffle=False)
    rows = unwrap(read_arrow(dest)).to_pylist()  # the images as bytes, as shardstream reads them
    assert [(r["__key__"], r.get("jpg"), r.get("txt")) for r in rows] == [
        ("a", b"1", None),
        ("b", b"2", None),
        ("c", None, b"3"),
        ("d", b"4", b"5"),
    ]


# -- tables ---------------------------------------------------------------------------------------------------


def demo_table(n: int = 1000) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "text": [f"row {i} " + "x" * (i % 23) for i in range(n)],
            "score": [i / 7 for i in range(n)],
        }
    )


def write_table_source(tmp_path: Path, kind: str, table: pa.Table) -> Path:
    if kind == "parquet-folder":  # several files, several row groups each
        root = tmp_path / "src"
        (root / "nested").mkdir(parents=True)
        pq.write_table(table.slice(0, 400), root / "a.parquet", row_group_size=64)
        pq.write_table(table.slice(400, 350), root / "b.parquet", row_group_size=100)
        pq.write_table(table.slice(750), root / "nested" / "c.parquet", row_group_size=50)
        return root
    if kind == "parquet":
        path = tmp_path / "t.parquet"
        pq.write_table(table, path, row_group_size=128)
        return path
    if kind == "csv":
        path = tmp_path / "t.csv"
        pcsv.write_csv(table, path)
        return path
    if kind == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
        return path
    if kind == "feather":
        path = tmp_path / "t.feather"
        pfeather.write_feather(table, path)
        return path
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["parquet-folder", "parquet", "csv", "jsonl", "feather"])
def test_table_to_arrow_keeps_every_row(tmp_path, kind):
    table = demo_table()
    source = write_table_source(tmp_path, kind, table)
    dest = tmp_path / "out"
    result = pack(source, dest, samples_per_shard=300, workers=2, progress=False, shuffle=False)
    assert result.manifest.shard_format == "arrow"
    assert result.manifest.stored_counts.tolist() == [300, 300, 300, 100]
    got = read_arrow(dest)
    assert got.equals(table), got.schema
    assert [f["name"] for f in load_doc(dest)["fields"]] == ["id", "text", "score"]
    check_manifest_matches_shards(dest)


def test_table_to_arrow_is_identical_for_any_worker_count(tmp_path):
    table = demo_table()
    source = write_table_source(tmp_path, "parquet-folder", table)
    for name, workers in (("w1", 1), ("w2", 2), ("w1-again", 1)):
        pack(
            source,
            tmp_path / name,
            shard_size="6KB",
            workers=workers,
            progress=False,
            shuffle=False,
        )
    reference = shard_files(tmp_path / "w1")
    assert len(reference) >= 3
    for name in ("w2", "w1-again"):
        assert shard_files(tmp_path / name) == reference
        assert doc_without_created(tmp_path / name) == doc_without_created(tmp_path / "w1")
    assert read_arrow(tmp_path / "w1").equals(table)


def test_table_shard_size_bounds_the_rows_per_shard(tmp_path):
    table = demo_table()
    source = write_table_source(tmp_path, "parquet", table)
    small = pack(source, tmp_path / "small", shard_size="4KB", workers=1, progress=False)
    large = pack(source, tmp_path / "large", shard_size="64KB", workers=1, progress=False)
    assert small.shards > large.shards >= 1
    assert small.samples == large.samples == 1000


def test_table_to_tar_without_key_column(tmp_path):
    table = demo_table(25)
    source = write_table_source(tmp_path, "feather", table)
    dest = tmp_path / "out"
    result = pack(source, dest, format="tar", samples_per_shard=10, progress=False, shuffle=False)
    assert result.manifest.shard_format == "tar"
    assert result.manifest.stored_counts.tolist() == [10, 10, 5]
    samples = read_samples(dest)
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(25)]
    for s, row in zip(samples, table.to_pylist()):
        assert s["id"] == str(row["id"]).encode()
        assert s["text"] == row["text"].encode()
        assert float(s["score"]) == row["score"]
    assert {f["name"]: f["samples"] for f in load_doc(dest)["fields"]} == {
        "id": 25,
        "score": 25,
        "text": 25,
    }
    check_manifest_matches_shards(dest)


def test_table_to_tar_with_key_column(tmp_path):
    table = demo_table(12).append_column("__key__", pa.array([f"item-{i:03d}" for i in range(12)]))
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    dest = tmp_path / "out"
    pack(
        path,
        dest,
        format="tar",
        compression="zstd",
        samples_per_shard=5,
        progress=False,
        shuffle=False,
    )
    samples = read_samples(dest)
    assert [s["__key__"] for s in samples] == [f"item-{i:03d}" for i in range(12)]
    assert all("__key__" not in {k for k in s if k != "__key__"} for s in samples)
    assert sorted(samples[3]) == ["__key__", "id", "score", "text"]
    assert samples[3]["text"] == b"row 3 xxx"
    assert [f["name"] for f in load_doc(dest)["fields"]] == ["id", "score", "text"]


def test_table_to_tar_skips_nulls(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": "x", "b": 1}\n{"a": null, "b": 2}\n')
    dest = tmp_path / "out"
    pack(path, dest, format="tar", progress=False, shuffle=False)
    samples = read_samples(dest)
    assert samples == [
        {"__key__": "000000000", "a": b"x", "b": b"1"},
        {"__key__": "000000001", "b": b"2"},
    ]


def test_parquet_files_with_different_columns_lose_nothing(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": ["a", "b"]}), root / "a.parquet")
    pq.write_table(pa.table({"id": [3], "text": ["c"], "extra": [9]}), root / "b.parquet")
    dest = tmp_path / "out"
    try:
        pack(root, dest, workers=1, progress=False, shuffle=False)
    except SourceError as exc:  # refusing, naming the odd file, would do too
        assert str(root / "b.parquet") in str(exc)
        assert not (dest / "_manifest.json").exists()
        return
    got = read_arrow(dest)
    assert "extra" in got.column_names
    assert got.column("extra").to_pylist() == [None, None, 9]


@pytest.mark.parametrize("name", ["empty.parquet", "empty.csv"])
def test_empty_table_is_refused(tmp_path, name):
    path = tmp_path / name
    table = pa.table({"id": pa.array([], pa.int64())})
    if name.endswith(".csv"):
        pcsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as info:
        pack(path, dest, workers=1, progress=False)
    assert str(path) in str(info.value)
    assert not (dest / "_manifest.json").exists()


def test_corrupt_parquet_file_is_named(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1" + b"not really parquet" * 10 + b"PAR1")
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as info:
        pack(path, dest, progress=False)
    assert str(path) in str(info.value)
    assert not (dest / "_manifest.json").exists()


def corrupt_parquet_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A folder of two Parquet files whose second has damaged pages but an intact footer."""
    root = tmp_path / "src"
    root.mkdir()
    table = demo_table(400)
    pq.write_table(table.slice(0, 200), root / "a.parquet", compression="none")
    pq.write_table(table.slice(200), root / "b.parquet", compression="none", row_group_size=50)
    data = bytearray((root / "b.parquet").read_bytes())
    data[200 : len(data) // 2] = b"\xff" * (len(data) // 2 - 200)
    (root / "b.parquet").write_bytes(bytes(data))
    return root, root / "b.parquet"


@pytest.mark.parametrize("workers", [1, 2])
def test_corrupt_parquet_in_a_folder_fails_without_manifest(tmp_path, workers):
    root, _ = corrupt_parquet_folder(tmp_path)
    dest = tmp_path / "out"
    with pytest.raises(SourceError):
        pack(root, dest, samples_per_shard=50, workers=workers, progress=False)
    assert not (dest / "_manifest.json").exists()


def test_corrupt_parquet_in_a_folder_names_the_file_on_one_line(tmp_path):
    root, bad = corrupt_parquet_folder(tmp_path)
    with pytest.raises(SourceError) as info:
        pack(root, tmp_path / "out", samples_per_shard=50, workers=1, progress=False)
    assert str(bad) in str(info.value)
    assert "\n" not in str(info.value).strip()


# -- failures leave no manifest -----------------------------------------------------------------------------


def test_unreadable_file_fails_without_manifest_and_a_rerun_matches_a_clean_run(tmp_path):
    preexec = permission_preexec(tmp_path)
    src = varied_folder(tmp_path / "src", n=9)
    locked = sorted(src.rglob("*.jpg"))[2]
    dest = tmp_path / "out"
    locked.chmod(0)
    try:
        for workers in (1, 2):
            proc = run_python(
                f"""
                import shardstream
                from shardstream.errors import SourceError
                try:
                    shardstream.pack({str(src)!r}, {str(dest)!r}, samples_per_shard=2, workers={workers},
                                     progress=False)
                except SourceError as exc:
                    print("SourceError:", exc)
                else:
                    print("packed")
            """,
                preexec,
            )
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.startswith("SourceError: "), proc.stdout
            assert str(locked) in proc.stdout
            assert "permission denied" in proc.stdout
            assert not (dest / "_manifest.json").exists()
    finally:
        locked.chmod(0o644)
    pack(src, dest, samples_per_shard=2, workers=2, progress=False)
    pack(src, tmp_path / "clean", samples_per_shard=2, workers=1, progress=False)
    assert shard_files(dest) == shard_files(tmp_path / "clean")
    assert doc_without_created(dest) == doc_without_created(tmp_path / "clean")


def _open_source_then(monkeypatch, action):
    """Make pack() run ``action(source)`` right after listing its source."""
    real = pack_module.open_source

    def listed_then_changed(path, layout="auto"):
        source = real(path, layout)
        action(source)
        return source

    monkeypatch.setattr(pack_module, "open_source", listed_then_changed)


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_file_that_vanishes_after_listing_is_named_and_no_manifest(tmp_path, monkeypatch, fmt):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 10 for i in range(6)})
    victim = src / "3.txt"
    _open_source_then(monkeypatch, lambda source: victim.unlink())
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as info:
        pack(src, dest, format=fmt, samples_per_shard=2, workers=1, progress=False)
    assert str(victim) in str(info.value)
    assert "no such file" in str(info.value)
    assert not (dest / "_manifest.json").exists()
    assert not [n for n in folder_files(dest) if n.endswith(".tmp")]


def test_file_that_grows_after_listing_is_named(tmp_path, monkeypatch):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 10 for i in range(4)})
    victim = src / "1.txt"
    _open_source_then(monkeypatch, lambda source: victim.write_bytes(b"y" * 50))
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as info:
        pack(src, dest, workers=1, progress=False)
    assert str(victim) in str(info.value)
    assert "changed" in str(info.value)
    assert not (dest / "_manifest.json").exists()


def test_file_that_shrinks_after_listing_is_named(tmp_path, monkeypatch):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 10 for i in range(4)})
    victim = src / "2.txt"
    _open_source_then(monkeypatch, lambda source: victim.write_bytes(b"y"))
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as info:
        pack(src, dest, workers=2, samples_per_shard=1, progress=False)
    assert str(victim) in str(info.value)
    assert not (dest / "_manifest.json").exists()


def test_destination_inside_source_is_refused(tmp_path):
    src = make_files(tmp_path / "src", {"a.txt": b"a"})
    for dest in (src / "shards", src):
        with pytest.raises(ShardstreamError) as info:
            pack(src, dest, progress=False)
        assert "inside the source" in str(info.value)
    assert not (src / "shards").exists()
    assert not (src / "_manifest.json").exists()


def test_destination_inside_source_through_a_symlink_is_refused(tmp_path):
    src = make_files(tmp_path / "src", {"a.txt": b"a", "out/old.txt": b"x"})
    (tmp_path / "alias").symlink_to(src / "out", target_is_directory=True)
    with pytest.raises(ShardstreamError, match="inside the source"):
        pack(src, tmp_path / "alias", progress=False)
    assert not (src / "out" / "_manifest.json").exists()


def test_existing_dataset_is_refused_unless_overwrite(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": str(i).encode() for i in range(6)})
    dest = tmp_path / "out"
    pack(src, dest, samples_per_shard=1, workers=1, progress=False)
    before = (dest / "_manifest.json").read_bytes()
    assert len(shard_files(dest)) == 6
    with pytest.raises(DatasetExistsError) as info:
        pack(src, dest, samples_per_shard=3, workers=1, progress=False)
    assert str(dest) in str(info.value)
    assert (dest / "_manifest.json").read_bytes() == before
    assert len(shard_files(dest)) == 6
    result = pack(src, dest, samples_per_shard=3, workers=1, progress=False, overwrite=True)
    assert result.manifest.stored_counts.tolist() == [3, 3]
    assert sorted(shard_files(dest)) == [
        "shard-000000.tar",
        "shard-000001.tar",
    ]  # old shards removed
    check_manifest_matches_shards(dest)


def test_overwrite_that_fails_leaves_the_previous_dataset_as_it_was(tmp_path, monkeypatch):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"data" for i in range(4)})
    dest = tmp_path / "out"
    pack(src, dest, progress=False)
    before = folder_bytes(dest)
    _open_source_then(monkeypatch, lambda source: (src / "2.txt").unlink())
    with pytest.raises(SourceError):
        pack(src, dest, progress=False, overwrite=True)
    after = folder_bytes(dest)
    assert {n: d for n, d in after.items() if n in before} == before  # still published, whole
    check_manifest_matches_shards(dest)


def test_temporary_files_of_an_interrupted_pack_are_cleaned_and_other_files_kept(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"data" for i in range(3)})
    dest = make_files(
        tmp_path / "out", {".shard-000000.tar.0123abcd.tmp": b"partial", "notes.md": b"mine"}
    )
    result = pack(src, dest, progress=False)
    assert folder_files(dest) == sorted(
        ["_manifest.json", "notes.md", *indexed(*result.manifest.paths)]
    )
    assert (dest / "notes.md").read_bytes() == b"mine"


def test_destination_inside_a_file_url_source_is_refused(tmp_path):
    src = make_files(tmp_path / "src", {"a.txt": b"a"})
    with pytest.raises(ShardstreamError, match="inside the source"):
        pack(f"file://{src}", src / "shards", workers=1, progress=False)
    assert not (src / "shards" / "_manifest.json").exists()


def test_existing_webdataset_tars_without_manifest_are_not_deleted(tmp_path):
    import webdataset as wds

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    with wds.ShardWriter(str(theirs / "shard-%06d.tar"), maxcount=2, verbose=0) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": f"their sample {i}"})
    before = shard_files(theirs)
    assert len(before) == 3
    src = make_files(tmp_path / "src", {"mine.txt": b"mine"})
    with pytest.raises(ShardstreamError):
        pack(src, theirs, workers=1, progress=False)
    assert shard_files(theirs) == before


def test_source_error_happens_before_touching_the_destination(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(SourceError):
        pack(tmp_path / "missing", dest, progress=False)
    assert not dest.exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 0},
        {"workers": -1},
        {"shard_size": 0},
        {"shard_size": "abc"},
        {"shard_size": "-5MB"},
        {"samples_per_shard": 0},
        {"format": "zip"},
        {"compression": "lz4"},
    ],
)
def test_nonsense_options_are_refused(tmp_path, kwargs):
    src = make_files(tmp_path / "src", {"a.txt": b"a"})
    dest = tmp_path / "out"
    with pytest.raises(ShardstreamError):
        pack(src, dest, progress=False, **kwargs)
    assert not (dest / "_manifest.json").exists()


def test_summary_reports_counts_and_speed(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 100 for i in range(5)})
    result = pack(src, tmp_path / "out", samples_per_shard=2, workers=1, progress=False)
    line = result.summary()
    assert line.startswith("packed 5 samples into 3 tar shards, ")
    assert "MB/s" in line
    assert str(tmp_path / "out") in line
    assert result.nbytes == sum(len(b) for b in shard_files(tmp_path / "out").values())


def test_parallel_pack_from_a_plain_script(tmp_path):
    """Workers are forked: a script without a ``__main__`` guard works (spawn would re-run it and crash)."""
    src = varied_folder(tmp_path / "src", n=6)
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import shardstream
        result = shardstream.pack({str(src)!r}, {str(tmp_path / "out")!r}, samples_per_shard=2, workers=2,
                                  progress=False)
        print(result.samples)
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "6"


def test_tar_members_have_fixed_metadata(tmp_path):
    src = make_files(tmp_path / "src", {"a.txt": b"a"})
    os.utime(src / "a.txt", (1_000_000_000, 1_000_000_000))
    result = pack(src, tmp_path / "out", progress=False)
    with tarfile.open(tmp_path / "out" / result.manifest.paths[0]) as tf:
        (member,) = tf.getmembers()
    assert (member.name, member.mtime, member.uid, member.gid, member.mode) == (
        "a.txt",
        0,
        0,
        0,
        0o644,
    )


def test_a_shard_size_smaller_than_a_sample_warns_once(tmp_path, caplog):
    src = make_files(tmp_path / "src", {f"{i:03d}.bin": os.urandom(3000) for i in range(6)})
    with caplog.at_level("WARNING", logger="shardstream"):
        result = pack(src, tmp_path / "small", shard_size="1KB", workers=1)
    assert list(result.manifest.stored_counts) == [1] * 6
    warned = [
        r.getMessage() for r in caplog.records if "smaller than a typical sample" in r.getMessage()
    ]
    assert (
        len(warned) == 1
        and "1.0 KB" in warned[0]
        and "6 of 6 shards" in warned[0]
        and "256MB" in warned[0]
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardstream"):
        pack(src, tmp_path / "arrow", format="arrow", shard_size="1KB")  # through ShardWriter
        pack(src, tmp_path / "big", workers=1)
        pack(src, tmp_path / "counted", samples_per_shard=1, workers=1)  # one per shard, as asked
    warned = [
        r.getMessage() for r in caplog.records if "smaller than a typical sample" in r.getMessage()
    ]
    assert len(warned) == 1 and "6 of 6" in warned[0]


def test_table_to_tar_stores_typed_values_without_python_reprs(tmp_path):
    import datetime

    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 20
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": png, "path": "a/x.PNG"}, {"bytes": png, "path": None}], type=image
            ),
            "raw": pa.array([b"\x00\x01", b"\xff"], type=pa.binary()),
            "meta": pa.array([{"w": 1, "tags": ["a"]}, {"w": 2, "tags": []}]),
            "day": pa.array([datetime.date(2024, 1, 2), None]),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    pack(tmp_path / "t.parquet", tmp_path / "out", format="tar", progress=False, shuffle=False)
    first, second = read_samples(tmp_path / "out")
    assert first == {
        "__key__": "000000000",
        "image.png": png,
        "raw": b"\x00\x01",
        "meta.json": b'{"w": 1, "tags": ["a"]}',
        "day": b"2024-01-02",
    }
    assert second["image.png"] == png  # no path: the suffix from the bytes
    nested = pa.table({"boxes": pa.array([{"data": b"\x01", "n": 1}])})
    pq.write_table(nested, tmp_path / "n.parquet")
    with pytest.raises(
        ShardstreamError, match=r"row 0: column 'boxes': it holds bytes inside a nested value"
    ):
        pack(tmp_path / "n.parquet", tmp_path / "n", format="tar", progress=False)


def test_table_numbers_and_text_packed_to_tar_read_back_as_numbers_and_text(tmp_path):
    """Tar members are bytes; the manifest records what each field was written as, so an int column
    comes back as an int (collated into a tensor) and a string column as str, not b"3" and b"cat"."""
    import shardstream as ss

    table = pa.table(
        {
            "label": [3, 1, 4],
            "caption": ["cat", "dög", "x"],
            "score": [0.5, 1.25, -2.0],
            "ok": [True, False, True],
            "raw": [b"\x00", b"\x01", b"\x02"],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    result = pack(
        tmp_path / "t.parquet", tmp_path / "out", format="tar", progress=False, shuffle=False
    )
    types = {f["name"]: f["type"] for f in result.manifest.fields}
    assert types == {
        "label": "int",
        "caption": "str",
        "score": "float",
        "ok": "bool",
        "raw": "bytes",
    }
    rows = list(ss.ShardDataset(str(tmp_path / "out"), shuffle=False))
    assert [(r["label"], r["caption"], r["score"], r["ok"], r["raw"]) for r in rows] == [
        (3, "cat", 0.5, True, b"\x00"),
        (1, "dög", 1.25, False, b"\x01"),
        (4, "x", -2.0, True, b"\x02"),
    ]
    batch = next(iter(ss.ShardDataset(str(tmp_path / "out"), shuffle=False, batch_size=3)))
    assert batch["label"].tolist() == [3, 1, 4] and batch["caption"] == ["cat", "dög", "x"]
    raw = next(iter(ss.ShardDataset(str(tmp_path / "out"), shuffle=False, decode=None)))
    assert raw["label"] == b"3"  # decode=None: the stored bytes, as webdataset reads them


def test_shard_writer_records_a_field_with_mixed_value_types_as_bytes(tmp_path):
    import shardstream as ss

    with ss.ShardWriter(str(tmp_path / "ds")) as w:
        w.write({"__key__": "a", "n": 1, "v": 2})
        w.write({"__key__": "b", "n": 2, "v": "two"})
    types = {f["name"]: f["type"] for f in w.manifest.fields}
    assert types == {"n": "int", "v": "bytes"}
    assert [s["v"] for s in ss.ShardDataset(str(tmp_path / "ds"), shuffle=False)] == [b"2", b"two"]


def test_a_repack_removes_the_old_shard_table(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    dest = tmp_path / "ds"
    pack(src, dest, progress=False)
    table = dest / ".shardstream" / "shards-0123456789abcdef.arrow"
    table.write_bytes(b"a large manifest's old shard table")
    (dest / "_shards-0123456789abcdef.arrow").write_bytes(b"one of a dataset of format 2 or 3")
    result = pack(src, dest, overwrite=True, progress=False)
    assert folder_files(dest) == sorted(
        [
            "_manifest.json",
            version_name(2),  # the overwrite is version 2, published by its version file
            *indexed(*result.manifest.paths),
        ]
    )
