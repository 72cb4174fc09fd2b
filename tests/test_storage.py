"""Store: one folder on local disk or fsspec (memory://), atomic writes, StorageError naming the path."""

from __future__ import annotations

import errno
import os
import tempfile
import uuid

import pytest

from shardstream.errors import StorageError
from shardstream.storage import Store, is_url


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    return Store(f"memory://storage-test-{uuid.uuid4().hex}/store")


@pytest.fixture
def private_tempdir(tmp_path, monkeypatch):
    """Point the tempfile module (used to spool uploads) at an empty folder we can inspect."""
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    return spool


def test_local_and_memory_are_recognised(tmp_path):
    assert Store(tmp_path).local
    assert Store(f"file://{tmp_path}").local
    assert Store(f"file://{tmp_path}").root == str(tmp_path)
    assert not Store("memory://bucket/x").local
    assert is_url("memory://bucket/x")
    assert is_url("s3://bucket/x")
    assert not is_url("/tmp/x")
    assert not is_url("file:///tmp/x")


def test_write_read_exists_size(store):
    assert not store.exists("a.bin")
    store.write_bytes("a.bin", b"hello")
    assert store.exists("a.bin")
    assert store.size("a.bin") == 5
    assert bytes(store.read_bytes("a.bin")) == b"hello"


def test_empty_file(store):
    store.write_bytes("empty", b"")
    assert store.exists("empty")
    assert store.size("empty") == 0
    assert bytes(store.read_bytes("empty")) == b""


def test_nested_names_create_folders(store):
    store.write_bytes("a/b/c.txt", b"xyz")
    assert bytes(store.read_bytes("a/b/c.txt")) == b"xyz"
    assert store.size("a/b/c.txt") == 3


def test_overwrite_replaces_content(store):
    store.write_bytes("f", b"old content")
    store.write_bytes("f", b"new")
    assert bytes(store.read_bytes("f")) == b"new"


def test_large_binary_round_trip(store):
    data = os.urandom(3 << 20)
    store.write_bytes("big.bin", data)
    assert store.size("big.bin") == len(data)
    assert bytes(store.read_bytes("big.bin")) == data


def test_list_files(store):
    assert store.list_files() == []  # folder does not exist yet
    assert store.list_files(recursive=True) == []
    for name in ["b.txt", "a.txt", "sub/c.txt", "sub/deeper/d.txt", "été.txt"]:
        store.write_bytes(name, name.encode())
    assert store.list_files() == ["a.txt", "b.txt", "été.txt"]
    assert store.list_files(recursive=True) == ["a.txt", "b.txt", "sub/c.txt", "sub/deeper/d.txt", "été.txt"]


def test_remove(store):
    store.write_bytes("x", b"1")
    store.write_bytes("y", b"2")
    store.remove("x")
    assert not store.exists("x")
    assert store.list_files() == ["y"]
    store.remove("x")  # removing what is not there is fine
    assert store.list_files() == ["y"]


def test_makedirs_and_is_dir(tmp_path):
    store = Store(tmp_path / "new" / "folder")
    assert not store.is_dir()
    store.makedirs()
    assert store.is_dir()
    assert (tmp_path / "new" / "folder").is_dir()


def test_url_of_names_the_object(tmp_path):
    local = Store(tmp_path)
    assert local.url_of("a/b.tar") == os.path.join(str(tmp_path), "a", "b.tar")
    mem = Store("memory://bucket/ds/")
    assert mem.url == "memory://bucket/ds"
    assert mem.url_of("a/b.tar") == "memory://bucket/ds/a/b.tar"


def test_local_reads_are_memory_maps_without_copy(tmp_path):
    store = Store(tmp_path)
    store.write_bytes("m.bin", b"abc" * 1000)
    data = store.read_bytes("m.bin")
    assert memoryview(data)[:3] == b"abc"
    assert len(data) == 3000


def test_open_write_streams_and_publishes_on_success(store, private_tempdir):
    with store.open_write("out.bin") as f:
        f.write(b"part1-")
        f.write(memoryview(b"part2"))
        assert not store.exists("out.bin")  # nothing visible before the block ends
    assert bytes(store.read_bytes("out.bin")) == b"part1-part2"
    assert store.list_files(recursive=True) == ["out.bin"]
    assert list(private_tempdir.iterdir()) == []


class Boom(Exception):
    pass


def test_open_write_is_atomic_when_the_block_raises(store, private_tempdir):
    with pytest.raises(Boom), store.open_write("sub/out.bin") as f:
        f.write(b"half of the data")
        raise Boom
    assert not store.exists("sub/out.bin")
    assert store.list_files(recursive=True) == []  # no temporary file beside the target
    assert list(private_tempdir.iterdir()) == []  # nor a spooled upload left behind


def test_failed_open_write_keeps_the_previous_content(store, private_tempdir):
    store.write_bytes("keep.bin", b"original")
    with pytest.raises(Boom), store.open_write("keep.bin") as f:
        f.write(b"replacement")
        raise Boom
    assert bytes(store.read_bytes("keep.bin")) == b"original"
    assert store.list_files(recursive=True) == ["keep.bin"]
    assert list(private_tempdir.iterdir()) == []


def test_local_open_write_uses_a_hidden_temp_file_beside_the_target(tmp_path):
    store = Store(tmp_path)
    with store.open_write("x.tar") as f:
        f.write(b"data")
        leftovers = [p.name for p in tmp_path.iterdir()]
        assert len(leftovers) == 1
        assert leftovers[0].startswith(".x.tar.") and leftovers[0].endswith(".tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tar"]


@pytest.mark.parametrize("op", ["read_bytes", "size"])
def test_missing_file_gives_storage_error_naming_it(store, op):
    with pytest.raises(StorageError) as info:
        getattr(store, op)("missing/file.tar")
    assert store.url_of("missing/file.tar") in str(info.value)


def test_missing_local_file_says_what_is_wrong(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(StorageError, match="cannot read .*nope.tar: no such file or folder"):
        store.read_bytes("nope.tar")


def test_missing_remote_file_says_what_is_wrong():
    store = Store(f"memory://storage-test-{uuid.uuid4().hex}/store")
    with pytest.raises(StorageError, match="no such file"):
        store.read_bytes("nope.tar")


def test_reading_a_folder_is_a_storage_error(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(StorageError, match="sub"):
        Store(tmp_path).read_bytes("sub")


def test_writing_below_a_regular_file_is_a_storage_error(tmp_path):
    (tmp_path / "blocker").write_bytes(b"i am a file")
    store = Store(tmp_path)
    with pytest.raises(StorageError) as info:
        store.write_bytes("blocker/shard.tar", b"data")
    assert str(tmp_path / "blocker" / "shard.tar") in str(info.value)
    assert (tmp_path / "blocker").read_bytes() == b"i am a file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


def test_store_whose_root_is_below_a_regular_file(tmp_path):
    (tmp_path / "blocker").write_bytes(b"")
    store = Store(tmp_path / "blocker" / "ds")
    with pytest.raises(StorageError) as info:
        store.write_bytes("_manifest.json", b"{}")
    assert str(tmp_path / "blocker" / "ds") in str(info.value)
    with pytest.raises(StorageError, match="blocker"):
        store.makedirs()


def test_os_errors_raised_inside_open_write_become_storage_errors(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(StorageError, match="cannot write .*out.bin"), store.open_write("out.bin"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_no_space_error_names_a_fix(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(StorageError, match="no space left on the device; free some space"), \
            store.open_write("out.bin"):
        raise OSError(errno.ENOSPC, "No space left on device")
