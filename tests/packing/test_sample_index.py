"""pack(index=...): sample indexes of tar shards (in ``.shardstream/`` beside them), staged and published
with them."""

from __future__ import annotations

import hashlib

import pytest
from click.testing import CliRunner

import shardstream
from shardstream.cli import cli
from shardstream.formats.tar_index import parse_index
from shardstream.manifest import dataset_store, load_manifest
from shardstream.manifest.side_names import index_name
from tests.folders import folder_files, indexed
from tests.sample_datasets import without_run


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "src"
    for i in range(9):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i:02d}.txt").write_text("x" * (100 * i + 1))
    return src


def indexes(dest) -> list[str]:
    """The sample indexes anywhere under ``dest`` (beside the shards as well as in ``.shardstream/``)."""
    return [n for n in folder_files(dest) if n.endswith(".idx")]


def _check(url: str) -> None:
    store = dataset_store(url)
    manifest = load_manifest(store)
    assert manifest.index_sha256 is not None and len(manifest.index_sha256) == manifest.num_shards
    for i, path in enumerate(manifest.paths):
        raw = bytes(store.read_bytes(index_name(path)))
        assert hashlib.sha256(raw).hexdigest() == manifest.index_sha256[i]
        parse_index(raw, path, int(manifest.stored_counts[i]), int(manifest.nbytes[i]))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_local_pack_with_index_publishes_checked_indexes_and_no_staged_files(
    folder, tmp_path, workers
):
    dest = tmp_path / "ds"
    shardstream.pack(folder, dest, samples_per_shard=4, workers=workers, index=True, progress=False)
    _check(str(dest))
    names = [without_run(n) for n in folder_files(dest)]
    assert names == sorted(["_manifest.json", *indexed(*(f"shard-00000{i}.tar" for i in range(3)))])


def test_local_packs_have_indexes_by_default_unless_asked_not_to_compressed_shards_too(
    folder, tmp_path
):
    plain = shardstream.pack(folder, tmp_path / "a", samples_per_shard=4, progress=False).manifest
    bare = shardstream.pack(
        folder, tmp_path / "c", samples_per_shard=4, index=False, progress=False
    ).manifest
    zst = shardstream.pack(
        folder, tmp_path / "b", samples_per_shard=4, compression="zstd", progress=False
    ).manifest
    assert plain.index_sha256 is not None and len(plain.index_sha256) == len(plain.paths)
    assert indexes(tmp_path / "a") == sorted(index_name(path) for path in plain.paths)
    assert bare.index_sha256 is None and not indexes(tmp_path / "c")
    # a compressed shard's index: offsets in its tar, each member's checksum
    assert zst.index_sha256 is not None and len(zst.index_sha256) == len(zst.paths)
    assert indexes(tmp_path / "b") == sorted(index_name(path) for path in zst.paths)


def test_a_repack_without_index_clears_the_old_indexes(folder, tmp_path):
    dest = tmp_path / "ds"
    shardstream.pack(folder, dest, samples_per_shard=4, index=True, progress=False)
    shardstream.pack(folder, dest, samples_per_shard=4, overwrite=True, index=False, progress=False)
    assert not indexes(dest)


def test_the_cli_packs_with_index(folder, tmp_path):
    result = CliRunner().invoke(
        cli,
        [
            "pack",
            str(folder),
            str(tmp_path / "ds"),
            "--samples-per-shard",
            "4",
            "--index",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    _check(str(tmp_path / "ds"))


def test_the_fast_folder_path_writes_the_index_the_tar_writer_would(folder, tmp_path):
    import io
    import tarfile

    from shardstream.formats import tar as tar_format

    dest = tmp_path / "ds"
    shardstream.pack(folder, dest, samples_per_shard=4, index=True, progress=False)
    for shard in sorted(dest.glob("*.tar")):
        sink = io.BytesIO()
        writer = tar_format.TarShardWriter(sink, index=True)
        with tarfile.open(shard) as t:
            members = t.getmembers()
            samples: dict[str, list] = {}
            for m in members:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, []).append((ext, t.extractfile(m).read()))
        for key, fields in samples.items():
            writer.add(key, fields)
        writer.close()
        assert sink.getvalue() == shard.read_bytes()
        assert writer.index.to_bytes() == (dest / index_name(shard.name)).read_bytes()
