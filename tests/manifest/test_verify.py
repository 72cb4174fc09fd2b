"""verify: sizes, checksums and sample counts of every shard against the manifest; the CLI's damaged report."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from shardstream import pack
from shardstream.cli import cli
from shardstream.errors import ManifestError
from shardstream.manifest.side_names import index_name
from shardstream.manifest.verify import verify
from tests.sample_datasets import make_files


def folder_dataset(tmp_path: Path, compression: str | None = None, fmt: str = "tar") -> Path:
    """Nine samples in three shards (3 + 3 + 3)."""
    src = make_files(
        tmp_path / "src",
        {
            f"s{i}.{ext}": f"{ext}-{i}".encode() * (i + 1)
            for i in range(9)
            for ext in ("txt", "json")
        },
    )
    dest = tmp_path / "ds"
    pack(
        src,
        dest,
        format=fmt,
        compression=compression,
        samples_per_shard=3,
        workers=1,
        progress=False,
    )
    return dest


def table_dataset(tmp_path: Path) -> Path:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(30)), "text": [f"t{i}" for i in range(30)]}), path)
    dest = tmp_path / "ds"
    pack(path, dest, samples_per_shard=10, workers=1, progress=False)
    return dest


def manifest(dest: Path) -> dict:
    return json.loads((dest / "_manifest.json").read_text())


def shard_path(dest: Path, i: int) -> Path:
    return dest / manifest(dest)["shards"]["path"][i]


def rewrite_shard(dest: Path, i: int, data: bytes) -> None:
    """Replace shard ``i`` and update the manifest so that its size and checksum match the new bytes."""
    shard_path(dest, i).write_bytes(data)
    doc = manifest(dest)
    doc["shards"]["bytes"][i] = len(data)
    doc["shards"]["sha256"][i] = hashlib.sha256(data).hexdigest()
    doc["total_bytes"] = sum(doc["shards"]["bytes"])
    (dest / "_manifest.json").write_text(json.dumps(doc))


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


DATASETS = {
    "tar": lambda tmp: folder_dataset(tmp),
    "tar.zst": lambda tmp: folder_dataset(tmp, "zstd"),
    "tar.gz": lambda tmp: folder_dataset(tmp, "gzip"),
    "arrow-folder": lambda tmp: folder_dataset(tmp, fmt="arrow"),
    "arrow-table": table_dataset,
}


@pytest.mark.parametrize("kind", list(DATASETS))
def test_good_dataset_verifies(tmp_path, kind):
    dest = DATASETS[kind](tmp_path)
    report = verify(str(dest))
    assert report.ok
    assert report.problems == []
    assert report.manifest.num_shards == 3
    result = invoke("verify", dest, "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: 3 shards, {report.manifest.num_samples} samples, ")
    assert result.stderr == ""


def test_progress_callback_sees_every_shard(tmp_path):
    dest = folder_dataset(tmp_path)
    seen = []
    verify(str(dest), workers=2, on_shard=seen.append)
    assert sorted(seen) == sorted(manifest(dest)["shards"]["bytes"])


def test_verify_takes_the_manifest_path(tmp_path):
    dest = folder_dataset(tmp_path)
    assert verify(str(dest / "_manifest.json")).ok


@pytest.mark.parametrize("kind", list(DATASETS))
def test_one_flipped_byte_is_a_checksum_mismatch(tmp_path, kind):
    dest = DATASETS[kind](tmp_path)
    victim = shard_path(dest, 1)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    report = verify(str(dest))
    assert not report.ok
    assert len(report.problems) == 1
    assert str(victim) in report.problems[0]
    assert "checksum" in report.problems[0]


@pytest.mark.parametrize("kind", ["tar", "tar.zst", "arrow-table"])
def test_truncated_shard_is_named(tmp_path, kind):
    dest = DATASETS[kind](tmp_path)
    victim = shard_path(dest, 2)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 100])
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(victim) in report.problems[0]
    assert f"{len(data) - 100} bytes" in report.problems[0]
    assert str(len(data)) in report.problems[0]


def test_missing_shard_is_named(tmp_path):
    dest = folder_dataset(tmp_path)
    victim = shard_path(dest, 0)
    victim.unlink()
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(victim) in report.problems[0]
    assert "no such file" in report.problems[0]


def test_several_damaged_shards_are_each_reported(tmp_path):
    dest = folder_dataset(tmp_path)
    shard_path(dest, 0).unlink()
    shard_path(dest, 2).write_bytes(b"garbage")
    report = verify(str(dest), workers=1)
    assert len(report.problems) == 2
    assert str(shard_path(dest, 0)) in report.problems[0]
    assert str(shard_path(dest, 2)) in report.problems[1]


def test_wrong_sample_count_in_the_manifest(tmp_path):
    dest = folder_dataset(tmp_path)
    doc = manifest(dest)
    assert doc["shards"]["samples"] == [3, 3, 3]
    doc["shards"]["samples"][0] = 4  # the total stays consistent
    doc["shards"]["samples"][1] = 2
    (dest / "_manifest.json").write_text(json.dumps(doc))
    report = verify(str(dest))
    assert len(report.problems) == 2
    first, second = report.problems
    assert str(shard_path(dest, 0)) in first and "3 samples" in first and "says 4" in first
    assert str(shard_path(dest, 1)) in second and "3 samples" in second and "says 2" in second


def test_wrong_row_count_in_an_arrow_manifest(tmp_path):
    dest = table_dataset(tmp_path)
    doc = manifest(dest)
    doc["shards"]["samples"][2] = 9
    doc["num_samples"] = 29
    (dest / "_manifest.json").write_text(json.dumps(doc))
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(shard_path(dest, 2)) in report.problems[0]
    assert "10 samples" in report.problems[0] and "says 9" in report.problems[0]


def test_shard_that_does_not_parse_is_named_even_with_a_matching_checksum(tmp_path):
    dest = folder_dataset(tmp_path)
    data = bytearray(shard_path(dest, 1).read_bytes())
    data[0] ^= 0xFF  # the first member's name: its header checksum no longer holds
    rewrite_shard(dest, 1, bytes(data))
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(shard_path(dest, 1)) in report.problems[0]
    assert "header" in report.problems[0]


def test_tar_truncated_inside_a_member_with_a_matching_checksum(tmp_path):
    dest = folder_dataset(tmp_path)
    data = shard_path(dest, 0).read_bytes()
    rewrite_shard(dest, 0, data[:700])
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(shard_path(dest, 0)) in report.problems[0]
    assert "truncated" in report.problems[0]


def test_zstd_shard_that_does_not_decompress(tmp_path):
    dest = folder_dataset(tmp_path, "zstd")
    rewrite_shard(dest, 2, b"\x28\xb5\x2f\xfd" + b"\x00" * 40)
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(shard_path(dest, 2)) in report.problems[0]


def test_arrow_shard_that_does_not_parse(tmp_path):
    dest = table_dataset(tmp_path)
    rewrite_shard(dest, 1, b"ARROW1\x00\x00not an arrow file at all")
    report = verify(str(dest))
    assert len(report.problems) == 1
    assert str(shard_path(dest, 1)) in report.problems[0]
    assert "Arrow" in report.problems[0]


def test_a_different_but_valid_shard_with_another_count(tmp_path):
    dest = folder_dataset(tmp_path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for key in ("x", "y"):
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    rewrite_shard(dest, 1, buf.getvalue())
    report = verify(str(dest))
    assert report.problems == [f"{shard_path(dest, 1)}: 2 samples, the manifest says 3"]


def test_verify_without_manifest(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError) as info:
        verify(str(tmp_path / "empty"))
    assert str(tmp_path / "empty") in str(info.value)


def test_cli_reports_damaged_shards_and_fails(tmp_path):
    dest = folder_dataset(tmp_path)
    bad0, bad2 = shard_path(dest, 0), shard_path(dest, 2)
    data = bytearray(bad0.read_bytes())
    data[-1] ^= 0x01
    bad0.write_bytes(bytes(data))
    bad2.unlink()
    result = invoke("verify", dest, "-q")
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert not result.stdout.startswith("ok")
    lines = result.stderr.strip().splitlines()
    damaged = [line for line in lines if line.startswith("damaged: ")]
    assert len(damaged) == 2
    assert damaged[0].startswith(f"damaged: {bad0}: ") and "checksum" in damaged[0]
    assert str(bad2) in damaged[1] and "no such file" in damaged[1]
    assert str(shard_path(dest, 1)) not in result.stderr
    assert lines[-1].startswith("error: 2 of 3 shards are damaged")


def test_cli_verify_in_a_real_process(tmp_path):
    dest = folder_dataset(tmp_path, "zstd")
    proc = subprocess.run(
        [sys.executable, "-m", "shardstream", "verify", str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: 3 shards, 9 samples")
    victim = shard_path(dest, 1)
    victim.write_bytes(victim.read_bytes()[:-5])
    proc = subprocess.run(
        [sys.executable, "-m", "shardstream", "verify", str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"damaged: {victim}: " in proc.stderr


def test_cli_verify_of_a_damaged_manifest(tmp_path):
    dest = folder_dataset(tmp_path)
    (dest / "_manifest.json").write_text("{not json")
    result = invoke("verify", dest)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "_manifest.json" in lines[0]


def test_decode_reports_a_non_image_jpeg_naming_the_sample(tmp_path):
    from PIL import Image

    image = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(image, format="JPEG")
    src = make_files(
        tmp_path / "src",
        {
            "a.JPEG": image.getvalue(),
            "a.cls": b"1",
            "b.JPEG": b"<html>not found",
            "b.cls": b"2",
            "c.JPEG": image.getvalue(),
            "c.json": b'{"x": 1}',
        },
    )
    dest = tmp_path / "ds"
    pack(src, dest, workers=1, shuffle=False, progress=False)
    assert verify(str(dest)).ok  # sizes, checksums and tar structure are all fine
    report = verify(str(dest), decode=True)
    assert len(report.problems) == 1
    assert (
        "sample 'b' (position 1 in the shard)" in report.problems[0]
        and "does not decode" in report.problems[0]
    )
    result = invoke("verify", "--decode", "-q", dest)
    assert (
        result.exit_code != 0
        and "sample 'b' (position 1 in the shard)" in result.output
        and "does not decode" in result.output
    )
    assert invoke("verify", "-q", dest).exit_code == 0


def test_an_empty_checksum_means_none_and_is_not_damage(tmp_path):
    dest = folder_dataset(tmp_path)
    doc = manifest(dest)
    doc["shards"]["sha256"] = [""] * len(doc["shards"]["sha256"])
    (dest / "_manifest.json").write_text(json.dumps(doc))
    assert verify(str(dest)).ok


# -- sample indexes ---------------------------------------------------------------------------


NO_INDEX = "missing, or not the index the manifest names (its sha256 differs)"


def _indexed(tmp_path: Path) -> Path:
    make_files(tmp_path / "src", {f"s{i:02d}.txt": b"t" * (100 * i + 1) for i in range(12)})
    pack(
        tmp_path / "src",
        tmp_path / "ds",
        samples_per_shard=5,
        index=True,
        shuffle=False,
        progress=False,
    )
    return tmp_path / "ds"


def _shard(ds: Path, shard: int) -> Path:
    """Shard ``shard`` of the dataset ``ds`` (its name carries the token of the run that wrote it)."""
    return ds / json.loads((ds / "_manifest.json").read_text())["shards"]["path"][shard]


def _republish(ds: Path, shard: int, raw: bytes) -> None:
    """Write ``raw`` as shard ``shard``'s index and record its checksum in the manifest (a consistent lie)."""
    (ds / index_name(_shard(ds, shard).name)).write_bytes(raw)
    doc = json.loads((ds / "_manifest.json").read_text())
    doc["shards"]["index_sha256"][shard] = hashlib.sha256(raw).hexdigest()
    (ds / "_manifest.json").write_text(json.dumps(doc))


