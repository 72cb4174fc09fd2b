"""Sample indexes by default: ``index`` writes them for existing tars, and a tar without one gets one
built from its headers once per host, kept in the private cache, and read like a stored one."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from shardstream import ShardDataset
from shardstream.formats.tar_index import parse_index
from shardstream.manifest import load_manifest
from shardstream.manifest.index_tars import index as index_tars
from shardstream.manifest.side_names import NAMESPACE, index_name
from shardstream.storage import Store
from tests.folders import folder_files
from tests.oslimits import permission_preexec

webdataset = pytest.importorskip("webdataset")


def foreign_tars(root: Path, shards: int = 3, per_shard: int = 7) -> dict[str, dict[str, bytes]]:
    """Tars written by webdataset's ShardWriter (pax headers, as tarfile writes them); the samples by key."""
    root.mkdir(parents=True, exist_ok=True)
    samples = {}
    with webdataset.ShardWriter(str(root / "part-%04d.tar"), maxcount=per_shard, verbose=0) as w:
        for i in range(shards * per_shard):
            sample = {"jpg": os.urandom(100 + 37 * i), "cls": str(i % 4).encode()}
            samples[f"k{i:04d}"] = sample
            w.write({"__key__": f"k{i:04d}", **sample})
    return samples


def indexed_as_before(folder: Path) -> None:
    """A manifest for the tars in ``folder`` and no sample indexes, as ``index`` of 0.5.0 left them (manifest
    format 1)."""
    index_tars([str(folder)])
    shutil.rmtree(folder / NAMESPACE)  # the sample indexes, all there is in it
    manifest = folder / "_manifest.json"
    doc = json.loads(manifest.read_text())
    del doc["shards"]["index_sha256"]
    doc["shardstream_manifest"] = 1
    manifest.write_text(json.dumps(doc))
    assert folder_files(folder) == sorted(["_manifest.json", *doc["shards"]["path"]])


def epoch(url: str, cache: Path, workers: int = 0) -> dict[str, dict[str, bytes]]:
    ds = ShardDataset(url, decode=None, cache_dir=cache, shuffle=False)
    got = {}
    for batch in ds.loader(batch_size=4, num_workers=workers):
        for i, key in enumerate(batch["__key__"]):
            assert key not in got
            got[key] = {"jpg": bytes(batch["jpg"][i]), "cls": bytes(batch["cls"][i])}
    return got


def built(cache: Path) -> dict[str, tuple[int, int]]:
    """The built indexes in the cache: name -> (inode, mtime)."""
    folder = cache / "indexes"
    if not folder.exists():
        return {}
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in folder.iterdir()
        if p.name.endswith(".shard")
    }


def test_index_writes_sample_indexes_for_existing_tars_that_read_like_the_tars(tmp_path):
    samples = foreign_tars(tmp_path / "tars")
    result = index_tars([str(tmp_path / "tars")])
    m = load_manifest(Store(str(tmp_path / "tars")))
    assert result.indexes_written and m.index_sha256 is not None
    for path, samples_in_shard, nbytes in zip(m.paths, m.stored_counts, m.nbytes):
        data = (tmp_path / "tars" / index_name(path)).read_bytes()
        index = parse_index(data, path, int(samples_in_shard), int(nbytes))
        keys, fields = index.samples(path)
        with tarfile.open(tmp_path / "tars" / path) as tar:  # tarfile's view of the same shard
            members = {info.name: info for info in tar.getmembers()}
            for key, entry in zip(keys, fields):
                for ext, (offset, size) in entry.items():
                    assert (members[f"{key}.{ext}"].offset_data, members[f"{key}.{ext}"].size) == (
                        offset,
                        size,
                    )
    assert epoch(str(tmp_path / "tars"), tmp_path / "cache") == samples
    assert built(tmp_path / "cache") == {}  # read through the stored indexes: none built


