"""Store (issue 10): names stay inside the store, the caller's exceptions pass through open_write, uploads
spool to an unnamed file, one client per store however many threads ask."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
import uuid

import pytest

from shardstream.errors import StorageError
from shardstream.storage import Store
from shardstream.storage.fsspec_store import FsspecStore


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    return Store(f"memory://storage-trust-{uuid.uuid4().hex}/store")


@pytest.fixture
def private_tempdir(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    return spool


ESCAPES = [
    "../x.tar",
    "a/../../x.tar",
    "..",
    "/etc/passwd",
    "//other-bucket/x",
    "s3://other-bucket/x.tar",
    "a\\..\\..\\x",
    "",
    "a/\0",
]


@pytest.mark.parametrize("name", ESCAPES)
def test_names_that_leave_the_store_are_refused(store, tmp_path, name):
    for use in (
        store.path,
        store.url_of,
        store.read_bytes,
        store.exists,
        store.size,
        lambda n: store.write_bytes(n, b"x"),
        store.remove,
    ):
        with pytest.raises(StorageError, match="is not a name inside .*without '..' segments"):
            use(name)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere


def test_an_absolute_name_never_selects_another_bucket():
    store = Store("s3://bucket/ds", {"endpoint_url": "http://127.0.0.1:9"})
    assert store.path("a/shard-000000.tar") == "bucket/ds/a/shard-000000.tar"
    for name in (
        "/other-bucket/secret.tar",
        "../../other-bucket/secret.tar",
        "s3://other-bucket/secret.tar",
    ):
        with pytest.raises(StorageError, match="is not a name inside s3://bucket/ds"):
            store.path(name)


def test_ordinary_names_still_work(store):
    store.write_bytes("a/b..c/.hidden..tar", b"x")
    assert bytes(store.read_bytes("a/b..c/.hidden..tar")) == b"x"


def test_the_callers_own_exception_passes_through_open_write(store):
    with pytest.raises(ValueError, match="the caller's own"), store.open_write("out.bin") as f:
        f.write(b"data")
        raise ValueError("the caller's own")
    assert not store.exists("out.bin")


def test_an_os_error_of_another_file_inside_open_write_is_the_callers(store, tmp_path):
    with pytest.raises(FileNotFoundError), store.open_write("out.bin"):
        (
            tmp_path / "no-such-source.jpg"
        ).read_bytes()  # reading the caller's source, not writing the shard


def test_the_shards_own_write_errors_are_storage_errors(store):
    with (
        pytest.raises(StorageError, match=r"cannot write .*out.bin: no space left"),
        store.open_write("out.bin"),
    ):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_an_upload_spools_to_a_file_no_kill_can_leave_behind(private_tempdir):
    store = Store(f"memory://storage-trust-{uuid.uuid4().hex}/store")
    with store.open_write("out.bin") as f:
        f.write(b"x" * 1000)
        # unnamed from the start: nothing for a kill -9 to leave
        assert list(private_tempdir.iterdir()) == []
    assert bytes(store.read_bytes("out.bin")) == b"x" * 1000
    assert list(private_tempdir.iterdir()) == []


def test_threads_needing_a_client_after_fork_make_one(monkeypatch):
    store = Store(f"memory://storage-trust-{uuid.uuid4().hex}/store")
    made = []
    real = FsspecStore._connect

    def slow_connect(self):
        made.append(threading.current_thread().name)
        time.sleep(0.05)  # widen the window in which the others would connect too
        return real(self)

    monkeypatch.setattr(FsspecStore, "_connect", slow_connect)
    store._pid = -1  # as in a child forked after the client was made
    barrier = threading.Barrier(8)
    clients = []

    def use() -> None:
        barrier.wait()
        clients.append(store.fs)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 1 and len(clients) == 8 and len({id(c) for c in clients}) == 1


def test_s3_without_credentials_is_one_line_naming_the_ways_to_give_them(tmp_path):
    """botocore's 'Unable to locate credentials' becomes the variables, --profile and --anon (checked before
    any request, so no server is needed: the endpoint is a closed port)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        HOME=str(tmp_path),
    )
    shardstream = os.path.join(os.path.dirname(sys.executable), "shardstream")
    out = subprocess.run(
        [shardstream, "info", "s3://some-bucket/ds", "--endpoint-url", "http://127.0.0.1:9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for words in (
        "s3://some-bucket/ds",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "--profile",
        "--anon",
    ):
        assert words in lines[0]
