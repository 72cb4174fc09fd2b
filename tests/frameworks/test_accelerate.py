"""accelerate 1.15 with 2 CPU processes (torchrun: ``accelerate launch --cpu`` starts one process):
``prepare(model, opt, loader)`` returns the ShardLoader itself, and a mid-epoch ``save_state`` /
``load_state`` through ``register_for_checkpointing`` reads every sample exactly once per epoch,
with a new order in the next epoch and no ``set_epoch`` call.

The test runs this file as a script under torchrun.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from tests.frameworks.common import BATCH, COUNTS, PHASE1_STEPS, to_idx
from tests.torchrun import torchrun


def run(out: Path, phase: str) -> None:
    import torch
    from accelerate import Accelerator

    import shardstream as ss

    accelerator = Accelerator(cpu=True)
    ds = ss.ShardDataset(str(out / "ds"), shuffle=True, seed=3, transform=to_idx)
    loader = ds.loader(batch_size=BATCH, num_workers=1)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt, prepared = accelerator.prepare(model, opt, loader)
    # a rebuilt DataLoader would split the data a second time
    assert prepared is loader, type(prepared)
    accelerator.register_for_checkpointing(loader)
    log = out / f"phase{phase}-rank{accelerator.process_index}.jsonl"
    if phase == "2":
        accelerator.load_state(str(out / "state"))
    for epoch in range(ds.epoch, 2):  # the loaded epoch; a finished pass moves on by itself
        for step, batch in enumerate(loader):
            with open(log, "a") as f:
                f.write(
                    json.dumps(
                        {"epoch": epoch, "idx": batch["idx"].tolist(), "batches": len(loader)}
                    )
                    + "\n"
                )
            accelerator.backward((model(batch["idx"].float().view(-1, 1)) ** 2).mean())
            if phase == "1" and step + 1 == PHASE1_STEPS:
                accelerator.save_state(str(out / "state"))
                accelerator.wait_for_everyone()
                return


def test_prepare_returns_the_loader_and_a_mid_epoch_state_resumes_exactly(tmp_path):
    from tests.sample_datasets import write_dataset

    write_dataset(tmp_path, COUNTS, make=lambda i: {"__key__": f"s{i:04d}", "cls": i})
    for phase in ("1", "2"):
        torchrun(2, __file__, str(tmp_path), phase, cwd=tmp_path)

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
        assert all(r["batches"] == per_rank for s in steps.values() for r in s)
        seen = Counter(i for s in steps.values() for r in s for i in r["idx"])
        assert sorted(seen) == list(range(n)) and max(seen.values()) == 1, f"epoch {epoch}: {seen}"
    first = [
        [r["idx"] for phase in "12" for r in rows[phase, 0] if r["epoch"] == e][0] for e in (0, 1)
    ]
    assert first[0] != first[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("phase", choices=["1", "2"])
    args = parser.parse_args()
    run(args.out, args.phase)
