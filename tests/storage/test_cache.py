"""DiskCache: atomic, shared by processes, bounded, never evicts what is read, survives crashes."""

from __future__ import annotations

import gc
import hashlib
import logging
import multiprocessing as mp
import os
import re
import signal
import time
from pathlib import Path

import pytest

from shardstream.errors import StorageError
from shardstream.storage import cache as cache_module
from shardstream.storage.cache import DiskCache, default_cache_dir

SIZE = 1000


def key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def blob(i: int, size: int = SIZE) -> bytes:
    return bytes([i % 256]) * size


def files(root: Path) -> list[str]:
    return sorted(os.listdir(root))


def test_a_miss_downloads_once_and_later_reads_hit(tmp_path):
    c = DiskCache(tmp_path, limit=10 * SIZE)
    calls = []

    def download():
        calls.append(1)
        return blob(1)

    assert bytes(c.get(key(1), download)) == blob(1)
    assert bytes(c.get(key(1), download)) == blob(1)
    assert bytes(c.open(key(1))) == blob(1)
    assert len(calls) == 1
    assert files(tmp_path) == [key(1) + ".shard"]
    assert c.usage() == SIZE


def test_an_absent_shard_is_none(tmp_path):
    assert DiskCache(tmp_path, limit=SIZE).open(key(9)) is None


def test_a_failed_download_leaves_nothing_and_the_next_one_works(tmp_path):
    c = DiskCache(tmp_path, limit=10 * SIZE)

    def broken():
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ConnectionResetError):
        c.get(key(1), broken)
    assert files(tmp_path) == []  # no partial file, nothing a reader could take for the shard
    assert bytes(c.get(key(1), lambda: blob(1))) == blob(1)


def test_empty_shards_are_cached(tmp_path):
    c = DiskCache(tmp_path, limit=SIZE)
    assert bytes(c.get(key(0), lambda: b"")) == b""
    assert bytes(c.get(key(0), lambda: pytest.fail("downloaded twice"))) == b""


def test_least_recently_used_shards_are_evicted_to_stay_under_the_limit(tmp_path):
    c = DiskCache(tmp_path, limit=3 * SIZE)
    for i in range(3):
        c.get(key(i), lambda i=i: blob(i))
        gc.collect()  # no mapping held: nothing is in use
        os.utime(c.path(key(i)), (time.time() - 100 + i, time.time() - 100 + i))
    c.open(key(0))  # a read makes 0 the most recently used
    gc.collect()
    c.get(key(3), lambda: blob(3))
    assert c.open(key(1)) is None  # the oldest unused one went
    assert c.usage() <= 3 * SIZE
    for i in (0, 2, 3):
        assert bytes(c.open(key(i))) == blob(i)


def test_a_shard_being_read_is_never_evicted(tmp_path):
    c = DiskCache(tmp_path, limit=2 * SIZE)
    held = c.get(key(0), lambda: blob(0))  # a reader maps it
    os.utime(c.path(key(0)), (1, 1))  # and it is the oldest
    c.get(key(1), lambda: blob(1))
    gc.collect()
    c.get(key(2), lambda: blob(2))
    gc.collect()
    assert os.path.exists(c.path(key(0)))
    assert bytes(held) == blob(0)
    assert c.open(key(1)) is None  # the unused one made room instead
    del held
    gc.collect()
    c.get(key(3), lambda: blob(3))
    assert c.open(key(0)) is None  # once released it can go


def test_a_limit_below_what_is_in_use_warns_and_still_works(tmp_path, caplog):
    c = DiskCache(tmp_path, limit=SIZE)
    first = c.get(key(0), lambda: blob(0))
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        second = c.get(key(1), lambda: blob(1))
    assert bytes(first) == blob(0) and bytes(second) == blob(1)
    assert "raise cache_limit" in caplog.text


def test_the_limit_warning_says_what_exceeds_the_limit(tmp_path, caplog):
    c = DiskCache(tmp_path, limit=SIZE * 3 // 2)
    first = c.get(key(0), lambda: blob(0))  # in use: one shard, within the limit
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        second = c.get(key(1), lambda: blob(1))  # it and the next do not fit
    assert bytes(first) == blob(0) and bytes(second) == blob(1)
    (message,) = [r.getMessage() for r in caplog.records]
    needed, limit = re.search(
        r"needs ([\d,]+) bytes .* cache_limit=([\d,]+) allows", message
    ).groups()
    assert int(needed.replace(",", "")) == 2 * SIZE > int(limit.replace(",", "")) == SIZE * 3 // 2
    assert f"{SIZE:,} in shards being read and {SIZE:,} for the shard arriving" in message


def test_files_that_are_not_shards_are_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_bytes(b"x" * 10 * SIZE)
    c = DiskCache(tmp_path, limit=2 * SIZE)
    for i in range(4):
        c.get(key(i), lambda i=i: blob(i))
        gc.collect()
    assert (tmp_path / "notes.txt").exists()
    assert c.usage() <= 2 * SIZE


def test_default_limit_is_half_the_free_space(tmp_path):
    stat = os.statvfs(tmp_path)
    limit = DiskCache(tmp_path).limit
    assert abs(limit - stat.f_bavail * stat.f_frsize // 2) < 64 << 20


def test_default_folder_is_per_user_under_the_temporary_folder():
    assert default_cache_dir().endswith(os.path.join(f"shardstream-{os.getuid()}", "cache"))


def test_bad_limit_and_unwritable_root(tmp_path):
    with pytest.raises(ValueError, match="cache_limit"):
        DiskCache(tmp_path, limit=0)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="choose another cache_dir"):
        DiskCache(tmp_path / "file" / "cache")


# -- several processes ---------------------------------------------------------------------


def _fetch_slowly(root: str, log: str, start: float) -> None:
    while time.time() < start:  # all begin together
        time.sleep(0.001)

    def download() -> bytes:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)
        return blob(7)

    data = DiskCache(root, limit=10 * SIZE).get(key(7), download)
    assert bytes(data) == blob(7)


