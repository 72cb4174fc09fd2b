"""A ShardMap batch (a sampler's indexes through ``__getitems__``: one ranged GET per sample, at once) from
a bucket whose answers sometimes fail: each failed request is made again alone, with the whole retry
budget, so a fault in every attempt of the batch as a whole still ends in the exact samples, and the
requests that succeeded are never sent again. A stalled request times out alone."""

from __future__ import annotations

import random

import pytest

import shardstream
from shardstream import ShardMap, StorageSettings
from shardstream.dataset.shards import sparse
from tests.sample_datasets import RUN, make_files

from .proxy import s3_error

SHARDS, PER_SHARD, PICKED = 4, 64, 8  # 8 of 64 samples per shard: sparse, read by ranged GETs
BATCH = SHARDS * PICKED
TAR_GET = rf"shard-\d{{6}}{RUN}\.tar(\?|$)"  # the shards' GETs, not their sample indexes'

FAULTS = {
    "503": {"kind": "status", "status": 503, "body": s3_error("SlowDown")},
    "reset": {"kind": "reset"},
    "cut-body": {"kind": "truncate", "nbytes": 100},
    "damaged-body": {"kind": "short", "nbytes": 100},
    "stall": {"kind": "stall", "seconds": 60},
}
# A stalled request must time out well before its stall ends; every other request must not time out on a
# loaded machine (32 at once to one local server), or it would be sent again and the count below be off.
TIMEOUT = {"stall": 6.0}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_batch_with_a_fault_in_each_attempt_reads_exactly(
    s3_bucket, tmp_path, proxied, monkeypatch, fault
):
    monkeypatch.setattr(sparse, "SMALL_SHARD", 0)  # the test's shards are small
    rng = random.Random(7)
    files = {f"s/{i:04d}.bin": rng.randbytes(2000) for i in range(SHARDS * PER_SHARD)}
    url = s3_bucket.url("ds")
    shardstream.pack(
        make_files(tmp_path / "src", files),
        url,
        storage_options=s3_bucket.storage_options,
        samples_per_shard=PER_SHARD,
        shuffle=False,
        progress=False,
    )
    via = proxied(s3_bucket)
    # six attempts of the batch as a whole (retries=5) would each meet one of these: it would fail
    for attempt in range(6):
        spec = dict(FAULTS[fault])
        via.proxy.inject(spec.pop("kind"), method="GET", path=TAR_GET, after=BATCH * attempt, times=1, **spec)  # fmt: skip
    m = ShardMap(
        url,
        decode=None,
        storage=StorageSettings(
            options=via.storage_options,
            cache_dir=str(tmp_path / "cache"),
            retries=5,
            timeout=TIMEOUT.get(fault, 60.0),
        ),
    )
    picked = [
        s * PER_SHARD + j for s in range(SHARDS) for j in rng.sample(range(PER_SHARD), PICKED)
    ]
    got = m.__getitems__(picked)
    keys = list(files)
    assert [s["__key__"] for s in got] == [keys[i][: -len(".bin")] for i in picked]
    assert [bytes(s["bin"]) for s in got] == [files[keys[i]] for i in picked]
    # the one failed request again, alone: the batch's other requests were not sent twice
    assert via.proxy.count("GET", TAR_GET) == BATCH + 1
    assert not any(m._open().shards.is_open(s) for s in range(SHARDS))  # all by ranged reads
