"""A local shard read through its sample index (``.shardstream/<shard>.idx``) is checked against its tar
headers first, once per host for each version of the file: an index never lets through what the header parse would
refuse, and never hands out another sample's bytes under a key."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

import shardstream as ss
from shardstream.errors import CorruptShardError
from shardstream.formats import tar as tar_format
from shardstream.formats.tar_index import parse_index
from shardstream.manifest import dataset_store, load_manifest
from shardstream.manifest.side_names import index_name
from tests.sample_datasets import make_files


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The host-wide check records (in the default cache folder) of this test alone."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    return temp


def packed(tmp_path: Path, keys: list[str] | None = None) -> tuple[Path, dict[str, bytes]]:
    """A dataset of 24 samples (4 shards of 6) with sample indexes; and each key's bytes."""
    rng = random.Random(7)
    keys = keys or [f"{i:03d}" for i in range(24)]
    files = {f"{k}.bin": rng.randbytes(100 + 37 * i) for i, k in enumerate(keys)}
    src = make_files(tmp_path / "src", files)
    dest = tmp_path / "ds"
    ss.pack(src, dest, samples_per_shard=6, index=True, shuffle=False, progress=False, workers=1)
    return dest, {name[: -len(".bin")]: data for name, data in files.items()}


def read_all(dest: Path) -> dict[str, bytes]:
    return {s["__key__"]: s["bin"] for s in ss.ShardDataset(str(dest), shuffle=False)}


def shard_file(dest: Path, i: int = 1) -> Path:
    return dest / load_manifest(dataset_store(str(dest))).paths[i]


def rewrite(path: Path, data: bytes) -> None:
    """``data`` in place of the file (a new version of it: another inode)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_intact_shards_read_through_their_index_as_packed(tmp_path):
    dest, expected = packed(tmp_path)
    assert read_all(dest) == expected


def test_a_shard_with_its_samples_in_another_order_is_an_error_not_other_samples_bytes(tmp_path):
    """The same bytes in another sample order (same size, every header valid): the header parse reads
    each key's own bytes; the index, unchecked, gave every sample another sample's bytes under its key."""
    dest, _ = packed(tmp_path)
    path = shard_file(dest)
    data = path.read_bytes()
    index = parse_index((path.parent / index_name(path.name)).read_bytes(), "idx", 6, len(data))
    spans = [index.span(i) for i in range(len(index))]
    reordered = b"".join(data[a:b] for a, b in reversed(spans)) + data[spans[-1][1] :]
    assert len(reordered) == len(data) and reordered != data
    rewrite(path, reordered)
    with pytest.raises(CorruptShardError) as caught:
        read_all(dest)
    message = str(caught.value)
    assert str(path) in message and "disagree with its sample index" in message
    assert "sample 0 (at byte 0) is '011' in the tar, '006' in its index" in message


def test_a_damaged_header_is_the_header_parse_error_even_with_an_index(tmp_path):
    """One byte of a member's name changed (same size): the header parse refuses the checksum; the index
    used to read on as if nothing had happened."""
    dest, _ = packed(tmp_path)
    path = shard_file(dest, 2)
    data = bytearray(path.read_bytes())
    members = list(tar_format.iter_members(bytes(data), "shard"))
    header = members[1][1] - 512  # the second member's header
    data[header + 2] ^= 0x01
    rewrite(path, bytes(data))
    with pytest.raises(CorruptShardError) as caught:
        read_all(dest)
    assert str(path) in str(caught.value) and f"bad tar header at byte {header}" in str(
        caught.value
    )


def test_data_after_the_end_of_archive_marker_is_refused_with_an_index_too(tmp_path):
    dest, _ = packed(tmp_path)
    path = shard_file(dest, 3)
    data = bytearray(path.read_bytes())
    data[-600] = 1  # inside the end-of-archive marker: same size
    rewrite(path, bytes(data))
    with pytest.raises(CorruptShardError) as caught:
        read_all(dest)
    # what the header parse says of it: a block that is not zero where the marker starts
    assert str(path) in str(caught.value)
    assert f"bad tar header at byte {len(data) - 1024}" in str(caught.value)


def test_long_keys_take_the_careful_path_and_read_as_packed(tmp_path):
    """Names over 100 bytes (a ustar prefix, or PAX headers): the header parse compares them."""
    long_keys = [f"{'d' * 60}/{'k' * 70}{i:03d}" for i in range(12)]
    long_keys += [f"{'x' * 150}{i:03d}" for i in range(12)]
    dest, expected = packed(tmp_path, long_keys)
    assert read_all(dest) == expected


def test_plain_shards_take_the_vectorised_path(tmp_path):
    """Shards as packed are accepted by the numpy check alone (the header parse is the rare path)."""
    from shardstream.formats import index_check

    dest, _ = packed(tmp_path)
    manifest = load_manifest(dataset_store(str(dest)))
    for i, rel in enumerate(manifest.paths):
        data = (dest / rel).read_bytes()
        index = parse_index(
            (dest / index_name(rel)).read_bytes(), rel, manifest.stored_counts[i], len(data)
        )
        assert index_check._plain_match(data, index)


def test_checked_once_per_host_for_each_version_of_the_file(tmp_path, monkeypatch, own_cache):
    """The check runs once per version of each shard file, whatever the number of readers (its record is
    in the private cache folder's ``checked/``); a file replaced since is checked again."""
    from shardstream.dataset.shards import checked_index

    dest, expected = packed(tmp_path)
    calls: list[str] = []
    real = checked_index.check_index

    def counted(data, index, name):
        calls.append(name)
        real(data, index, name)

    monkeypatch.setattr(checked_index, "check_index", counted)
    assert read_all(dest) == expected
    assert len(calls) == 4  # each shard once
    records = list((own_cache / f"shardstream-{os.getuid()}" / "cache" / "checked").iterdir())
    assert len(records) == 4
    assert read_all(dest) == expected and read_all(dest) == expected
    assert len(calls) == 4  # recorded: not checked again
    path = shard_file(dest, 0)
    rewrite(path, path.read_bytes())  # the same bytes, another version of the file
    assert read_all(dest) == expected
    assert calls[4:] == [str(path)]


def test_a_failed_check_is_not_recorded(tmp_path):
    dest, _ = packed(tmp_path)
    path = shard_file(dest)
    data = bytearray(path.read_bytes())
    data[2] ^= 0x01
    rewrite(path, bytes(data))
    for _ in range(2):
        with pytest.raises(CorruptShardError):
            read_all(dest)