def test_an_indexed_dataset_verifies_and_a_changed_index_does_not(tmp_path):
    ds = _indexed(tmp_path)
    assert verify(str(ds)).ok
    idx = ds / index_name(_shard(ds, 1).name)
    idx.write_bytes(idx.read_bytes()[:-1] + b"x")
    (problem,) = verify(str(ds)).problems
    assert f"{idx}: {NO_INDEX}" in problem
    idx.unlink()  # a lost index: the same
    (problem,) = verify(str(ds)).problems
    assert f"{idx}: {NO_INDEX}" in problem


def test_an_index_that_disagrees_with_the_tar_is_reported(tmp_path):
    from shardstream.formats.tar_index import IndexBuilder

    ds = _indexed(tmp_path)
    with tarfile.open(_shard(ds, 0)) as t:
        members = t.getmembers()
    builder = IndexBuilder()  # the shard's own layout and sample bytes, the first two names swapped
    data = _shard(ds, 0).read_bytes()
    names = [m.name for m in members]
    names[0], names[1] = names[1], names[0]
    for name, m in zip(names, members):
        start = m.offset_data - 512
        builder.add([data[start : m.offset_data + m.size + (-m.size % 512)]], [(name, 512, m.size)])
    _republish(ds, 0, builder.to_bytes())
    (problem,) = verify(str(ds)).problems
    where = ds / index_name(_shard(ds, 0).name)
    assert f"{where}: it places samples or members other than the shard's headers do" in problem


