"""Run by torchrun from test_ddp_mix.py: every rank reads a 3-source MixedDataset through its loader.

    torchrun --nproc-per-node=N mix_reader.py ROOT OUT --mode epoch|stop|resume

ROOT holds the sources ``a``, ``b`` and ``c``. Each rank's keys, sources and batch count are
gathered with ``all_gather_object``; rank 0 writes ``OUT/result-<mode>.json`` (``stop`` also
writes ``OUT/state.json`` after two batches).
"""

from __future__ import annotations

import argparse
import json
import os

import torch.distributed as dist

from shardstream.dataset import MixedDataset, ShardDataset

WEIGHTS = [0.5, 0.3, 0.2]
SAMPLES_PER_EPOCH = 40


def make_mix(root: str) -> MixedDataset:
    sources = [
        ShardDataset(os.path.join(root, name), decode=None, seed=k) for k, name in enumerate("abc")
    ]
    return MixedDataset(sources, WEIGHTS, samples_per_epoch=SAMPLES_PER_EPOCH, seed=5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["epoch", "stop", "resume"], default="epoch")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = make_mix(args.root)
    loader = ds.loader(batch_size=3, num_workers=1)
    if args.mode == "resume":
        with open(os.path.join(args.out, "state.json")) as f:
            loader.load_state_dict(json.load(f))
    keys: list[str] = []
    sources: list[int] = []
    batches = 0
    for batch in loader:
        keys += batch["__key__"]
        sources += batch["__source__"].tolist()
        batches += 1
        if args.mode == "stop" and batches == 2:
            break
    record = {"rank": rank, "len": len(ds), "keys": keys, "sources": sources, "batches": batches}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)
    if rank == 0:
        if args.mode == "stop":
            with open(os.path.join(args.out, "state.json"), "w") as f:
                json.dump(loader.state_dict(), f)
        with open(os.path.join(args.out, f"result-{args.mode}.json"), "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
