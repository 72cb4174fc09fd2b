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
    assert store.list_files(recursive=True) == [
        "a.txt",
        "b.txt",
        "sub/c.txt",
        "sub/deeper/d.txt",
        "été.txt",
    ]


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
    with (
        pytest.raises(StorageError, match="no space left on the device; free some space"),
        store.open_write("out.bin"),
    ):
        raise OSError(errno.ENOSPC, "No space left on device")


# -- remote requests: retries, timeouts, protocols -------------------------------------------


class Flaky:
    """Fails with ``errors`` in turn, then returns ``value``; counts calls."""

    def __init__(self, errors, value="ok"):
        self.errors = list(errors)
        self.value = value
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.value


class HTTPStatusError(Exception):
    def __init__(self, status):
        super().__init__(f"HTTP {status}")
        self.status = status


HTTPStatusError.__module__ = "aiohttp.client_exceptions"  # as the network stack raises them


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionResetError("reset"), True),
        (TimeoutError(), True),
        (OSError(errno.EIO, "i/o"), True),
        (HTTPStatusError(503), True),
        (HTTPStatusError(429), True),
        (HTTPStatusError(500), True),
        (FileNotFoundError("x"), False),
        (PermissionError("denied"), False),
        (HTTPStatusError(403), False),
        (HTTPStatusError(404), False),
        (ValueError("bad"), False),
        (KeyError("bug"), False),  # not from the network: a bug, never retried
    ],
)
def test_transient_errors_are_told_from_permanent_ones(exc, transient):
    from shardstream.storage import is_transient

    assert is_transient(exc) is transient


def test_transient_errors_are_retried_until_they_pass():
    from shardstream.storage import RetryPolicy

    fn = Flaky([ConnectionResetError("reset"), TimeoutError()])
    assert RetryPolicy(retries=2, backoff=0.001).call(fn, lambda: "read x") == "ok"
    assert fn.calls == 3


def test_retries_give_up_with_an_error_naming_what_failed():
    from shardstream.storage import RetryPolicy

    fn = Flaky([ConnectionResetError("connection reset by peer")] * 10)
    with pytest.raises(
        StorageError, match=r"cannot read s3://b/x: .*reset.*gave up after 3 attempts"
    ):
        RetryPolicy(retries=2, backoff=0.001).call(fn, lambda: "cannot read s3://b/x")
    assert fn.calls == 3


def test_permanent_errors_are_not_retried():
    from shardstream.storage import RetryPolicy

    fn = Flaky([FileNotFoundError("gone")])
    with pytest.raises(FileNotFoundError):
        RetryPolicy(retries=5, backoff=0.001).call(fn, lambda: "x")
    assert fn.calls == 1


def test_backoff_doubles_up_to_its_limit_with_jitter():
    from shardstream.storage import RetryPolicy

    policy = RetryPolicy(backoff=0.1, max_backoff=0.5)
    waits = [policy.wait(a) for a in range(6)]
    assert 0.05 <= waits[0] <= 0.1
    assert 0.1 <= waits[1] <= 0.2
    assert all(0.25 <= w <= 0.5 for w in waits[3:])
    assert policy.time_limit(0) == 60.0
    assert policy.time_limit(10 << 20) == pytest.approx(70.0)
    assert RetryPolicy(timeout=None).time_limit(1 << 30) is None
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(timeout=0)


def test_a_remote_read_survives_transient_errors(monkeypatch):
    from shardstream.storage import RetryPolicy

    store = Store(
        f"memory://storage-test-{uuid.uuid4().hex}/s", retry=RetryPolicy(retries=3, backoff=0.001)
    )
    store.write_bytes("a.bin", b"payload" * 100)
    real = store.fs.cat_file
    failures = Flaky([ConnectionResetError("reset"), OSError(errno.EIO, "broken pipe")])

    def flaky_cat(path, **kwargs):
        if failures.errors:
            failures()
        return real(path, **kwargs)

    monkeypatch.setattr(store.fs, "cat_file", flaky_cat)
    assert bytes(store.read_bytes("a.bin")) == b"payload" * 100
    assert failures.calls == 2


def test_a_large_object_of_known_size_comes_in_ranged_parts(monkeypatch):
    from shardstream.storage import fsspec_store

    monkeypatch.setattr(fsspec_store, "PART_SIZE", 1000)
    store = Store(f"memory://storage-test-{uuid.uuid4().hex}/s")
    data = bytes(range(256)) * 15  # 3,840 bytes: 4 parts
    store.write_bytes("big", data)
    calls = []
    real = store.fs.cat_ranges

    def spy(paths, starts, ends, **kwargs):
        calls.append((starts, ends))
        return real(paths, starts, ends, **kwargs)

    monkeypatch.setattr(store.fs, "cat_ranges", spy)
    assert bytes(store.read_bytes("big", nbytes=len(data))) == data
    assert calls == [([0, 1000, 2000, 3000], [1000, 2000, 3000, 3840])]