# -- Parquet files indexed in place -------------------------------------------------------------


def _parquet_in_place(tmp_path: Path) -> Path:
    """Two Parquet files of three row groups each, indexed where they are by ``shardstream index``."""
    data = tmp_path / "data"
    data.mkdir()
    for f in range(2):
        ids = list(range(10 * f, 10 * f + 10))
        table = pa.table({"__key__": [f"k{i:02d}" for i in ids], "id": ids, "b": [b"xy"] * 10})
        pq.write_table(table, data / f"train-{f}.parquet", row_group_size=4)
    result = invoke("index", str(data / "*.parquet"))
    assert result.exit_code == 0, result.output
    return data


def test_parquet_indexed_in_place_verifies(tmp_path):
    data = _parquet_in_place(tmp_path)
    for flags in ([], ["--decode"]):
        result = invoke("verify", *flags, "-q", data)
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("ok: 2 shards, 20 samples, ")
    assert verify(str(data), decode=True).ok


def test_a_damaged_parquet_file_is_reported(tmp_path):
    data = _parquet_in_place(tmp_path)
    victim = data / "train-1.parquet"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    victim.write_bytes(bytes(raw))
    (problem,) = verify(str(data)).problems
    assert f"{victim}: checksum mismatch" in problem
    result = invoke("verify", data)
    assert result.exit_code == 1 and "train-1.parquet: checksum mismatch" in result.stderr


