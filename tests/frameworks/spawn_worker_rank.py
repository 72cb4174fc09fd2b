"""One rank of a Lightning-style launch (WORLD_SIZE and LOCAL_RANK set, no RANK; the process group made
later, here by hand), reading through a StatefulDataLoader whose workers are spawned: the workers have
no process group and must still know this process's rank. Writes the keys it read to ``argv[2]``."""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.dataset import ShardDataset

if __name__ == "__main__":
    url, out = sys.argv[1], sys.argv[2]
    rank = int(os.environ["LOCAL_RANK"])
    ds = ShardDataset(url, seed=5, decode=None)  # made before the process group exists
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    loader = StatefulDataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    keys = [k for batch in loader for k in batch["__key__"]]
    with open(out, "w") as f:
        json.dump(keys, f)
    dist.barrier()
    dist.destroy_process_group()
