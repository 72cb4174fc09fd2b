"""The shard cache when its folder goes away or its disk is full: a folder removed (a temporary-file
cleaner) before or during a download is made again, or the shard is read from memory; a cached shard
whose check record is gone is checked again, even where no record can be written. Nothing raw (a
``FileNotFoundError``, an ``OSError`` of no space) reaches the reader."""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import shutil

import pytest

from shardstream.storage import checked
from shardstream.storage.cache import DiskCache
from tests.oslimits import leave_free, tiny_tmpfs


def shard(i: int, size: int = 5000) -> tuple[str, bytes]:
    data = bytes([i % 251]) * size
    return hashlib.sha256(data).hexdigest(), data


def test_a_cache_folder_removed_between_downloads_is_made_again(tmp_path):
    root = tmp_path / "cache"
    cache = DiskCache(root, limit=1 << 20)
    for i in range(3):
        key, data = shard(i)
        assert bytes(cache.get(key, lambda d=data: d, size=len(data), content=True)) == data
        assert (root / f"{key}.shard").exists()  # kept: the folder was made again
        shutil.rmtree(root)
    gc.collect()


def test_a_cache_folder_removed_during_a_download_leaves_the_shard_in_memory(tmp_path, caplog):
    root = tmp_path / "cache"
    cache = DiskCache(root, limit=1 << 20)
    key, data = shard(1)

    def download() -> bytes:
        shutil.rmtree(root)  # a cleaner, while the bytes are on their way
        return data

    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert bytes(cache.get(key, download, size=len(data), content=True)) == data
        key2, data2 = shard(2)
        assert bytes(cache.get(key2, lambda: data2, size=len(data2), content=True)) == data2
    assert (root / f"{key2}.shard").exists()  # the next download made the folder again
    assert not caplog.records  # nothing to say: the cache works again


def test_check_records_removed_mid_run_are_made_again(tmp_path):
    root = tmp_path / "cache"
    cache = DiskCache(root, limit=1 << 20)
    key, data = shard(3)
    bytes(cache.get(key, lambda: data, size=len(data), content=True))
    gc.collect()
    shutil.rmtree(root / checked.FOLDER)  # this process made it: it thinks it is there
    found = DiskCache(root, limit=1 << 20).open(key, len(data), content=True)
    assert found is not None and bytes(found) == data
    assert list((root / checked.FOLDER).glob("*.ok"))  # checked again, and recorded


def test_a_check_that_cannot_be_recorded_on_a_full_disk_runs_unrecorded(tmp_path):
    with tiny_tmpfs(tmp_path / "disk", "256k") as disk:
        root = disk / "cache"
        cache = DiskCache(root, limit=1 << 20)
        key, data = shard(4)
        bytes(cache.get(key, lambda: data, size=len(data), content=True))
        gc.collect()
        shutil.rmtree(root / checked.FOLDER)  # records gone (an upgrade, a cleaner)
        os.mkdir(root / checked.FOLDER, 0o700)
        leave_free(disk, 0)  # a record's file can be made, not written
        for _ in range(2):  # no record kept: checked each time, served each time
            found = DiskCache(root, limit=1 << 20).open(key, len(data), content=True)
            assert found is not None and bytes(found) == data
            del found
            gc.collect()
        # a damaged one is still refused (and removed)
        with open(root / f"{key}.shard", "r+b") as f:
            f.write(b"X")
        assert DiskCache(root, limit=1 << 20).open(key, len(data), content=True) is None
        assert not (root / f"{key}.shard").exists()


def test_an_unsafe_record_folder_is_still_refused(tmp_path):
    from shardstream.errors import StorageError

    root = tmp_path / "cache"
    cache = DiskCache(root, limit=1 << 20)
    key, data = shard(5)
    bytes(cache.get(key, lambda: data, size=len(data), content=True))
    gc.collect()
    shutil.rmtree(root / checked.FOLDER)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", root / checked.FOLDER)
    checked._READY.discard(str(root / checked.FOLDER))
    with pytest.raises(StorageError, match="symbolic link"):
        DiskCache(root, limit=1 << 20).open(key, len(data), content=True)
