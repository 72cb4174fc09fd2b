"""Run by torchrun from test_ddp_tokens.py: every rank trains a tiny causal LM on a token dataset.

    torchrun --nproc-per-node=N token_trainer.py DATASET OUT --mode stop|resume [--stop-after K]

Each rank reads ``TokenDataset(DATASET, seq_len).loader(...)`` and takes DDP steps of a tiny
embedding-plus-linear model (gloo, CPU). The labels each rank read and its batch count are
gathered; rank 0 writes ``OUT/result-<mode>.json`` (and ``OUT/state.json`` in ``stop`` mode,
after ``--stop-after`` batches), so that ``resume`` on another world size reads the rest.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
import torch.distributed as dist
from torch import nn

from shardstream import TokenDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["stop", "resume"], required=True)
    parser.add_argument("--stop-after", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    ds = TokenDataset(args.dataset, args.seq_len, seed=11)
    loader = ds.loader(batch_size=2, num_workers=1)
    if args.mode == "resume":
        with open(os.path.join(args.out, "state.json")) as f:
            loader.load_state_dict(json.load(f))
    vocab = ds.manifest.tokens["vocab_size"]
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, vocab))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    labels: list[int] = []
    batches, losses = 0, []
    for batch in loader:
        logits = model(batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        labels += batch["labels"].flatten().tolist()
        batches += 1
        losses.append(float(loss))
        if args.mode == "stop" and batches == args.stop_after:
            break
    state = loader.state_dict()
    gathered: list = [None] * dist.get_world_size()
    finite = bool(losses) and all(map(math.isfinite, losses))
    dist.all_gather_object(
        gathered,
        {
            "rank": dist.get_rank(),
            "labels": labels,
            "batches": batches,
            "len": len(ds),
            "state": state,
            "finite": finite,
        },
    )
    if dist.get_rank() == 0:
        with open(os.path.join(args.out, f"result-{args.mode}.json"), "w") as f:
            json.dump({"world_size": dist.get_world_size(), "ranks": gathered}, f)
        if args.mode == "stop":
            with open(os.path.join(args.out, "state.json"), "w") as f:
                json.dump(state, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
