"""DiskCache trusts nothing it finds (issue 10): a private folder, checked keys, files of the wrong size
fetched again, failed downloads reported to those waiting, no failed read when the disk is full, trimmed
when readers let go."""

from __future__ import annotations

import errno
import gc
import hashlib
import logging
import multiprocessing as mp
import os
import stat
import tempfile

import pytest

from shardstream.errors import CorruptShardError, StorageError
from shardstream.storage import cache as cache_module
from shardstream.storage.cache import DiskCache, default_cache_dir

SIZE = 1000


def key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def blob(i: int, size: int = SIZE) -> bytes:
    return bytes([i % 256]) * size


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def never() -> bytes:
    raise AssertionError("downloaded although it should not have been")


# -- a private folder ---------------------------------------------------------------------------------------


def test_a_new_cache_folder_and_its_files_are_private(tmp_path):
    c = DiskCache(tmp_path / "a" / "cache", limit=10 * SIZE)
    assert mode(c.root) == 0o700
    c.get(key(1), lambda: blob(1))
    assert mode(c.path(key(1))) == 0o600


def test_the_default_folder_and_its_parent_are_made_private(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    c = DiskCache(limit=10 * SIZE)
    assert c.root == default_cache_dir() and c.root.startswith(str(tmp_path))
    assert mode(c.root) == 0o700 and mode(os.path.dirname(c.root)) == 0o700


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o755, 0o750, 0o777])
def test_a_folder_other_users_can_reach_is_refused(tmp_path, bits):
    planted = tmp_path / "cache"
    planted.mkdir()
    # ours, but open to others: they may have planted shards in it, or can read ours
    os.chmod(planted, bits)
    with pytest.raises(
        StorageError,
        match=r"cannot use the shard cache .*cache: other users can reach it "
        r"\(mode 0\d+\); run 'chmod 700 .*choose another cache_dir",
    ):
        DiskCache(planted, limit=SIZE)
    assert mode(planted) == bits  # not changed behind the user's back


def test_a_forged_shard_in_a_shared_folder_is_never_served(tmp_path):
    shared = tmp_path / "cache"
    shared.mkdir()
    # another user's plant, right name
    (shared / f"{key(1)}.shard").write_bytes(b"FORGED!".ljust(SIZE, b"!"))
    os.chmod(shared, 0o777)
    with pytest.raises(StorageError, match="other users can reach it"):
        DiskCache(shared, limit=10 * SIZE).get(key(1), lambda: blob(1))


def test_the_default_folder_left_readable_by_an_earlier_version_is_made_private(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = default_cache_dir()
    os.makedirs(root)
    os.chmod(root, 0o755)
    os.chmod(os.path.dirname(root), 0o755)
    DiskCache(limit=SIZE)
    assert mode(root) == 0o700 and mode(os.path.dirname(root)) == 0o700
    # writable by the group: it may hold anything, so it is refused, default or not
    os.chmod(root, 0o775)
    with pytest.raises(StorageError, match="other users can reach it"):
        DiskCache(limit=SIZE)


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    (tmp_path / "cache").mkdir(mode=0o700)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)  # as seen by that other user
    with pytest.raises(
        StorageError,
        match=r"cache: it belongs to another user \(uid \d+\).*choose another cache_dir",
    ):
        DiskCache(tmp_path / "cache", limit=SIZE)


def test_a_link_as_the_cache_folder_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(real)
    with pytest.raises(
        StorageError, match="cache: it is a symbolic link; choose another cache_dir"
    ):
        DiskCache(tmp_path / "cache", limit=SIZE)


def test_a_link_in_place_of_a_shard_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(blob(9))
    c = DiskCache(tmp_path / "cache", limit=10 * SIZE)
    os.symlink(outside, c.path(key(1)))
    assert c.open(key(1)) is None
    assert bytes(c.get(key(1), lambda: blob(1))) == blob(1)
    assert outside.read_bytes() == blob(9) and not os.path.islink(c.path(key(1)))


# -- keys ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "../" + "p" * 61,
        "/tmp/" + "p" * 59,
        "a" * 63,
        "A" * 64,
        "g" * 64,
        key(1) + "\n",
        "." * 64,
        "",
    ],
)
def test_only_sha256_hex_keys_name_files(tmp_path, bad):
    c = DiskCache(tmp_path / "cache", limit=10 * SIZE)
    before = sorted(os.listdir(tmp_path))
    for use in (lambda: c.get(bad, never), lambda: c.open(bad), lambda: c.path(bad)):
        with pytest.raises(StorageError, match="is not a shard cache key"):
            use()
    # nothing made anywhere
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(c.root) == []


# -- wrong sizes ------------------------------------------------------------------------------------------


