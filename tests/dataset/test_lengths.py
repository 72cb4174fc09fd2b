"""LengthBucketing: batches within the token budget, every sample once, deterministic, resumable, and
the same number of batches on every rank (agreed over a real gloo process group)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from shardstream import ShardDataset
from shardstream.dataset.batches.lengths import LengthBucketing, cut, cut_to
from tests.sample_datasets import key_of, write_dataset

BUDGET = 64


def make(i: int) -> dict:
    return {"__key__": key_of(i), "npy": np.arange(1 + i * 7 % 23), "cls": i}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    # 39 samples
    return write_dataset(tmp_path_factory.mktemp("lengths"), [10, 7, 13, 9], make=make)


def skewed(i: int) -> dict:
    """Short sequences first, long ones after: without agreeing, the ranks would need other batch counts."""
    return {"__key__": key_of(i), "npy": np.arange(1 + i % 2 if i < 20 else 20 + i % 4), "cls": i}


def bucketing(url: str, **kw) -> LengthBucketing:
    ds = ShardDataset(
        url,
        fields={"input_ids": "npy", "cls": "cls"},
        seed=3,
        shuffle=kw.pop("shuffle", True),
        rank=kw.pop("rank", None),
        world_size=kw.pop("world_size", None),
    )
    return LengthBucketing(ds, BUDGET, window=8, num_workers=kw.pop("num_workers", 0), **kw)


def summary(batches) -> list[list[int]]:
    return [b["cls"].tolist() for b in batches]


def test_batches_stay_within_the_budget_and_hold_every_sample_once(url):
    got = list(bucketing(url))
    for b in got:
        rows, longest = b["input_ids"].shape
        assert rows * longest <= BUDGET or rows == 1
        # sorted by length within the window
        assert b["lengths"].tolist() == sorted(b["lengths"].tolist())
        assert (b["attention_mask"].sum(1) == b["lengths"]).all()
        for row, cls in enumerate(b["cls"].tolist()):
            assert b["input_ids"][row, : b["lengths"][row]].tolist() == list(
                range(1 + cls * 7 % 23)
            )
    assert sorted(c for b in summary(got) for c in b) == list(range(39))
    # deterministic, with or without workers
    assert summary(got) == summary(bucketing(url, num_workers=1))


def test_resume_mid_window_goes_on_exactly(url):
    whole = summary(bucketing(url))
    first = bucketing(url)
    it = iter(first)
    head = [next(it)["cls"].tolist() for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    again = bucketing(url)
    again.load_state_dict(state)
    assert head + summary(again) == whole


def test_cut_and_split():
    assert cut(np.array([1, 2, 3, 30, 40]), 60) == [3, 4, 5]
    assert cut_to([3, 4, 5], 5) == [1, 2, 3, 4, 5] or len(cut_to([3, 4, 5], 5)) == 5
    assert cut_to([1], 3) == [1]  # never more batches than rows


def _rank(rank: int, world: int, url: str, init: str, out: str) -> None:
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        got = summary(bucketing(url, rank=rank, world_size=world, shuffle=False))
        Path(out, f"{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def test_every_rank_yields_the_same_number_of_batches(tmp_path):
    import torch.multiprocessing as mp

    url = write_dataset(tmp_path, [10, 10, 10, 9], make=skewed, name="skewed")
    alone = [len(list(bucketing(url, rank=r, world_size=2, shuffle=False))) for r in range(2)]
    assert alone[0] != alone[1]  # each rank on its own needs another count
    mp.spawn(_rank, args=(2, url, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    read = sorted(c for got in ranks for b in got for c in b)
    assert len(read) == 40 and set(read) == set(range(39))  # 39 samples on 2 ranks: one padded
