"""Run by torchrun from test_ddp_bucket.py: every rank reads a dataset from a bucket through ShardDataset.loader.

    torchrun --nproc-per-node=N ddp_bucket_reader.py URL OUT --endpoint-url http://127.0.0.1:P --cache-dir DIR

Rank and world size come from torch.distributed (gloo). For two epochs, each rank counts its
batches and collects the sample keys it read; ``all_gather_object`` brings them to rank 0,
which writes ``OUT/result.json``: {"world_size", "len", "epochs": [[{"rank", "keys", "batches"}, ...], ...]}.
"""

from __future__ import annotations

import argparse
import json
import os

import torch.distributed as dist

from shardstream.dataset import ShardDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    ds = ShardDataset(args.dataset, seed=args.seed, decode=None, storage_options={"endpoint_url": args.endpoint_url},
                      cache_dir=args.cache_dir)
    loader = ds.loader(batch_size=args.batch_size, num_workers=args.workers)
    result: dict = {"world_size": world_size, "len": len(ds), "epochs": []}
    for epoch in range(2):
        ds.set_epoch(epoch)
        keys: list[str] = []
        batches = 0
        for batch in loader:
            keys += batch["__key__"]
            batches += 1
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, {"rank": rank, "keys": keys, "batches": batches})
        result["epochs"].append(gathered)
    if rank == 0:
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