def test_processes_that_need_one_shard_at_once_download_it_once(tmp_path):
    log = tmp_path / "downloads.log"
    root = tmp_path / "cache"
    ctx = mp.get_context("fork")
    start = time.time() + 0.3
    procs = [ctx.Process(target=_fetch_slowly, args=(str(root), str(log), start)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(log.read_text().split()) == 1
    assert files(root) == [key(7) + ".shard"]


def _download_forever(root: str, started) -> None:
    def download() -> bytes:
        started.set()
        time.sleep(60)
        return blob(5)

    DiskCache(root, limit=10 * SIZE).get(key(5), download)


def test_a_crash_mid_download_leaves_nothing_that_blocks_the_next_run(tmp_path, monkeypatch):
    ctx = mp.get_context("fork")
    started = ctx.Event()
    proc = ctx.Process(target=_download_forever, args=(str(tmp_path), started))
    proc.start()
    assert started.wait(20)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert [
        f for f in files(tmp_path) if f.endswith(".part")
    ]  # its partial download is still there...
    monkeypatch.setattr(cache_module, "_STALE_PART", 0.0)
    t0 = time.monotonic()
    assert bytes(DiskCache(tmp_path, limit=10 * SIZE).get(key(5), lambda: blob(5))) == blob(5)
    assert time.monotonic() - t0 < 10  # ...but it holds no lock: nobody waits for the dead process
    assert files(tmp_path) == [key(5) + ".shard"]


def test_abandoned_partial_downloads_are_cleared_by_eviction(tmp_path, monkeypatch):
    part = tmp_path / f".{key(3)}.part"
    part.write_bytes(b"half")
    monkeypatch.setattr(cache_module, "_STALE_PART", 0.0)
    DiskCache(tmp_path, limit=10 * SIZE).get(key(1), lambda: blob(1))
    assert not part.exists()


def _hold_and_die(root: str, ready) -> None:
    mapping = DiskCache(root, limit=10 * SIZE).open(key(2))
    assert mapping is not None
    ready.set()
    time.sleep(60)


def test_a_crashed_readers_shard_can_be_evicted(tmp_path):
    c = DiskCache(tmp_path, limit=SIZE)
    c.get(key(2), lambda: blob(2))
    gc.collect()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_and_die, args=(str(tmp_path), ready))
    proc.start()
    assert ready.wait(20)
    assert not c._evict(c.path(key(2)))  # in use by the child
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert c._evict(c.path(key(2)))  # its lock died with it
    assert c.open(key(2)) is None


def test_a_file_made_again_under_the_same_name_is_not_removed(tmp_path):
    from shardstream.storage.private import unlink_if_same as _unlink_if_same

    old = tmp_path / "x.shard"
    old.write_bytes(b"old")
    fd = os.open(old, os.O_RDONLY)
    try:
        os.unlink(old)
        old.write_bytes(b"new")  # another process's file now has the name
        _unlink_if_same(fd, str(old))
        assert old.read_bytes() == b"new"
    finally:
        os.close(fd)
    fd = os.open(old, os.O_RDONLY)
    try:
        _unlink_if_same(fd, str(old))
        assert not old.exists()
    finally:
        os.close(fd)


def test_a_download_finished_by_another_process_meanwhile_is_not_repeated(tmp_path, monkeypatch):
    c = DiskCache(tmp_path, limit=10 * SIZE)
    real_open = DiskCache.open
    calls = []

    def open_racing(self, key_, size=None, content=False):
        calls.append(1)
        if len(calls) == 2:  # just after the first look, another process finishes the download
            other = DiskCache(tmp_path, limit=10 * SIZE)
            monkeypatch.setattr(DiskCache, "open", real_open)
            other.get(key_, lambda: blob(4))
            monkeypatch.setattr(DiskCache, "open", open_racing)
        return real_open(self, key_, size, content)

    monkeypatch.setattr(DiskCache, "open", open_racing)
    got = c.get(key(4), lambda: pytest.fail("downloaded again"))
    assert bytes(got) == blob(4)
    assert files(tmp_path) == [key(4) + ".shard"]