def test_a_tar_without_an_index_gets_one_built_once_per_host(tmp_path):
    samples = foreign_tars(tmp_path / "tars")
    indexed_as_before(tmp_path / "tars")
    cache = tmp_path / "cache"
    ds = ShardDataset(str(tmp_path / "tars"), decode=None, cache_dir=cache, shuffle=False)
    assert {s["__key__"]: {"jpg": s["jpg"], "cls": s["cls"]} for s in ds} == samples
    assert ds.open_shards().indexes.built == 3  # one per shard, parsed from its headers
    first = built(cache)
    assert len(first) == 3
    # other processes (workers) and later datasets find them: none is built again
    assert epoch(str(tmp_path / "tars"), cache, workers=2) == samples
    again = ShardDataset(str(tmp_path / "tars"), decode=None, cache_dir=cache, shuffle=False)
    assert {s["__key__"] for s in again} == set(samples)
    assert again.open_shards().indexes.built == 0
    assert built(cache) == first


def test_a_damaged_built_index_is_built_again(tmp_path):
    samples = foreign_tars(tmp_path / "tars")
    indexed_as_before(tmp_path / "tars")
    cache = tmp_path / "cache"
    epoch(str(tmp_path / "tars"), cache)
    for name in built(cache):
        path = cache / "indexes" / name
        data = bytearray(path.read_bytes())
        data[40:48] = b"\xff" * 8  # a sample offset no tar can have
        path.write_bytes(bytes(data))
    ds = ShardDataset(str(tmp_path / "tars"), decode=None, cache_dir=cache, shuffle=False)
    assert {s["__key__"]: {"jpg": s["jpg"], "cls": s["cls"]} for s in ds} == samples
    assert ds.open_shards().indexes.built == 3
    assert len(built(cache)) == 3


def test_a_replaced_shard_gets_its_own_index_not_the_old_ones(tmp_path):
    foreign_tars(tmp_path / "tars", shards=1, per_shard=5)
    indexed_as_before(tmp_path / "tars")
    cache = tmp_path / "cache"
    epoch(str(tmp_path / "tars"), cache)
    # the same keys and sizes, other bytes: a new file at the same path
    shard = tmp_path / "tars" / "part-0000.tar"
    other = tmp_path / "other"
    with tarfile.open(shard) as tar:
        members = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]
    with tarfile.open(other, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.mtime += 1
            tar.addfile(info, io.BytesIO(bytes(b ^ 0x5A for b in data)))
    os.replace(other, shard)
    got = epoch(str(tmp_path / "tars"), cache)
    with tarfile.open(shard) as tar:
        expected = {info.name: tar.extractfile(info).read() for info in tar.getmembers()}
    assert {f"{k}.jpg": v["jpg"] for k, v in got.items()} == {
        n: d for n, d in expected.items() if n.endswith(".jpg")
    }
    assert len(built(cache)) == 2  # the first version's and the new one's


def test_without_a_writable_cache_the_index_is_built_in_memory_with_one_warning(tmp_path, caplog):
    samples = foreign_tars(tmp_path / "tars")
    (tmp_path / "blocked").write_bytes(b"a file where the cache folder would go")
    ds = ShardDataset(
        [str(p) for p in sorted((tmp_path / "tars").glob("*.tar"))],
        decode=None,
        cache_dir=tmp_path / "blocked" / "cache",
        shuffle=False,
    )
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = {s["__key__"]: {"jpg": s["jpg"], "cls": s["cls"]} for s in ds}
    assert got == samples
    warnings = [r for r in caplog.records if "no cache for the sample indexes" in r.getMessage()]
    assert len(warnings) == 1


def test_index_of_tars_in_a_folder_it_cannot_write_warns_and_readers_build_the_indexes(tmp_path):
    preexec = permission_preexec(tmp_path)
    samples = foreign_tars(tmp_path / "data" / "ro")
    (tmp_path / "data" / "ro").chmod(0o555)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "shardstream.cli",
                "index",
                str(tmp_path / "data" / "ro"),
                "--output",
                str(tmp_path / "data"),
                "--quiet",
            ],
            capture_output=True,
            text=True,
            preexec_fn=preexec,
            timeout=120,
        )
    finally:
        (tmp_path / "data" / "ro").chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    assert "sample indexes of its tars could not be written" in proc.stderr
    assert "with their sample indexes" not in proc.stdout
    assert not [n for n in folder_files(tmp_path / "data") if n.endswith(".idx")]
    assert load_manifest(Store(str(tmp_path / "data"))).index_sha256 is None
    assert epoch(str(tmp_path / "data"), tmp_path / "cache") == samples
    assert len(built(tmp_path / "cache")) == 3
