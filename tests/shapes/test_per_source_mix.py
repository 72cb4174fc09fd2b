"""MixedDataset(batching="per_source"): one source per batch, batches dealt by weight, exact passes,
equal batch counts on 1-4 ranks, the same batches for any worker count, resume on another world size."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from shardstream.dataset import MixedDataset, ShardDataset
from shardstream.errors import UsageError
from shardstream.plan.batch_mix import BatchSchedule
from tests.dataset.test_mixed import SIZES, sample_of
from tests.sample_datasets import write_dataset

B = 3


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("permix")
    return {
        name: write_dataset(root, counts, name=name, make=sample_of(name, 100 * k))
        for k, (name, counts) in enumerate(SIZES.items())
    }


def make(urls, weights=(0.5, 0.3, 0.2), total=36, **kwargs) -> MixedDataset:
    sources = [ShardDataset(urls[name], decode=None, seed=k) for k, name in enumerate(SIZES)]
    return MixedDataset(
        sources,
        list(weights),
        samples_per_epoch=total,
        batching="per_source",
        batch_size=B,
        **kwargs,
    )


def batches_of(loader, limit: int | None = None) -> list[list[str]]:
    out = []
    for n, batch in enumerate(loader, 1):
        sources = set(batch["__source__"].tolist())
        assert len(sources) == 1  # one source per batch
        assert {k[0] for k in batch["__key__"]} == {"abc"[sources.pop()]}
        out.append(list(batch["__key__"]))
        if n == limit:
            break
    return out


def test_schedule_is_exact_and_every_prefix_within_one_batch():
    w = np.array([0.5, 0.3, 0.2])
    s = BatchSchedule.create(w, 37, 4)
    assert s.batches.quota.tolist() == [19, 11, 7] and s.total == 148
    src = s.batch_sources(np.arange(37))
    for n in range(1, 38):
        counts = np.bincount(src[:n], minlength=3)
        assert (np.abs(counts - w * n) < 1).all()
        assert (counts == s.counts(n)).all()
    source, index = s.locate(np.arange(148))
    for i in range(3):  # each source's positions are 0 .. quota-1, batch after batch
        assert sorted(index[source == i].tolist()) == list(range(int(s.quota[i])))
        assert (source.reshape(37, 4) == src[:, None]).all()


def test_batches_come_from_one_source_in_proportion(urls):
    ds = make(urls)
    assert len(ds) == 12 and ds.samples_per_epoch == 36
    got = batches_of(ds.loader(B, 0))
    assert len(got) == 12 and all(len(b) == B for b in got)
    assert Counter(b[0][0] for b in got) == {"a": 6, "b": 4, "c": 2}
    a = [k for b in got for k in b if k[0] == "a"]
    assert len(a) == 18 and sorted(a[:15]) == [f"a{i:03d}" for i in range(15)]  # a whole pass first


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_batches_are_the_same_for_any_number_of_workers(urls, workers):
    assert batches_of(make(urls).loader(B, workers)) == batches_of(make(urls).loader(B, 0))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_get_equal_batch_counts_of_one_global_order(urls, world):
    expected = batches_of(make(urls, total=33).loader(B, 0))  # 11 batches
    got = [
        batches_of(make(urls, total=33, rank=r, world_size=world).loader(B, 0))
        for r in range(world)
    ]
    per_rank = -(-11 // world)
    assert [len(g) for g in got] == [per_rank] * world
    flat = [b for g in got for b in g]
    assert (
        flat[:11] == expected and flat[11:] == expected[: len(flat) - 11]
    )  # padding: whole batches


@pytest.mark.parametrize(
    ("before", "taken", "after"),
    [((2, 2), 3, (3, 1)), ((4, 0), 1, (2, 2)), ((1, 1), 2, (2, 0)), ((3, 2), 2, (3, 0))],
)
def test_resume_mid_epoch_on_another_world_size_and_workers(urls, before, taken, after):
    total = 36  # 12 batches; what is left splits evenly: no padding, every batch read once
    expected = Counter(map(tuple, batches_of(make(urls, total=total).loader(B, 0))))
    first, states = [], []
    world, workers = before
    for rank in range(world):
        loader = make(urls, total=total, rank=rank, world_size=world).loader(B, workers)
        first += batches_of(loader, limit=taken)
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    state = json.loads(json.dumps(states[0]))
    world, workers = after
    second = []
    for rank in range(world):
        loader = make(urls, total=total, rank=rank, world_size=world).loader(B, workers)
        loader.load_state_dict(state)
        second.append(batches_of(loader))
    assert len({len(g) for g in second}) == 1
    assert Counter(map(tuple, first)) + Counter(tuple(b) for g in second for b in g) == expected


def test_unbatched_iteration_gives_the_batches_samples(urls):
    ds = make(urls)
    keys = [s["__key__"] for s in ds]
    assert [keys[i : i + B] for i in range(0, len(keys), B)] == batches_of(make(urls).loader(B, 0))


def test_settings_are_checked(urls):
    with pytest.raises(UsageError, match="batch_size=3"):
        make(urls).loader(4, 0)
    sources = [ShardDataset(urls["a"], decode=None)]
    with pytest.raises(UsageError, match="needs batch_size"):
        MixedDataset(sources, batching="per_source")
    with pytest.raises(UsageError, match="batching must be"):
        MixedDataset(sources, batching="stratified")
    with pytest.raises(UsageError, match="only with batching='per_source'"):
        MixedDataset(sources, batch_size=2)
    with pytest.raises(UsageError, match="less than one batch"):
        MixedDataset(sources, samples_per_epoch=2, batching="per_source", batch_size=3)


def test_a_state_of_a_sample_mix_is_refused(urls):
    sources = [ShardDataset(urls[name], decode=None, seed=k) for k, name in enumerate(SIZES)]
    mixed = MixedDataset(sources, [0.5, 0.3, 0.2], samples_per_epoch=12)
    state = mixed.loader(3, 0).state_dict()
    with pytest.raises(Exception, match="fingerprint|samples"):
        make(urls, total=36).loader(B, 0).load_state_dict(state)


def test_a_token_mix_of_per_source_batches(tmp_path):
    from shardstream.dataset import TokenDataset
    from tests.dataset.test_mixed import token_dataset

    web = token_dataset(
        tmp_path, "web", [list(range(100 + 10 * d, 108 + 10 * d)) for d in range(20)]
    )
    code = token_dataset(
        tmp_path, "code", [list(range(500 + 10 * d, 505 + 10 * d)) for d in range(20)]
    )
    sources = [TokenDataset(web, 4, seed=1), TokenDataset(code, 4, seed=2)]
    mix = MixedDataset(
        sources, [0.75, 0.25], samples_per_epoch=40, batching="per_source", batch_size=5
    )
    got = []
    for batch in mix.loader(5, 1):
        (source,) = set(batch["__source__"].tolist())
        ids = batch["input_ids"][batch["input_ids"] != 0]  # (0: the end-of-document token)
        assert ((ids < 500) if source == 0 else (ids >= 500)).all()
        assert batch["cu_seqlens"][-1] == 20
        got.append(source)
    assert got.count(0) == 6 and got.count(1) == 2


def test_drop_last_drops_whole_batches(urls):
    per_rank = [
        batches_of(make(urls, total=33, rank=r, world_size=2, drop_last=True).loader(B, 0))
        for r in range(2)
    ]
    assert [len(g) for g in per_rank] == [5, 5]  # 11 batches: the last one dropped
    assert all(len(b) == B for g in per_rank for b in g)
