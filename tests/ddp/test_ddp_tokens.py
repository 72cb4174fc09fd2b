"""A real ``torchrun --nproc-per-node=2`` run trains on a token dataset, stops mid-epoch, and resumes
on three ranks: every token is a label exactly once over the two runs (minus the stated tails)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from tests.token_corpus import pack_positions
from tests.torchrun import torchrun as run_ranks

SCRIPT = Path(__file__).with_name("token_trainer.py")


def torchrun(nproc: int, dataset: str, out: Path, *args: str) -> dict:
    run_ranks(nproc, SCRIPT, dataset, str(out), *args, timeout=240, cwd=Path(__file__).parents[2])
    return json.loads((out / f"result-{args[args.index('--mode') + 1]}.json").read_text())


def test_torchrun_trains_stops_and_resumes_on_another_world_size(tmp_path):
    lengths = [7, 30, 3, 12, 50, 9, 21, 4, 16, 28, 5, 40]  # 225 tokens
    url, offsets = pack_positions(tmp_path, lengths, shard_size="120B")
    out = tmp_path / "out"
    out.mkdir()
    first = torchrun(2, url, out, "--mode", "stop", "--stop-after", "3")
    assert [r["batches"] for r in first["ranks"]] == [3, 3]
    # every rank saves the same state
    assert first["ranks"][0]["state"] == first["ranks"][1]["state"]
    second = torchrun(3, url, out, "--mode", "resume")
    # equal batches per rank: no hang in DDP
    assert len({r["batches"] for r in second["ranks"]}) == 1
    assert all(r["finite"] for run in (first, second) for r in run["ranks"])  # the model trained
    labels = Counter(t for run in (first, second) for r in run["ranks"] for t in r["labels"])
    assert max(labels.values()) == 1  # no token is a label twice
    from shardstream import TokenDataset
    from shardstream.manifest.token_stats import shard_tokens

    ends = np.cumsum(shard_tokens(TokenDataset(url, 4).manifest))
    possible = set()
    for a, b in zip(np.concatenate([[0], ends[:-1]]).tolist(), ends.tolist()):
        possible |= set(range(a + 1, a + 1 + (b - a - 1) // 4 * 4))
    assert set(labels) <= possible
    windows = len(possible) // 4
    # drop_last leaves out fewer windows than ranks at each split (2, then 3)
    assert windows - len(labels) // 4 < 2 + 3
