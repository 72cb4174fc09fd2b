"""Train a tiny classifier on the demo image shards, fed by DeviceLoader.

    make demo && .venv/bin/python examples/train_device.py demo/images-shards

On a machine with CUDA, batches arrive pinned, are copied ahead on a side stream as
uint8 and become normalized float32 channels-last on the GPU; without CUDA the same
script runs on the CPU. The random flip runs in the loader's workers, which are seeded
per worker and epoch from the dataset's seed: flips differ between workers and epochs,
and a second run draws the same ones.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import shardstream as ss

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def random_flip(sample: dict) -> dict:
    """An augmentation at module level, so that spawn workers (macOS, Windows) can unpickle it."""
    if torch.rand(()) < 0.5:
        sample["jpg"] = sample["jpg"].flip(-1)
    return sample


def main(url: str, epochs: int = 3) -> None:
    ds = ss.ShardDataset(url, shuffle=True, seed=17, decode="torch", transform=random_flip)
    loader = ds.loader(batch_size=16)  # workers, pinning and prefetch configured for this machine
    batches = ss.DeviceLoader(loader, "cuda", normalize=(MEAN, STD), channels_last=True)
    device = batches.device  # cuda when present, else cpu
    classes = len(ds.manifest.classes or []) or 3
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, classes),
    ).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    print(f"training on {device}, {loader.num_workers} workers, {len(loader)} batches per epoch")
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        total, count = 0.0, 0
        for batch in batches:
            loss = nn.functional.cross_entropy(model(batch["jpg"]), batch["cls"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item(), count + 1
        print(f"epoch {epoch}: mean loss {total / count:.3f}; resume state {batches.state_dict()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo/images-shards")
