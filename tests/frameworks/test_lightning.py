"""Lightning 2.6 DDP (2 CPU processes) with a ShardLoader built before ``trainer.fit``: a mid-epoch
checkpoint resumed through ``ckpt_path`` reads every sample exactly once per epoch, and the second
epoch has a new order, with no ``set_epoch`` call anywhere.

The test runs this file as a script (Lightning starts the second rank by running it again).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.frameworks.common import BATCH, COUNTS, PHASE1_STEPS, ROOT, to_idx


def run(out: Path, phase: str) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    import shardstream as ss

    ds = ss.ShardDataset(str(out / "ds"), shuffle=True, seed=3, transform=to_idx)
    # before fit: rank unknown until the pass starts
    loader = ds.loader(batch_size=BATCH, num_workers=1)

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            with open(out / f"phase{phase}-rank{self.global_rank}.jsonl", "a") as f:
                f.write(
                    json.dumps(
                        {
                            "epoch": self.current_epoch,
                            "idx": batch["idx"].tolist(),
                            "batches": self.trainer.num_training_batches,
                        }
                    )
                    + "\n"
                )
            return (self.lin(batch["idx"].float().view(-1, 1)) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    common = dict(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if phase == "1":
        saving = ModelCheckpoint(
            dirpath=out / "ckpt", every_n_train_steps=PHASE1_STEPS, save_top_k=-1
        )
        L.Trainer(max_steps=PHASE1_STEPS, callbacks=[saving], **common).fit(Model(), loader)
    else:
        ckpt = sorted((out / "ckpt").glob("*.ckpt"))[-1]
        L.Trainer(max_epochs=2, enable_checkpointing=False, **common).fit(
            Model(), loader, ckpt_path=str(ckpt)
        )


def test_ddp_mid_epoch_checkpoint_resumes_exactly_and_epochs_advance(tmp_path):
    from tests.sample_datasets import write_dataset

    write_dataset(tmp_path, COUNTS, make=lambda i: {"__key__": f"s{i:04d}", "cls": i})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    for phase in ("1", "2"):
        try:
            done = subprocess.run(
                [sys.executable, __file__, str(tmp_path), phase],
                capture_output=True,
                text=True,
                timeout=240,
                env=env,
                cwd=tmp_path,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"phase {phase} timed out\n{exc.stdout}\n{exc.stderr}")
        assert done.returncode == 0, f"phase {phase} failed\n{done.stdout}\n{done.stderr[-6000:]}"

    rows = {
        (phase, rank): [
            json.loads(line) for line in (tmp_path / f"phase{phase}-rank{rank}.jsonl").open()
        ]
        for phase in "12"
        for rank in (0, 1)
    }
    assert all(len(rows["1", rank]) == PHASE1_STEPS for rank in (0, 1))
    n, per_rank = sum(COUNTS), sum(COUNTS) // 2 // BATCH
    for epoch in (0, 1):
        steps = {
            rank: [r for phase in "12" for r in rows[phase, rank] if r["epoch"] == epoch]
            for rank in (0, 1)
        }
        assert [len(s) for s in steps.values()] == [per_rank, per_rank]
        # len(loader): the whole epoch
        assert all(r["batches"] == per_rank for s in steps.values() for r in s)
        seen = Counter(i for s in steps.values() for r in s for i in r["idx"])
        assert sorted(seen) == list(range(n)) and max(seen.values()) == 1, f"epoch {epoch}: {seen}"
    first = [
        [r["idx"] for phase in "12" for r in rows[phase, 0] if r["epoch"] == e][0] for e in (0, 1)
    ]
    assert first[0] != first[1]  # a new order without any set_epoch call


def test_predict_refuses_a_shardloader_naming_the_fix_and_takes_a_plain_dataloader(tmp_path):
    import lightning as L
    import torch

    import shardstream as ss
    from shardstream.errors import ShardstreamError
    from tests.sample_datasets import write_dataset

    url = write_dataset(tmp_path, [5, 7], make=lambda i: {"__key__": f"s{i:04d}", "cls": i})

    class Model(L.LightningModule):
        def predict_step(self, batch, batch_idx):
            return batch["idx"]

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = ss.ShardDataset(url, transform=to_idx).loader(4, 0)
    with pytest.raises(ShardstreamError, match="trainer.predict re-instantiates.*shuffle=False"):
        trainer.predict(Model(), loader)
    plain = torch.utils.data.DataLoader(
        ss.ShardDataset(url, shuffle=False, transform=to_idx), batch_size=4
    )
    assert torch.cat(trainer.predict(Model(), plain)).tolist() == list(range(12))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("phase", choices=["1", "2"])
    args = parser.parse_args()
    run(args.out, args.phase)