def test_http_is_read_only():
    store = Store("http://127.0.0.1:9/datasets/x")
    assert store.read_only
    for write in (lambda: store.write_bytes("a", b"x"), lambda: store.remove("a"), store.makedirs):
        with pytest.raises(StorageError, match="read-only"):
            write()


def test_a_remote_store_reconnects_after_pickling_and_in_forked_children():
    import pickle

    store = Store(f"memory://storage-test-{uuid.uuid4().hex}/s")
    store.write_bytes("a", b"1")
    copy = pickle.loads(pickle.dumps(store))
    assert copy._fs is None  # a filesystem object (its event loop) never travels
    assert bytes(copy.read_bytes("a")) == b"1"
    store._pid = -1  # as in a child forked after the filesystem was made
    before = store._fs
    store.fs  # noqa: B018 - reconnects
    assert store._pid == os.getpid() and store._fs is not None and before is not None


def test_bad_storage_options_name_the_url():
    store = Store("s3://bucket/x", {"endpoint_url": "http://127.0.0.1:9", "no_such_option": 1})
    with pytest.raises(
        StorageError,
        match=r"cannot read s3://bucket/x/a: .*no_such_option.*check the storage options",
    ):
        store.read_bytes("a")  # s3fs hands its options to the client only when it first connects


@pytest.mark.parametrize(
    ("url", "flags", "expected"),
    [
        (
            "s3://b/x",
            {"endpoint_url": "http://127.0.0.1:9000"},
            {"endpoint_url": "http://127.0.0.1:9000"},
        ),
        ("s3://b/x", {"anon": True, "profile": "dev"}, {"anon": True, "profile": "dev"}),
        (
            "gs://b/x",
            {"endpoint_url": "http://127.0.0.1:4443", "anon": True},
            {"endpoint_url": "http://127.0.0.1:4443", "token": "anon"},
        ),
        ("https://host/x", {"anon": True}, {}),
        ("/local/x", {}, {}),
    ],
)
def test_connection_flags_become_each_protocols_storage_options(url, flags, expected):
    from shardstream.storage import connection_options

    assert connection_options(url, **flags) == expected


@pytest.mark.parametrize(
    ("url", "flags"),
    [
        ("/local/x", {"endpoint_url": "http://e"}),
        ("https://host/x", {"endpoint_url": "http://e"}),
        ("gs://b/x", {"profile": "dev"}),
    ],
)
def test_connection_flags_that_do_not_apply_are_refused(url, flags):
    from shardstream.storage import connection_options

    with pytest.raises(StorageError, match="applies to"):
        connection_options(url, **flags)


def test_failed_ranges_returned_as_values_are_raised_and_retried(monkeypatch):
    """fsspec before 2026.6 hands failed parts back in the result list instead of raising."""
    from shardstream.storage import RetryPolicy

    store = Store(
        f"memory://storage-test-{uuid.uuid4().hex}/s", retry=RetryPolicy(retries=2, backoff=0.001)
    )
    store.write_bytes("a", b"x" * 100)
    real = store.fs.cat_ranges
    calls = []

    def old_fsspec(paths, starts, ends, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return [ConnectionResetError("reset by peer")]
        return real(paths, starts, ends, **kwargs)

    monkeypatch.setattr(store.fs, "cat_ranges", old_fsspec)
    assert bytes(store.read_bytes("a", nbytes=100)) == b"x" * 100
    assert len(calls) == 2


def test_s3_errors_that_a_retry_cannot_fix_are_permanent():
    from shardstream.storage import is_transient

    class ClientError(Exception):
        def __init__(self, status):
            super().__init__(f"HTTP {status}")
            self.response = {"ResponseMetadata": {"HTTPStatusCode": status}}

    def translated(errno_, status):  # what s3fs raises: an OSError caused by botocore's ClientError
        exc = OSError(errno_, "some message")
        exc.__cause__ = ClientError(status)
        return exc

    assert not is_transient(translated(errno.EINVAL, 400))  # InvalidBucketName, InvalidArgument...
    assert not is_transient(translated(errno.EIO, 301))  # PermanentRedirect: a wrong region
    assert is_transient(translated(errno.EBUSY, 503))  # SlowDown
    assert not is_transient(OSError(errno.EINVAL, "invalid request"))
    assert not is_transient(OSError(errno.ENOSYS, "not implemented"))
    assert is_transient(OSError(errno.EBUSY, "slow down"))


def test_backoff_jitter_leaves_the_global_generator_alone():
    import random

    from shardstream.storage import RetryPolicy

    random.seed(11)
    expected = random.random()
    random.seed(11)
    RetryPolicy().wait(3)
    assert random.random() == expected  # workers seed it for the user's augmentations


def test_multi_line_messages_become_one_line():
    from shardstream.storage import describe_os_error

    assert describe_os_error(OSError(errno.EBUSY, "Slow\nDown  please")) == "slow down please"
    assert describe_os_error(OSError("Forbidden: x\nmore")) == "Forbidden: x more"
