"""A weighted mix of three sources, trained under torchrun, stopped, and resumed on another world size.

    torchrun --nproc-per-node=2 examples/weighted_mix_resume.py --work ./run --stop-after 4
    torchrun --nproc-per-node=3 examples/weighted_mix_resume.py --work ./run --resume

The first run packs three sources (``web``, ``code``, ``books``: made up here, yours in practice) of
different sizes, reads them as one ``MixedDataset`` with weights 0.6 / 0.2 / 0.2, and after
``--stop-after`` batches saves rank 0's loader state (every rank has read the same number of
batches, so rank 0's state is the job's). The second run, with any number of ranks and workers, loads
it and reads the rest of the epoch: nothing repeated, nothing skipped. Each rank writes the keys it
read to ``WORK/keys-<run>-rank<r>.json``, so you can check that (the test does). Without torchrun the
script runs as one rank.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

import shardstream as ss

SOURCES = {"web": 240, "code": 60, "books": 120}  # samples in each
WEIGHTS = [0.6, 0.2, 0.2]
SAMPLES_PER_EPOCH = 240


def make_sources(work: Path) -> None:
    """Three small datasets of text samples with a feature vector each (stand-ins for real corpora)."""
    for name, count in SOURCES.items():
        if (work / name / "_manifest.json").exists():
            continue
        with ss.ShardWriter(str(work / name), shard_size="32KB", overwrite=True) as writer:
            for i in range(count):
                features = torch.full((8,), float(len(name)) + i / count).numpy()
                writer.write({"__key__": f"{name}-{i:04d}", "txt": f"{name} {i}", "npy": features})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="run-mix", help="sources, state and records go here")
    parser.add_argument(
        "--stop-after", type=int, help="save the state after this many batches, and stop"
    )
    parser.add_argument("--resume", action="store_true", help="continue from the saved state")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=1)
    args = parser.parse_args(argv)
    work = Path(args.work)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if rank == 0:
        make_sources(work)
    if distributed:
        dist.barrier()  # the sources exist before any rank opens them

    sources = [ss.ShardDataset(str(work / name), seed=k) for k, name in enumerate(SOURCES)]
    mix = ss.MixedDataset(sources, WEIGHTS, samples_per_epoch=SAMPLES_PER_EPOCH, seed=1)
    loader = mix.loader(batch_size=args.batch_size, num_workers=args.num_workers)
    if args.resume:
        loader.load_state_dict(json.loads((work / "state.json").read_text()))
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keys, origin = [], Counter()
    for step, batch in enumerate(loader, 1):
        loss = model(batch["npy"].float()).pow(2).mean()  # a stand-in for a real model's step
        opt.zero_grad()
        loss.backward()
        opt.step()
        keys += batch["__key__"]
        origin.update(batch["__source__"].tolist())  # which source each row came from
        if step == args.stop_after:
            if rank == 0:
                (work / "state.json").write_text(json.dumps(loader.state_dict()))
            break
    run = "resume" if args.resume else "first"
    (work / f"keys-{run}-rank{rank}.json").write_text(json.dumps(keys))
    shares = {name: origin[i] for i, name in enumerate(SOURCES)}
    print(f"rank {rank}/{world}: {len(keys)} samples, by source {shares}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
