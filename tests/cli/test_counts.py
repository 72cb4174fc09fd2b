"""What the command line says about counts: "1 shard", never "1 shards"; the pack summary names the bytes
its progress bar counted; and which Arrow rows carry ``__key__`` (see the table in docs/guides/packing.md)."""

from __future__ import annotations

import importlib
import io
import re
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.packing.result import token_summary
from shardstream.sizes import count, format_size
from tests.sample_datasets import make_files

driver = importlib.import_module("shardstream.packing.driver")

ONE = re.compile(r"\b1 (shard|sample|member|worker|class|dataset|document|token|usable core)s\b")


def invoke(*args: str | Path, ok: bool = True):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def no_plural_after_one(text: str) -> None:
    assert not ONE.search(text), text
    assert not re.search(r"\b1 \w+ shards\b", text), text  # "1 tar shards"


def test_count_says_one_and_many():
    assert count(1, "shard") == "1 shard"
    assert count(0, "shard") == "0 shards"
    assert count(1_200, "sample") == "1,200 samples"
    assert count(1, "class", "classes") == "1 class" and count(3, "class", "classes") == "3 classes"
    assert count(1, "tar shard") == "1 tar shard"


@pytest.fixture
def one(tmp_path) -> tuple[Path, Path]:
    """(source, dataset): one image of one class, in one tar shard."""
    src = make_files(tmp_path / "one", {"cat/a.jpg": b"\xff\xd8 not really a jpeg"})
    dest = tmp_path / "one-ds"
    packed = invoke("pack", src, dest, "-q")
    assert packed.stdout.startswith("packed 1 sample into 1 tar shard, "), packed.stdout
    assert packed.stdout.rstrip().endswith("layout imagefolder, 1 class"), packed.stdout
    no_plural_after_one(packed.stdout)
    return src, dest


def test_one_shard_one_sample_everywhere(one, tmp_path):
    _, dest = one
    verify = invoke("verify", dest, "-q").stdout
    assert verify.startswith("ok: 1 shard, 1 sample, "), verify
    listed = invoke("ls", dest).stdout
    assert listed.splitlines()[-1].startswith("1 shard, 1 sample, "), listed
    info = invoke("info", dest).stdout
    assert re.search(r"^shards\s+1 \(mean [\d.]+ K?B, 1 sample\)$", info, re.M), info
    doctor = invoke("doctor", dest, "--workers", "1").stdout
    assert "1 sample in 1 tar shard, " in doctor and "1 worker x batch" in doctor, doctor
    for text in (verify, listed, info, doctor):
        no_plural_after_one(text)


