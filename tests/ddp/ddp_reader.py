"""Run by torchrun from test_ddp.py: every rank reads a dataset through ShardDataset.loader.

    torchrun --nproc-per-node=N ddp_reader.py DATASET OUT --mode epochs|stop|resume
        [--endpoint-url http://127.0.0.1:P --cache-dir DIR]   (a dataset in an S3 bucket)

Rank and world size come from torch.distributed (gloo). Each rank counts its batches and
collects the sample keys it read; the keys and counts are gathered with
``all_gather_object`` and rank 0 writes ``OUT/result-<mode>.json``:

- ``epochs``: two full epochs (``set_epoch(0)``, ``set_epoch(1)``).
- ``stop``: ``--stop-after`` batches of epoch 0; rank 0 also writes ``OUT/state.json``.
- ``resume``: loads ``OUT/state.json`` and reads the rest of that epoch.
"""

from __future__ import annotations

import argparse
import json
import os

import torch.distributed as dist

from shardstream.dataset import ShardDataset


def gather(record: dict) -> list[dict]:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, record)
    return out


def read(loader, limit: int | None = None) -> tuple[list[str], int]:
    keys: list[str] = []
    batches = 0
    for batch in loader:
        keys += batch["__key__"]
        batches += 1
        if limit is not None and batches == limit:
            break
    return keys, batches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["epochs", "stop", "resume"], default="epochs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--stop-after", type=int, default=2)
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    ds = ShardDataset(
        args.dataset, seed=args.seed, decode=None, storage_options=options, cache_dir=args.cache_dir
    )
    loader = ds.loader(batch_size=args.batch_size, num_workers=1)
    result: dict = {"mode": args.mode, "world_size": world_size, "len": len(ds), "epochs": []}

    if args.mode == "epochs":
        for epoch in range(2):
            ds.set_epoch(epoch)
            keys, batches = read(loader)
            result["epochs"].append(gather({"rank": rank, "keys": keys, "batches": batches}))
    elif args.mode == "stop":
        ds.set_epoch(0)
        keys, batches = read(loader, args.stop_after)
        state = loader.state_dict()
        result["epochs"].append(
            gather({"rank": rank, "keys": keys, "batches": batches, "state": state})
        )
        if rank == 0:
            with open(os.path.join(args.out, "state.json"), "w") as f:
                json.dump(state, f)
    else:
        with open(os.path.join(args.out, "state.json")) as f:
            state = json.load(f)
        loader.load_state_dict(state)
        result["batches_per_epoch"] = len(loader)  # the whole epoch, also after a resume
        result["samples_left"] = ds.remaining()
        ds.set_epoch(state["epoch"])  # as a training loop would: the resumed position is kept
        keys, batches = read(loader)
        result["epochs"].append(gather({"rank": rank, "keys": keys, "batches": batches}))

    if rank == 0:
        with open(os.path.join(args.out, f"result-{args.mode}.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
