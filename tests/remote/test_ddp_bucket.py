"""Real multi-process DDP reading from an S3 bucket: torchrun starts gloo ranks on this machine, each reading
the moto bucket (through the fault proxy, which counts the requests) with its own DataLoader worker.
The ranks run tests/ddp/ddp_reader.py, as the local-disk DDP tests do."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from pathlib import Path

from tests.ddp.test_ddp import BATCH, check_epochs, torchrun
from tests.folders import folder_files
from tests.sample_datasets import key_of, write_dataset


def whole(range_header: str | None, size: int) -> bool:
    """Whether a GET asks for all of an object (not one sample of it)."""
    if range_header is None:
        return True
    first, last = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header).groups()
    return int(first) == 0 and (not last or int(last) + 1 == size)


def test_ranks_read_a_bucket_in_equal_batches_covering_every_sample(s3_bucket, proxied, tmp_path):
    counts = [1, 13, 4, 9, 2, 11, 6]  # 46 samples in 7 uneven shards: 46 = 3 * 16 - 2
    salt = uuid.uuid4().hex  # content of this test only: no shard cache anywhere can hold it
    local = Path(
        write_dataset(
            tmp_path / "local",
            counts,
            make=lambda i: {"__key__": key_of(i), "txt": f"sample {i} {salt}"},
        )
    )
    for name in folder_files(local):  # the shards, the manifest and .shardstream/ (their indexes)
        s3_bucket.write(f"ddp/{name}", (local / name).read_bytes())
    via = proxied(s3_bucket)
    out = tmp_path / "out"
    out.mkdir()
    result = torchrun(
        3,
        s3_bucket.url("ddp"),
        out,
        "--mode",
        "epochs",
        "--endpoint-url",
        via.endpoint_url,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--batch-size",
        str(BATCH),
    )
    check_epochs(result, sum(counts), 3)
    # every shard came from the bucket, and the ranks shared one cache on this host: each object fetched once
    # (whole: the first batches' single samples come by ranged reads through the sample indexes)
    sizes = {f"/{s3_bucket.name}/ddp/{p.name}": p.stat().st_size for p in local.glob("*.tar")}
    gets = Counter(
        s.target
        for s in via.proxy.log
        if s.method == "GET" and s.target.endswith(".tar") and whole(s.range, sizes[s.target])
    )
    assert set(gets) == {f"/{s3_bucket.name}/ddp/shard-{i:06d}.tar" for i in range(len(counts))}
    assert max(gets.values()) == 1, gets
