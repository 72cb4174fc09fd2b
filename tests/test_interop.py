"""Interoperability with real clients: webdataset, GNU/bsd tar, Python tarfile, pyarrow.dataset."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from shardstream import pack
from shardstream.manifest import MANIFEST_NAME, load_manifest
from shardstream.manifest.index_tars import index
from shardstream.manifest.verify import verify
from shardstream.packing.writer import ShardWriter
from shardstream.storage import Store
from tests.sample_datasets import without_run

wds = pytest.importorskip("webdataset")
TAR = shutil.which("tar")
needs_tar = pytest.mark.skipif(TAR is None, reason="no tar command")

# A folder tree with unicode names, spaces, nested folders and a path long enough for a PAX header.
TREE = {
    "plain.txt": b"plain text",
    "plain.json": b'{"a": 1}',
    "with space/file name.txt": b"spaces",
    "données/été 2024/photo 1.jpg": bytes(range(256)) * 4,
    "données/été 2024/photo 1.seg.png": b"\x89PNG fake",
    "日本語/ファイル.txt": "日本語".encode(),
    # 181 bytes, prefix too long for ustar: PAX
    "deep/" + "folder name " * 14 + "/x.bin": bytes(1000),
    "empty.bin": b"",
}


def tar_env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C.UTF-8"}


def run_tar(*args: str, cwd=None) -> str:
    done = subprocess.run([TAR, *args], capture_output=True, env=tar_env(), cwd=cwd, check=True)
    return done.stdout.decode("utf-8")


def make_tree(root) -> None:
    for rel, data in TREE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def writer_samples() -> list[dict]:
    return [
        {"__key__": "000", "txt": "zero", "cls": b"0", "jpg": bytes(range(200))},
        {"__key__": "dir/sub dir/001", "txt": "one", "cls": b"1", "seg.png": b"\x89PNG"},
        {"__key__": "données/été 002", "txt": "deux", "cls": b"2", "jpg": b""},
        {"__key__": "日本/猫 003", "txt": "三", "cls": b"3", "jpg": b"\xff" * 700},
        {"__key__": "long/" + "segment " * 20 + "/004", "txt": "four", "cls": b"4", "jpg": b"\x00"},
        {"__key__": "005", "txt": "five", "cls": b"5", "jpg": bytes(513)},
    ]


def as_stored(sample: dict) -> dict:
    return {
        k: (v.encode() if isinstance(v, str) and k != "__key__" else v) for k, v in sample.items()
    }


@pytest.fixture(scope="module")
def writer_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("writer-ds")
    with ShardWriter(str(root), samples_per_shard=2) as w:
        for s in writer_samples():
            w.write(s)
    return root, w.manifest


@pytest.fixture(scope="module")
def packed_tree(tmp_path_factory):
    src = tmp_path_factory.mktemp("tree-src")
    make_tree(src)
    dest = tmp_path_factory.mktemp("tree-ds") / "ds"
    result = pack(str(src), str(dest), workers=1, progress=False, shuffle=False)
    return src, dest, result.manifest


def wds_samples(urls: list[str]) -> list[dict]:
    out = []
    for sample in wds.WebDataset(urls, shardshuffle=False):
        out.append({k: v for k, v in sample.items() if k in ("__key__",) or not k.startswith("__")})
    return out


def test_webdataset_reads_writer_shards_in_order(writer_dataset):
    root, manifest = writer_dataset
    assert manifest.num_shards == 3
    urls = [str(root / p) for p in manifest.paths]
    assert wds_samples(urls) == [as_stored(s) for s in writer_samples()]


def test_webdataset_reads_writer_shards_by_brace_pattern(writer_dataset):
    root, manifest = writer_dataset
    # the token of the run that wrote them, in every name
    run = manifest.paths[0].split("-")[-1].split(".")[0]
    samples = wds_samples(f"{root}/shard-{{000000..000002}}-{run}.tar")
    assert [s["__key__"] for s in samples] == [s["__key__"] for s in writer_samples()]


def test_webdataset_reads_gzip_shards(tmp_path):
    with ShardWriter(str(tmp_path), compression="gzip", samples_per_shard=4) as w:
        for s in writer_samples():
            w.write(s)
    urls = [str(tmp_path / p) for p in w.manifest.paths]
    assert all(u.endswith(".tar.gz") for u in urls)
    assert wds_samples(urls) == [as_stored(s) for s in writer_samples()]


def test_webdataset_reads_a_packed_folder(packed_tree):
    _, dest, manifest = packed_tree
    samples = wds_samples([str(dest / p) for p in manifest.paths])
    expected: dict[str, dict] = {}
    for rel, data in TREE.items():
        slash = rel.rfind("/") + 1
        dot = rel.index(".", slash)
        expected.setdefault(rel[:dot], {"__key__": rel[:dot]})[rel[dot + 1 :]] = data
    assert samples == [expected[k] for k in sorted(expected)]


@needs_tar
def test_tar_lists_writer_shards(writer_dataset):
    root, manifest = writer_dataset
    listed = []
    for p in manifest.paths:
        listed += run_tar("--quoting-style=literal", "-tf", str(root / p)).splitlines()
    expected = [
        f"{s['__key__']}.{f}"
        for s in writer_samples()
        for f in sorted(k for k in s if k != "__key__")
    ]
    assert listed == expected


@needs_tar
def test_tar_lists_and_extracts_a_packed_folder(packed_tree, tmp_path):
    src, dest, manifest = packed_tree
    assert manifest.num_shards == 1
    shard = str(dest / manifest.paths[0])
    listed = run_tar("--quoting-style=literal", "-tf", shard).splitlines()
    assert sorted(listed) == sorted(TREE)
    out = tmp_path / "extracted"
    out.mkdir()
    run_tar("-xf", shard, cwd=out)
    extracted = {
        os.path.relpath(os.path.join(d, f), out).replace(os.sep, "/")
        for d, _, files in os.walk(out)
        for f in files
    }
    assert extracted == set(TREE)
    for rel, data in TREE.items():
        assert (out / rel).read_bytes() == data
        assert (out / rel).read_bytes() == (src / rel).read_bytes()


@needs_tar
def test_tar_extracts_writer_shards(writer_dataset, tmp_path):
    root, manifest = writer_dataset
    for p in manifest.paths:
        run_tar("-xf", str(root / p), cwd=tmp_path)
    for s in writer_samples():
        for field, value in as_stored(s).items():
            if field != "__key__":
                assert (tmp_path / f"{s['__key__']}.{field}").read_bytes() == value


@needs_tar
def test_tar_reads_gzip_shards(tmp_path):
    with ShardWriter(str(tmp_path / "ds"), compression="gzip") as w:
        for s in writer_samples():
            w.write(s)
    listed = run_tar(
        "--quoting-style=literal", "-tzf", str(tmp_path / "ds" / w.manifest.paths[0])
    ).splitlines()
    assert listed[:3] == ["000.cls", "000.jpg", "000.txt"]
    assert len(listed) == sum(len(s) - 1 for s in writer_samples())


def write_with_webdataset(pattern: str, n: int, maxcount: int, **kw) -> list[dict]:
    samples = [
        {
            "__key__": f"sample{i:04d}",
            "txt": f"text {i}",
            "cls": i % 3,
            "bin": bytes([i % 256]) * (i * 37 % 900),
        }
        for i in range(n)
    ]
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0, **kw) as sink:
        for s in samples:
            sink.write(s)
    return samples


@pytest.mark.parametrize("suffix", ["tar", "tar.gz"])
def test_index_and_verify_webdataset_shards(tmp_path, suffix):
    samples = write_with_webdataset(str(tmp_path / f"shard-%06d.{suffix}"), 23, maxcount=5)
    names = sorted(os.listdir(tmp_path))
    assert names == [f"shard-{i:06d}.{suffix}" for i in range(5)]
    if suffix == "tar.gz":
        assert (tmp_path / names[0]).read_bytes()[:2] == b"\x1f\x8b"

    result = index([f"{tmp_path}/shard-{{000000..000004}}.{suffix}"])
    manifest = result.manifest
    assert result.url == str(tmp_path)
    assert result.unkeyed == []
    assert manifest.shard_format == suffix
    assert manifest.paths == names
    assert manifest.stored_counts.tolist() == [5, 5, 5, 5, 3]
    assert manifest.num_samples == len(samples)
    assert {f["name"]: f["samples"] for f in manifest.fields} == {"bin": 23, "cls": 23, "txt": 23}
    assert manifest.nbytes.tolist() == [(tmp_path / n).stat().st_size for n in names]
    assert load_manifest(Store(tmp_path)).paths == names

    report = verify(str(tmp_path))
    assert report.ok, report.problems
    assert report.manifest.num_samples == 23


def test_index_of_self_gzipped_webdataset_tars(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    write_with_webdataset(str(plain / "part-%03d.tar"), 10, maxcount=4)
    gz = tmp_path / "gz"
    gz.mkdir()
    for name in sorted(os.listdir(plain)):
        (gz / f"{name}.gz").write_bytes(gzip.compress((plain / name).read_bytes()))
    result = index([f"{gz}/part-{{000..002}}.tar.gz"])
    assert result.manifest.stored_counts.tolist() == [4, 4, 2]
    assert verify(str(gz)).ok


def test_verify_catches_a_changed_webdataset_shard(tmp_path):
    write_with_webdataset(str(tmp_path / "shard-%06d.tar"), 6, maxcount=3)
    index([str(tmp_path / "shard-{000000..000001}.tar")])
    shard = tmp_path / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 1
    shard.write_bytes(bytes(data))
    report = verify(str(tmp_path))
    assert not report.ok
    assert len(report.problems) == 1
    assert str(shard) in report.problems[0]
    assert "checksum" in report.problems[0]


def test_webdataset_reads_back_what_shardstream_indexed(tmp_path):
    samples = write_with_webdataset(str(tmp_path / "shard-%06d.tar"), 7, maxcount=3)
    manifest = index([str(tmp_path)]).manifest
    got = wds_samples([str(tmp_path / p) for p in manifest.paths])
    assert [s["__key__"] for s in got] == [s["__key__"] for s in samples]
    assert [s["bin"] for s in got] == [s["bin"] for s in samples]


def arrow_dataset(root) -> tuple[list[dict], object]:
    rows = [
        {"__key__": f"r{i:03d}", "label": i % 5, "text": f"row {i}", "blob": bytes([i]) * i}
        for i in range(25)
    ]
    with ShardWriter(str(root), format="arrow", samples_per_shard=7) as w:
        for r in rows:
            w.write(r)
    return rows, w.manifest


def test_pyarrow_dataset_reads_our_arrow_shards(tmp_path):
    rows, manifest = arrow_dataset(tmp_path)
    assert manifest.num_shards == 4
    files = [str(tmp_path / p) for p in manifest.paths]
    table = pads.dataset(files, format="ipc").to_table()
    assert table.to_pylist() == rows
    assert table.schema.field("blob").type == pa.binary()


def test_pyarrow_dataset_reads_our_arrow_folder_skipping_the_manifest(tmp_path):
    rows, _ = arrow_dataset(tmp_path)
    dataset = pads.dataset(str(tmp_path), format="ipc", exclude_invalid_files=True)
    names = sorted(without_run(os.path.basename(f)) for f in dataset.files)
    assert names == [f"shard-00000{i}.arrow" for i in range(4)]
    table = dataset.to_table()
    assert sorted(table.to_pylist(), key=lambda r: r["__key__"]) == rows


def test_pyarrow_dataset_reads_our_arrow_folder(tmp_path):
    rows, _ = arrow_dataset(tmp_path)
    assert MANIFEST_NAME in os.listdir(tmp_path)
    table = pads.dataset(str(tmp_path), format="ipc").to_table()
    assert sorted(table.to_pylist(), key=lambda r: r["__key__"]) == rows


def test_field_names_of_foreign_tars_are_lower_case_as_webdataset_reads_them(tmp_path):
    """A tar written elsewhere with upper-case extensions (ImageNet's .JPEG): the same keys as webdataset's."""
    import tarfile

    from shardstream import ShardDataset

    path = tmp_path / "part-000000.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("n01/x1.JPEG", b"jpeg bytes"), ("n01/x1.CLS", b"3")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ours = list(ShardDataset(str(path), decode=None, shuffle=False))
    theirs = wds_samples([str(path)])
    assert set(ours[0]) == {"__key__", "jpeg", "cls"}
    assert set(ours[0]) - {"__key__"} == {k for k in theirs[0] if not k.startswith("__")}
    assert bytes(ours[0]["jpeg"]) == theirs[0]["jpeg"] == b"jpeg bytes"