def test_a_truncated_cached_shard_is_downloaded_again(tmp_path, caplog):
    c = DiskCache(tmp_path, limit=10 * SIZE)
    c.get(key(1), lambda: blob(1), size=SIZE)
    gc.collect()
    with open(c.path(key(1)), "r+b") as f:
        f.truncate(SIZE // 2)  # a crash of the disk, a full disk, a hand
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert bytes(c.get(key(1), lambda: blob(1), size=SIZE)) == blob(1)
    assert "downloading it again" in caplog.text
    assert os.path.getsize(c.path(key(1))) == SIZE
    assert bytes(c.get(key(1), never, size=SIZE)) == blob(1)  # and later reads use it


def test_a_download_of_the_wrong_size_never_enters_the_cache(tmp_path):
    c = DiskCache(tmp_path, limit=10 * SIZE)
    with pytest.raises(CorruptShardError, match=f"{SIZE - 1} bytes for a shard of {SIZE}"):
        c.get(key(1), lambda: blob(1, SIZE - 1), size=SIZE)
    assert not os.path.exists(c.path(key(1)))


# -- a failed download is reported to those waiting ---------------------------------------------------------


def _download_then_fail(root: str, claimed, go) -> None:
    def download() -> bytes:
        claimed.set()
        assert go.wait(30)
        raise StorageError(
            "cannot read s3://b/x.tar: the request timed out (gave up after 6 attempts)"
        )

    try:
        DiskCache(root, limit=10 * SIZE).get(key(7), download)
    except StorageError:
        os._exit(0)
    os._exit(1)


def test_processes_waiting_for_a_download_that_fails_get_its_error_without_trying_again(
    tmp_path, monkeypatch
):
    ctx = mp.get_context("fork")
    claimed, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_download_then_fail, args=(str(tmp_path), claimed, go))
    proc.start()
    try:
        assert claimed.wait(30)
        # only the failure waited for counts here
        monkeypatch.setattr(cache_module, "_FAILED_FOR", 0.0, raising=False)
        real_wait = DiskCache._wait_for

        def wait_for(part: str) -> None:
            go.set()  # the downloader may fail now: this process waits for it
            real_wait(part)

        monkeypatch.setattr(DiskCache, "_wait_for", staticmethod(wait_for))
        with pytest.raises(
            StorageError,
            match=r"cannot read s3://b/x.tar: the request timed out \(gave up after 6 "
            r"attempts\) \(the same download failed in another process",
        ):
            DiskCache(tmp_path, limit=10 * SIZE).get(key(7), never)
    finally:
        go.set()
        proc.join(30)
    assert proc.exitcode == 0
    assert mode(tmp_path / f".{key(7)}.failed") == 0o600


def test_a_recent_failure_is_reported_for_a_short_time_then_tried_again(tmp_path, monkeypatch):
    c = DiskCache(tmp_path, limit=10 * SIZE)

    def damaged() -> bytes:
        raise CorruptShardError(
            "s3://b/x.tar: its sha256 differs from the manifest's on each of 6 downloads"
        )

    with pytest.raises(CorruptShardError, match="each of 6 downloads$"):
        c.get(key(3), damaged)
    with pytest.raises(
        CorruptShardError, match=r"each of 6 downloads \(the same download failed in another"
    ):
        DiskCache(tmp_path, limit=10 * SIZE).get(key(3), never)  # a newcomer a moment later
    monkeypatch.setattr(cache_module, "_FAILED_FOR", 0.0, raising=False)  # some time later
    assert bytes(c.get(key(3), lambda: blob(3))) == blob(3)
    assert not (tmp_path / f".{key(3)}.failed").exists()  # a success forgets the failure


def test_an_interrupted_download_is_not_reported_as_a_failure(tmp_path):
    c = DiskCache(tmp_path, limit=10 * SIZE)

    def interrupted() -> bytes:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        c.get(key(4), interrupted)
    assert os.listdir(tmp_path) == []
    assert bytes(c.get(key(4), lambda: blob(4))) == blob(4)


# -- no space: the checked bytes are returned all the same ------------------------------------------------


def test_no_space_to_cache_a_shard_returns_its_bytes_with_one_warning(
    tmp_path, monkeypatch, caplog
):
    """Simulated by making ``posix_fallocate`` fail as a full disk does (no tmpfs can be mounted here)."""

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    c = DiskCache(tmp_path, limit=10 * SIZE)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert bytes(c.get(key(1), lambda: blob(1))) == blob(1)
        assert bytes(c.get(key(2), lambda: blob(2))) == blob(2)
        # others needing it meanwhile read it into memory too, side by side, rather than waiting in turn
        assert bytes(DiskCache(tmp_path, limit=10 * SIZE).get(key(1), lambda: blob(1))) == blob(1)
    warnings = [r for r in caplog.records if "cannot keep shards" in r.getMessage()]
    assert len(warnings) == 1 and "no space left" in warnings[0].getMessage()
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".shard", ".part"))]


def test_no_space_while_writing_returns_the_bytes_too(tmp_path, monkeypatch):
    real_write = os.write

    def write(fd, data):
        if os.fstat(fd).st_size == 0 and len(data) == SIZE:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return real_write(fd, data)

    # file systems without it: the write is where space runs out
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    monkeypatch.setattr(os, "write", write)
    assert bytes(DiskCache(tmp_path, limit=10 * SIZE).get(key(1), lambda: blob(1))) == blob(1)


# -- trimmed when readers let go, and when opened --------------------------------------------------------


def test_the_cache_is_trimmed_when_readers_let_go_of_their_shards(tmp_path):
    c = DiskCache(tmp_path, limit=2 * SIZE)
    held = [c.get(key(i), lambda i=i: blob(i)) for i in range(5)]  # all in use: nothing can go
    assert c.usage() == 5 * SIZE
    del held
    gc.collect()
    assert c.usage() <= 2 * SIZE  # without another download


def test_the_cache_is_trimmed_when_it_is_opened(tmp_path):
    big = DiskCache(tmp_path, limit=10 * SIZE)
    for i in range(6):
        big.get(key(i), lambda i=i: blob(i))
    gc.collect()
    assert big.usage() == 6 * SIZE
    DiskCache(tmp_path, limit=3 * SIZE)
    assert big.usage() <= 3 * SIZE