def test_a_damaged_parquet_row_group_index_is_reported(tmp_path):
    data = _parquet_in_place(tmp_path)
    idx = data / index_name("train-0.parquet")
    idx.write_bytes(idx.read_bytes().replace(b'"rows":[4,4,2]', b'"rows":[4,3,3]'))
    (problem,) = verify(str(data)).problems
    assert f"{idx}: {NO_INDEX}" in problem
    _republish_parquet_index(data, 0, idx.read_bytes())  # a consistent lie: rows in other groups
    (problem,) = verify(str(data)).problems
    assert f"{idx}: its footer or row groups differ from the file's" in problem
    _republish_parquet_index(data, 0, b"PAR1 not an index")
    (problem,) = verify(str(data)).problems
    assert f"{idx}: not a shardstream row-group index" in problem


def _republish_parquet_index(data: Path, shard: int, raw: bytes) -> None:
    (data / index_name(f"train-{shard}.parquet")).write_bytes(raw)
    doc = manifest(data)
    doc["shards"]["index_sha256"][shard] = hashlib.sha256(raw).hexdigest()
    (data / "_manifest.json").write_text(json.dumps(doc))


def test_a_parquet_file_with_other_rows_than_the_manifest_is_reported(tmp_path):
    data = _parquet_in_place(tmp_path)
    pq.write_table(pa.table({"__key__": ["z"], "id": [0], "b": [b"z"]}), data / "x.parquet")
    rewrite_shard(data, 1, (data / "x.parquet").read_bytes())
    (problem,) = verify(str(data)).problems
    assert "train-1.parquet: 1 row, the manifest says 10" in problem
