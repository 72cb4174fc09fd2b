"""Packs write samples in a seeded random order by default (issue 11): same keys and bytes, no
class-sorted shards, and the same bytes for any worker count."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from shardstream import pack
from shardstream.cli import cli
from tests.packing.test_packing import doc_without_created, read_arrow, read_samples, shard_files
from tests.sample_datasets import make_files


def class_sorted_folder(root, classes: int = 5, per_class: int = 12):
    files = {
        f"c{c}/{i:03d}.png": f"{c}-{i}".encode() * 8
        for c in range(classes)
        for i in range(per_class)
    }
    return make_files(root, files), files


def test_folder_pack_is_shuffled_by_default_with_the_same_samples(tmp_path):
    src, files = class_sorted_folder(tmp_path / "src")
    pack(src, tmp_path / "out", samples_per_shard=12, progress=False)
    samples = read_samples(tmp_path / "out")
    keys = [s["__key__"] for s in samples]
    assert keys != sorted(keys) and sorted(keys) == sorted(k[:-4] for k in files)
    for s in samples:
        assert s["png"] == files[s["__key__"] + ".png"]
        assert int(s["cls"]) == int(s["__key__"][1])
    # a class-sorted tree gives shards of one class without shuffle; shuffled, every shard mixes classes
    per_shard = [{s["__key__"][:2] for s in samples[i : i + 12]} for i in range(0, 60, 12)]
    assert all(len(classes) >= 3 for classes in per_shard)


def test_shuffled_pack_is_identical_for_any_worker_count_and_depends_on_the_seed(tmp_path):
    src, _ = class_sorted_folder(tmp_path / "src")
    for name, workers, seed in (("w1", 1, 0), ("w2", 2, 0), ("s1", 2, 1)):
        pack(src, tmp_path / name, samples_per_shard=7, workers=workers, seed=seed, progress=False)
    assert shard_files(tmp_path / "w1") == shard_files(tmp_path / "w2")
    assert doc_without_created(tmp_path / "w1") == doc_without_created(tmp_path / "w2")
    assert shard_files(tmp_path / "s1") != shard_files(tmp_path / "w1")
    pack(src, tmp_path / "plain", samples_per_shard=7, shuffle=False, progress=False)
    keys = [s["__key__"] for s in read_samples(tmp_path / "plain")]
    assert keys == sorted(keys)


def table_source(tmp_path):
    table = pa.table({"id": list(range(300)), "text": [f"row {i}" for i in range(300)]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=64)
    return path, table


def test_table_to_arrow_is_shuffled_deterministically(tmp_path):
    path, table = table_source(tmp_path)
    for name, workers in (("w1", 1), ("w2", 2)):
        pack(path, tmp_path / name, samples_per_shard=50, workers=workers, progress=False)
    assert shard_files(tmp_path / "w1") == shard_files(tmp_path / "w2")
    got = read_arrow(tmp_path / "w1")
    ids = got.column("id").to_pylist()
    assert ids != sorted(ids) and sorted(ids) == list(range(300))
    assert got.column("text").to_pylist() == [f"row {i}" for i in ids]


def test_table_to_tar_keeps_row_numbers_as_keys(tmp_path):
    path, _ = table_source(tmp_path)
    pack(path, tmp_path / "out", format="tar", samples_per_shard=64, progress=False)
    samples = read_samples(tmp_path / "out")
    keys = [s["__key__"] for s in samples]
    assert keys != sorted(keys) and sorted(keys) == [f"{i:09d}" for i in range(300)]
    assert all(int(s["id"]) == int(s["__key__"]) for s in samples)


def test_cli_shuffle_flags(tmp_path):
    src, _ = class_sorted_folder(tmp_path / "src")
    runner = CliRunner()
    for name, extra in (
        ("a", ["--seed", "3"]),
        ("b", ["--seed", "3", "--workers", "1"]),
        ("c", ["--no-shuffle"]),
    ):
        result = runner.invoke(
            cli, ["pack", str(src), str(tmp_path / name), "-q", "--samples-per-shard", "9", *extra]
        )
        assert result.exit_code == 0, result.output
    assert shard_files(tmp_path / "a") == shard_files(tmp_path / "b")
    keys = [s["__key__"] for s in read_samples(tmp_path / "c")]
    assert keys == sorted(keys)
