"""Run by torchrun from test_ddp.py: two ranks follow a dataset's versions (``on_new_version="next_epoch"``)
while a version is published between their looks at the latest one.

    torchrun --nproc-per-node=2 version_reader.py DATASET MORE OUT

Epoch 0 reads version 1. Before epoch 1, rank 0 looks at the latest version (1) and then waits at a
barrier inside its agreement; rank 1 passes that barrier, appends MORE (version 2), and looks (2). The
ranks must agree on version 1 for epoch 1 (the oldest latest seen), then read version 2 in epoch 2.
Rank 0 writes OUT/result-versions.json: per epoch, each rank's version and keys.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

import shardstream as ss
from shardstream.dataset import shard_dataset


def main() -> None:
    dataset, more, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    agree = shard_dataset.agreed_version

    def look_then_wait(version: int) -> int:  # rank 0: its look is done; rank 1 publishes now
        dist.barrier()
        return agree(version)

    ds = ss.ShardDataset(dataset, on_new_version="next_epoch", decode=None, seed=5)
    loader = ds.loader(batch_size=2, num_workers=0)
    epochs = []
    for epoch in range(3):
        if epoch == 1:
            if rank == 0:
                shard_dataset.agreed_version = look_then_wait
            else:
                dist.barrier()
                ss.pack(more, dataset, samples_per_shard=3, progress=False, workers=1, append=True)
        keys = [k for batch in loader for k in batch["__key__"]]
        shard_dataset.agreed_version = agree
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {"version": ds.manifest.version, "keys": keys})
        epochs.append(gathered)
    if rank == 0:
        with open(f"{out}/result-versions.json", "w") as f:
            json.dump(epochs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
