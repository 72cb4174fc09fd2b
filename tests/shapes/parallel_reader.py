"""Run by torchrun from test_parallel.py: 4 processes as a DP 2 x TP 2 device mesh read a ShardDataset
and a per-source MixedDataset with ``Parallel.from_mesh``; then each saves its state after one batch
and a DP-4 reader (every process its own data-parallel rank) resumes from it.

    torchrun --nproc-per-node=4 parallel_reader.py ROOT OUT

Rank 0 writes ``OUT/result.json``: per process its mesh coordinates, the keys read in the full epoch,
the mix's batches, and the keys read after resuming on DP 4.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from shardstream.dataset import MixedDataset, ShardDataset
from shardstream.dataset.batches.bucketed import Bucketed, aspect_ratio, length_of
from shardstream.dataset.batches.sequence_packing import SequencePacking
from shardstream.dataset.parallel import Parallel

BATCH = 3


def keys(loader, limit=None) -> list[list[str]]:
    out = []
    for n, batch in enumerate(loader, 1):
        out.append(list(batch["__key__"]))
        if n == limit:
            break
    return out


def main() -> None:
    root, out = sys.argv[1], sys.argv[2]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallel = Parallel.from_mesh(mesh, dp="dp")
    data = os.path.join(root, "data")
    ds = ShardDataset(data, decode=None, seed=3, parallel=parallel)
    epoch = keys(ds.loader(BATCH, num_workers=1))
    sources = [ShardDataset(os.path.join(root, n), decode=None, seed=k) for k, n in enumerate("ab")]
    mix = MixedDataset(
        sources, [0.6, 0.4], batching="per_source", batch_size=BATCH, parallel=parallel
    )
    mixed = keys(mix.loader(BATCH, num_workers=0))
    stopped = ShardDataset(data, decode=None, seed=3, parallel=parallel).loader(BATCH, 0)
    first = keys(stopped, limit=1)
    state = json.loads(json.dumps(stopped.state_dict()))
    pure_dp = Parallel(dp_rank=dist.get_rank(), dp_size=dist.get_world_size())
    resumed = ShardDataset(data, decode=None, seed=3, parallel=pure_dp).loader(BATCH, 1)
    resumed.load_state_dict(state)
    seqs = os.path.join(root, "seqs")
    fields = {"input_ids": "ids.npy"}
    packing = SequencePacking(
        ShardDataset(seqs, fields=fields, shuffle=False, parallel=parallel),
        24,
        window=8,
        num_workers=0,
    )
    packed = [[k for row in b["__key__"] for k in row] for b in packing]
    bucketing = Bucketed(
        ShardDataset(seqs, fields=fields, shuffle=False, parallel=parallel),
        length_of("input_ids"),
        [4, 16],
        batch_size=4,
        window=8,
        num_workers=1,
    )
    buckets = [list(b["__key__"]) for b in bucketing]
    pics = os.path.join(root, "pics")

    def by_aspect(parallel: Parallel) -> Bucketed:
        ds = ShardDataset(pics, decode=None, seed=5, parallel=parallel)
        return Bucketed(ds, aspect_ratio("jpg"), [0.8, 1.25], batch_size=3, num_workers=1)

    aspect = by_aspect(parallel)
    planned = [list(b["__key__"]) for b in aspect]
    stopped_aspect = by_aspect(parallel)
    planned_first = keys(stopped_aspect, limit=2)
    resumed_aspect = by_aspect(pure_dp)
    resumed_aspect.load_state_dict(json.loads(json.dumps(stopped_aspect.state_dict())))
    record = {
        "packed": packed,
        "buckets": buckets,
        "rank": dist.get_rank(),
        "dp": [parallel.dp_rank, parallel.dp_size],
        "tp": mesh.get_local_rank("tp"),
        "len": len(ds),
        "epoch": epoch,
        "mix": mixed,
        "first": first,
        "state": state,
        "resumed": keys(resumed),
        "planned_up_front": aspect.planned_up_front,
        "planned": planned,
        "planned_first": planned_first,
        "planned_resumed": keys(resumed_aspect),
    }
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)
    if dist.get_rank() == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
