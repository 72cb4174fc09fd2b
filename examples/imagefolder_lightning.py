"""Image classification from an ImageFolder tree with Lightning: pack the tree, train, checkpoint, resume.

    python examples/imagefolder_lightning.py --images ./my-imagefolder --work ./run --epochs 3
    python examples/imagefolder_lightning.py --work ./run --epochs 3        # makes a small tree first

The tree is ``root/<class>/<image>`` (torchvision's ImageFolder); it is packed once into tar shards
(``cls`` is the class index, ``ds.manifest.classes`` the names) and read by a ``ShardDataset``, whose
loader Lightning drives: its checkpoints hold the data position, so ``--resume`` continues the same
epoch exactly, on any number of devices.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from PIL import Image

import shardstream as ss

SIZE = 32


def make_imagefolder(root: Path, classes: int = 3, per_class: int = 40) -> None:
    """A small ImageFolder of solid-ish colour images, one colour per class (stands in for yours)."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = np.full((SIZE, SIZE, 3), 40 + 80 * c, np.int16) + rng.integers(
                -30, 30, (SIZE, SIZE, 3)
            )
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i:04d}.jpg")


def augment(sample: dict) -> dict:
    """A transform: the decoded sample dict in ({"__key__", "jpg": uint8 CxHxW, "cls": int}), one out."""
    if torch.rand(()) < 0.5:  # seeded per batch by the loader: the same flips on a re-run
        sample["jpg"] = torch.flip(sample["jpg"], dims=[2])  # a horizontal flip
    return sample


class Classifier(L.LightningModule):
    def __init__(self, classes: int):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 16, classes),
        )

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self.net(batch["jpg"] / 255), batch["cls"])
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", help="an ImageFolder tree (default: make a small one)")
    parser.add_argument("--work", default="run-imagefolder", help="shards and checkpoints go here")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = parser.parse_args(argv)
    work = Path(args.work)
    images = Path(args.images) if args.images else work / "images"
    if not args.images and not images.exists():
        make_imagefolder(images)
    shards = work / "shards"
    if not (shards / "_manifest.json").exists():
        print(ss.pack(images, shards, shard_size="256KB").summary())

    ds = ss.ShardDataset(shards, shuffle=True, seed=17, decode="torch", transform=augment)
    print(f"{len(ds)} images of {len(ds.manifest.classes)} classes: {ds.manifest.classes}")
    loader = ds.loader(batch_size=args.batch_size, num_workers=args.num_workers)
    checkpoints = ModelCheckpoint(
        dirpath=work / "checkpoints", every_n_train_steps=5, save_last=True
    )
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        max_epochs=args.epochs,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = work / "checkpoints" / "last.ckpt"
    trainer.fit(
        Classifier(len(ds.manifest.classes)), loader, ckpt_path=last if args.resume else None
    )
    print(
        f"trained {trainer.current_epoch} epochs, {trainer.global_step} steps; last loss "
        f"{float(trainer.callback_metrics['loss']):.3f}"
    )


if __name__ == "__main__":
    main()