def test_index_and_damage_say_one_shard(tmp_path):
    folder = tmp_path / "tars"
    folder.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("README", b"about"), ("k1.txt", b"one"), ("k1.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (folder / "a.tar").write_bytes(buf.getvalue())
    indexed = invoke("index", folder, "-q")
    assert indexed.stdout.startswith("indexed 1 shard, 1 sample, "), indexed.stdout
    assert (
        "warning: 1 member has no KEY.EXT name (such as macOS's ._ files) and belongs to no sample"
        in indexed.stderr
    ), indexed.stderr
    no_plural_after_one(indexed.stdout + indexed.stderr)

    shard = folder / "a.tar"
    shard.write_bytes(shard.read_bytes().replace(b"one", b"ONE"))  # same size, other bytes
    damaged = invoke("verify", folder, "-q", ok=False)
    assert damaged.exit_code == 1
    assert "error: 1 of 1 shard is damaged in " in damaged.stderr, damaged.stderr


def test_split_and_token_summaries_say_one(tmp_path):
    src = make_files(tmp_path / "one", {"cat/a.jpg": b"x"})
    split = invoke("pack", src, tmp_path / "split", "--split-by", "cls", "-q").stdout
    assert split.startswith("packed 1 sample into 1 dataset by cls "), split
    assert "1 shard, " in split
    no_plural_after_one(split)
    one_token = SimpleNamespace(
        num_samples=1, num_shards=1, total_bytes=2, tokens={"total": 1, "dtype": "uint16"}
    )
    summary = token_summary("ds", one_token, 1.0)
    assert summary.startswith("packed 1 document, 1 uint16 token into 1 token shard, "), summary


class Bar:
    """A progress bar that remembers its total and what it was told."""

    made: list[Bar] = []

    def __init__(self, progress: bool, total: int | None, unit: str = "B"):
        self.total, self.unit, self.n = total, unit, 0
        Bar.made.append(self)

    def update(self, n: float = 1) -> None:
        self.n += n

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_pack_summary_names_the_bytes_the_progress_bar_counted(tmp_path, monkeypatch, fmt):
    """The bar counts the files read (a total known up front); the shards are larger (tar headers) or
    smaller (Arrow's compression): the summary gives the shards' bytes and the files' bytes, by name."""
    Bar.made = []
    monkeypatch.setattr(driver, "progress_bar", Bar)
    src = make_files(
        tmp_path / "src", {f"c{i % 2}/{i}.bin": bytes([i]) * (700 + 97 * i) for i in range(9)}
    )
    result = ss.pack(src, tmp_path / "ds", format=fmt, samples_per_shard=4, workers=1)
    (bar,) = Bar.made
    files = sum(p.stat().st_size for p in src.rglob("*.bin"))
    assert bar.unit == "B" and bar.total == bar.n == files
    assert result.nbytes != files
    summary = result.summary()
    assert f", {format_size(result.nbytes)} (from {format_size(files)} of files) in " in summary, (
        summary
    )


def test_table_packs_count_rows_and_name_no_file_bytes(tmp_path, monkeypatch):
    Bar.made = []
    monkeypatch.setattr(driver, "progress_bar", Bar)
    pq.write_table(pa.table({"x": list(range(5))}), tmp_path / "t.parquet")
    result = ss.pack(tmp_path / "t.parquet", tmp_path / "ds", workers=1)
    (bar,) = Bar.made
    assert bar.unit == " rows" and bar.n == 5
    assert "of files" not in result.summary()


# -- __key__ on Arrow rows: carried where the table has the column, not invented (docs/guides/packing.md)


def test_arrow_rows_carry_the_tables_own_key_column(tmp_path):
    pq.write_table(pa.table({"__key__": ["a", "b", "c"], "x": [1, 2, 3]}), tmp_path / "t.parquet")
    invoke("pack", tmp_path / "t.parquet", tmp_path / "ds", "-q", "--no-shuffle")
    ds = ss.ShardDataset(str(tmp_path / "ds"), shuffle=False, rank=0, world_size=1)
    assert [s["__key__"] for s in ds] == ["a", "b", "c"]
    assert next(iter(ds.loader(batch_size=3, num_workers=0)))["__key__"] == ["a", "b", "c"]
    assert "x        2" in invoke("cat", tmp_path / "ds", "--key", "b").stdout


def test_arrow_rows_of_a_keyless_table_get_no_invented_key(tmp_path):
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "t.parquet")
    invoke("pack", tmp_path / "t.parquet", tmp_path / "ds", "-q", "--no-shuffle")
    ds = ss.ShardDataset(str(tmp_path / "ds"), shuffle=False, rank=0, world_size=1)
    assert [s for s in ds] == [{"x": 1}, {"x": 2}, {"x": 3}]
    missing = invoke("cat", tmp_path / "ds", "--key", "000000001", ok=False)
    assert missing.exit_code == 1 and "no __key__ column" in missing.stderr


def test_folders_packed_to_arrow_keep_their_file_keys(tmp_path):
    src = make_files(tmp_path / "src", {"cat/a.jpg": b"1", "dog/b.jpg": b"2"})
    invoke("pack", src, tmp_path / "ds", "--format", "arrow", "-q", "--no-shuffle")
    ds = ss.ShardDataset(str(tmp_path / "ds"), shuffle=False, rank=0, world_size=1, decode=None)
    assert sorted(s["__key__"] for s in ds) == ["cat/a", "dog/b"]
