"""DataLoader workers forked from a process that talked to object storage: the parent's clients (their
sessions and pooled connections belong to the parent's event loop, which has no thread in a worker) are
never closed from a worker's own loop, so a worker prints no asyncio "Task exception was never retrieved
... attached to a different loop", and reads the data exactly.

The parent's connections must be pooled for the old clients to have anything to close: moto's server
closes each connection after its response, so the bucket is read through the fault proxy, which keeps
them alive as S3 services do."""

from __future__ import annotations

import logging
import os
import random

import shardstream
from shardstream.dataset import ShardDataset
from shardstream.dataset.shards import ranged
from tests.sample_datasets import make_files


def test_forked_workers_leave_the_parents_clients_alone(
    s3_bucket, proxied, tmp_path, capfd, monkeypatch
):
    monkeypatch.setattr(
        ranged, "PROBE_SECONDS", 30.0
    )  # ranged reads in the workers, even on a busy machine
    rng = random.Random(9)
    files = {f"{i:03d}.bin": rng.randbytes(2000) for i in range(64)}
    src = make_files(tmp_path / "src", files)
    shardstream.pack(
        src,
        s3_bucket.url("ds"),
        storage_options=s3_bucket.storage_options,
        samples_per_shard=8,
        index=True,
        progress=False,
    )
    expected = sorted(name[: -len(".bin")] for name in files)
    # asyncio's reports from the workers, to this process's stderr (pytest's log capture would keep them)
    handler = logging.StreamHandler(os.fdopen(os.dup(2), "w", buffering=1))
    monkeypatch.setattr(logging.getLogger("asyncio"), "handlers", [handler])
    bucket = proxied(s3_bucket)
    for run, workers in enumerate([0, 2]):  # the parent reads first: its connections are pooled
        ds = ShardDataset(
            bucket.url("ds"),
            storage_options=bucket.storage_options,
            cache_dir=str(tmp_path / f"cache-{run}"),  # nothing cached: every run downloads
            decode=None,
            seed=1,
        )
        keys = [k for batch in ds.loader(8, num_workers=workers) for k in batch["__key__"]]
        assert sorted(keys) == expected
    err = capfd.readouterr().err
    assert "never retrieved" not in err and "different loop" not in err, err


def test_a_forked_child_never_closes_its_parents_client(s3_bucket, proxied, capfd):
    """The mechanism, deterministically: a store used in the parent (a pooled connection), a forked child
    that reads through it (a client of its own) and collects garbage on its fsspec loop thread, where the
    parent's client was closed on the child's loop."""
    import asyncio
    import gc
    import sys

    import fsspec.asyn

    from shardstream.storage import Store

    bucket = proxied(s3_bucket)
    store = Store(bucket.url("x"), bucket.storage_options)
    store.write_bytes("a", b"hello")
    assert store.read_bytes("a") == b"hello"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            logged: list[str] = []  # asyncio's own reports ("Task exception was never retrieved")
            handler = logging.Handler()
            handler.emit = lambda record: logged.append(record.getMessage())
            logging.getLogger("asyncio").addHandler(handler)
            ok = store.read_bytes("a") == b"hello"

            async def collect() -> None:
                gc.collect()
                await asyncio.sleep(0.2)  # a close task scheduled by a finalizer runs and ends

            fsspec.asyn.sync(fsspec.asyn.get_loop(), collect)
            gc.collect()
            code = 3 if logged else 0 if ok else 2
            if logged:
                print(logged, file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.read_bytes("a") == b"hello"  # the parent's client still works
    err = capfd.readouterr().err
    assert "never retrieved" not in err and "different loop" not in err, err
