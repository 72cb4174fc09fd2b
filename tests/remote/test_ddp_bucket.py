"""Real multi-process DDP reading from an S3 bucket: torchrun starts gloo ranks on this machine, each reading
the moto bucket (through the fault proxy, which counts the requests) with its own DataLoader worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sample_datasets import key_of, write_dataset

from .endpoints import free_port

SCRIPT = Path(__file__).with_name("ddp_bucket_reader.py")
BATCH = 4


def torchrun(nproc: int, url: str, out: Path, *args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
               "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(SCRIPT), url, str(out), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired as exc:  # a hang is exactly what equal per-rank work must prevent
        pytest.fail(f"torchrun timed out after 180 s\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, f"torchrun failed ({done.returncode})\n{done.stdout}\n{done.stderr[-6000:]}"
    return json.loads((out / "result.json").read_text())


def test_ranks_read_a_bucket_in_equal_batches_covering_every_sample(s3_bucket, proxied, tmp_path):
    counts = [1, 13, 4, 9, 2, 11, 6]  # 46 samples in 7 uneven shards: 46 = 3 * 16 - 2
    n, world = sum(counts), 3
    salt = uuid.uuid4().hex  # content of this test only: no shard cache anywhere can hold it
    local = Path(write_dataset(tmp_path / "local", counts, make=lambda i: {"__key__": key_of(i),
                                                                            "txt": f"sample {i} {salt}"}))
    for path in sorted(local.iterdir()):
        s3_bucket.write(f"ddp/{path.name}", path.read_bytes())
    via = proxied(s3_bucket)
    out = tmp_path / "out"
    out.mkdir()
    result = torchrun(world, s3_bucket.url("ddp"), out, "--endpoint-url", via.endpoint_url,
                      "--cache-dir", str(tmp_path / "cache"), "--batch-size", str(BATCH))
    per_rank = -(-n // world)
    assert result["world_size"] == world and result["len"] == per_rank
    padding = world * per_rank - n
    orders = []
    for gathered in result["epochs"]:
        assert [g["rank"] for g in gathered] == list(range(world))
        assert {g["batches"] for g in gathered} == {-(-per_rank // BATCH)}  # the same on every rank
        assert all(len(g["keys"]) == per_rank for g in gathered)
        read = [k for g in gathered for k in g["keys"]]
        counted = Counter(read)
        assert set(counted) == {key_of(i) for i in range(n)}
        assert sum(c - 1 for c in counted.values()) == padding
        orders.append(read)
    assert orders[0] != orders[1]  # a new shuffle in the second epoch
    # every shard came from the bucket, and the ranks shared one cache on this host: each object fetched once
    gets = Counter(s.target for s in via.proxy.log if s.method == "GET" and s.target.endswith(".tar"))
    assert set(gets) == {f"/{s3_bucket.name}/ddp/shard-{i:06d}.tar" for i in range(len(counts))}
    assert max(gets.values()) == 1, gets
