"""Pool shapes on 2 and 3 real gloo processes: the ranks agree on each pool's batch count, so every
rank yields the same number of batches although their samples need different counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from shardstream import ShardDataset
from shardstream.dataset.batches.bucketed import Bucketed, length_of
from shardstream.dataset.batches.sequence_packing import SequencePacking
from tests.sample_datasets import key_of, write_dataset

N = 36


def skewed(i: int) -> dict:
    """Short sequences first, long ones after (unshuffled: the first rank's are short)."""
    return {"__key__": key_of(i), "ids.npy": np.arange(1 + i % 2 if i < N // 3 else 10 + i % 7)}


def _rank(rank: int, world: int, url: str, init: str, out: str) -> None:
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:

        def ds() -> ShardDataset:
            return ShardDataset(url, fields={"input_ids": "ids.npy"}, shuffle=False)

        packed = SequencePacking(ds(), 20, window=6, num_workers=0)
        buckets = Bucketed(ds(), length_of("input_ids"), [5, 13], 3, window=6, num_workers=0)
        got = {
            "packed": [[k for row in b["__key__"] for k in row] for b in packed],
            "buckets": [list(b["__key__"]) for b in buckets],
        }
        Path(out, f"{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_yield_equal_batch_counts(tmp_path, world):
    import torch.multiprocessing as mp

    url = write_dataset(tmp_path, [12, 12, 12], make=skewed, name="skewed")
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(_rank, args=(world, url, f"file://{tmp_path}/init", str(out)), nprocs=world, join=True)
    ranks = [json.loads((out / f"{r}.json").read_text()) for r in range(world)]
    for shape in ("packed", "buckets"):
        assert len({len(g[shape]) for g in ranks}) == 1  # equal batch counts
        assert all(batch for g in ranks for batch in g[shape])  # never an empty batch
        read = sorted(k for g in ranks for b in g[shape] for k in b)
        assert read == [key_of(i) for i in range(N)]


def test_the_agreed_integer_lives_where_the_backend_takes_it(monkeypatch):
    """NCCL alone reduces CUDA tensors only (a CPU tensor fails there): the integer goes to the current
    CUDA device for it, and stays on the CPU for gloo and for a mixed group. (No GPU here: the CUDA device
    index is stood in for.)"""
    import torch

    from shardstream.dataset.ranks import agree, reduce_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert reduce_device("nccl") == torch.device("cuda", 3)
    assert reduce_device("gloo") == torch.device("cpu")
    assert reduce_device("cpu:gloo,cuda:nccl") == torch.device("cpu")
    assert agree(7, "max") == 7 and agree(7, "min") == 7  # no process group: the value itself
