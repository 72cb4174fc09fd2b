"""What an epoch's start asks of object storage, counted at the server: ranks × workers on one host.

The manifest's head is read once per rank (it is the one mutable name, with one more GET that finds no
newer version); the shard table, the tars' sample indexes and whole shards, named by their content, once
per host through the private cache; nothing is listed, nothing asked for its size first.
Real rank processes (``RANK``/``WORLD_SIZE``) with worker processes each, against moto through the
counting proxy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import shardstream
from shardstream.manifest import load_manifest, write_manifest
from shardstream.storage import Store
from tests.remote.endpoints import DUMMY_AWS_ENV
from tests.sample_datasets import make_files

RANKS, WORKERS = 4, 2
SCRIPT = Path(__file__).with_name("startup_rank.py")
ROOT = Path(__file__).resolve().parents[2]


def kind(target: str) -> str:
    """What a request was for, by the object it names."""
    path = target.split("?", 1)[0]
    if "list-type" in target or re.search(r"[?&](prefix|delimiter)=", target):
        return "list"
    if path.endswith("_manifest.json"):
        return "manifest"
    if "/.shardstream/versions/" in path or "/_versions/" in path:
        return "version"
    if "/.shardstream/shards-" in path or "/_shards-" in path:
        return "shard table"
    if path.endswith(".idx"):
        return "sample index"
    if path.endswith(".tar"):
        return "shard"
    return path


def whole_shard(range_header: str | None, sizes: dict[str, int], target: str) -> bool:
    """Whether a GET of a shard asks for all of it (not one sample of it)."""
    name = target.split("?", 1)[0].rsplit("/", 1)[-1]
    if range_header is None:
        return True
    first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d*)", range_header).groups(default="-1"))
    return first == 0 and (last == -1 or last + 1 == sizes[name])


def start_ranks(bucket, cache: Path) -> list[list[str]]:
    env = {**os.environ, **DUMMY_AWS_ENV, "WORLD_SIZE": str(RANKS)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                bucket.url("ds"),
                json.dumps(bucket.storage_options),
                str(cache),
                str(WORKERS),
            ],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(RANKS)
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_an_epoch_start_reads_the_table_and_indexes_once_per_host_and_lists_nothing(
    s3_bucket, proxied, tmp_path
):
    make_files(tmp_path / "src", {f"s{i:03d}.txt": os.urandom(50 + i) for i in range(160)})
    shardstream.pack(
        tmp_path / "src",
        s3_bucket.url("ds"),
        storage_options=s3_bucket.storage_options,
        samples_per_shard=8,
        progress=False,
    )
    store = Store(s3_bucket.url("ds"), s3_bucket.storage_options)
    manifest = load_manifest(store)
    write_manifest(
        store, manifest, table_threshold=1
    )  # as a large dataset's: its columns in a table
    bucket = proxied(s3_bucket)
    firsts = start_ranks(bucket, tmp_path / "cache")
    assert len({k for keys in firsts for k in keys}) == RANKS * 8  # each rank its own first batch
    seen = Counter(kind(s.target) for s in bucket.proxy.log if s.method in ("GET", "HEAD"))
    per_object = Counter(s.target.split("?")[0] for s in bucket.proxy.log if s.method == "GET")
    assert seen["list"] == 0
    assert seen["manifest"] == RANKS  # the head: once per rank
    assert seen["version"] == RANKS  # and whether a newer version was published since: one GET
    assert seen["shard table"] == 1  # once per host
    indexes = [t for t in per_object if t.endswith(".idx")]
    assert indexes and all(per_object[t] == 1 for t in indexes)  # each once per host
    # whole shards: once per host (the rest are single samples of the first batches, by range); a
    # download called off after its bytes arrived is kept for the processes waiting on it
    sizes = {path: int(n) for path, n in zip(manifest.paths, manifest.nbytes)}
    whole = Counter(
        s.target.rsplit("/", 1)[-1]
        for s in bucket.proxy.log
        if kind(s.target) == "shard" and whole_shard(s.range, sizes, s.target)
    )
    assert len(whole) == manifest.num_shards and max(whole.values()) == 1, whole
    assert {kind(s.target) for s in bucket.proxy.log} <= {
        "manifest",
        "version",
        "shard table",
        "sample index",
        "shard",
    }
