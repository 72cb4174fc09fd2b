"""The compose stack's training job: each rank reads its part of the epoch from the bucket through
``ShardDataset`` and ``DeviceLoader`` (on the GPU if there is one, else the CPU), and rank 0 checks
that every sample of the dataset was read exactly once.

    torchrun --standalone --nproc_per_node=2 train.py s3://shardstream/images \
        --endpoint-url http://store:8333 --workers 2 --batch-size 16

Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: the env_file).
Prints one JSON line with what was read; exits 1 with shardstream's one-line error (a /dev/shm too
small for the loader, storage that refuses the keys) or when a sample was missed or read twice.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import shardstream as ss
from shardstream.errors import ShardstreamError


def one_line(exc: BaseException) -> str:
    """The error's own message: a DataLoader worker's error arrives wrapped in its traceback text."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else type(exc).__name__
    head, sep, rest = last.partition(": ")
    return rest if sep and head.rsplit(".", 1)[-1] == type(exc).__name__ else last


def read_epochs(args: argparse.Namespace, device: torch.device) -> tuple[list[str], Any]:
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    ds = ss.ShardDataset(
        args.url, shuffle=True, seed=args.seed, decode="torch", storage_options=options
    )
    loader = ds.loader(
        batch_size=args.batch_size, num_workers=args.workers, shm_check=args.shm_check
    )
    keys: list[str] = []
    total = torch.zeros((), device=device)
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        for batch in ss.DeviceLoader(loader, device):
            keys.extend(batch["__key__"])
            image = next(
                v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() == 4
            )
            total += image.float().mean()  # a stand-in for the training step, on the device
    return keys, ds.manifest


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Read the dataset at URL on every rank; check each sample once."
    )
    parser.add_argument("url")
    parser.add_argument(
        "--endpoint-url", default=None, help="S3-compatible endpoint, e.g. http://store:8333"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shm-check",
        choices=["raise", "warn", "off"],
        default="raise",
        help="The loader's /dev/shm guard: off shows what happens without it (Bus error)",
    )
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    try:
        keys, manifest = read_epochs(args, device)
    except ShardstreamError as exc:
        print(f"error: rank {rank}: {one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    every = [keys]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, keys)
        dist.destroy_process_group()
    if rank != 0:
        return 0
    counts = collections.Counter(k for part in every for k in part)
    expected = manifest.num_samples * args.epochs
    wrong = {k: n for k, n in counts.items() if n != args.epochs}
    report = {
        "ranks": world,
        "device": device.type,
        "samples": manifest.num_samples,
        "epochs": args.epochs,
        "read": sum(counts.values()),
        "distinct": len(counts),
        "per_rank": [len(p) for p in every],
        "exactly_once": not wrong and len(counts) == manifest.num_samples,
    }
    print(json.dumps(report), flush=True)
    if not report["exactly_once"]:
        print(
            f"error: expected every one of {manifest.num_samples} samples {args.epochs} time(s), {expected} reads; "
            f"got {report['read']} reads of {len(counts)} samples (e.g. {dict(list(wrong.items())[:3])}); "
            "with drop_last=False a world size that does not divide the samples repeats a few to pad",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
