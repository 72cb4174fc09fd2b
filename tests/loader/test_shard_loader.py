"""ShardLoader: in-order output for any number of workers, len, and exact resume via state_dict."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from shardstream.dataset import ShardDataset
from shardstream.dataset.shards.readers import OpenShards, TarShard
from shardstream.errors import ShardstreamError
from tests.sample_datasets import key_of
from tests.sample_datasets import write_dataset as _write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [5, 1, 7, 3, 6]  # 22 samples in uneven shards
SEED = 13


def write_dataset(root: Path, counts, name: str = "ds") -> str:
    return _write_dataset(root, counts, make=lambda i: {"__key__": key_of(i), "cls": i}, name=name)


def all_keys(n: int) -> list[str]:
    return [key_of(i) for i in range(n)]


def make(url: str, **kwargs) -> ShardDataset:
    kwargs.setdefault("seed", SEED)
    kwargs.setdefault("decode", None)
    return ShardDataset(url, **kwargs)


def planned(url: str, epoch: int = 0, **kwargs) -> list[str]:
    """The rank's planned order: the dataset iterated sample by sample in this process."""
    ds = make(url, **kwargs)
    ds.set_epoch(epoch)
    return [s["__key__"] for s in ds]


def flat(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def take(loader, k: int) -> list[str]:
    """The keys of the loader's first ``k`` batches (the iteration is left open, as on a crash)."""
    out: list[str] = []
    it = iter(loader)
    for _ in range(k):
        out += next(it)["__key__"]
    return out


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("loader"), COUNTS)


# -- in-order output and len ---------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 5])
@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_in_order_output_is_the_planned_order(url, workers, batch_size, rank, world_size):
    expected = planned(url, rank=rank, world_size=world_size)
    ds = make(url, rank=rank, world_size=world_size)
    loader = ds.loader(batch_size=batch_size, num_workers=workers)
    batches = list(loader)
    assert flat(batches) == expected
    sizes = [len(b["__key__"]) for b in batches]
    assert all(s == batch_size for s in sizes[:-1]) and 0 < sizes[-1] <= batch_size
    assert len(loader) == len(batches) == -(-len(ds) // batch_size)


def test_batches_are_collated_in_the_workers(url):
    loader = make(url, decode="torch", shuffle=False).loader(batch_size=4, num_workers=2)
    batches = list(loader)
    assert batches[0]["cls"].tolist() == [0, 1, 2, 3]
    assert batches[-1]["cls"].tolist() == [20, 21]


def test_batch_size_must_be_positive(url):
    with pytest.raises(ValueError):
        make(url).loader(batch_size=0, num_workers=0)


# -- resume ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "before_workers,after_workers,k",
    [(0, 2, 2), (2, 0, 3), (1, 3, 1), (3, 1, 4), (2, 2, 0), (0, 1, 8), (2, 3, 5)],
)
@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_resume_with_other_workers_continues_exactly(
    url, before_workers, after_workers, k, rank, world_size
):
    batch_size = 3
    expected = planned(url, rank=rank, world_size=world_size)
    total_batches = -(-len(expected) // batch_size)
    # a state after the last batch is the next epoch's start (tested below)
    k = min(k, total_batches - 1)
    first = make(url, rank=rank, world_size=world_size).loader(batch_size, before_workers)
    before = take(first, k)
    state = json.loads(json.dumps(first.state_dict()))
    del first

    second = make(url, rank=rank, world_size=world_size).loader(batch_size, after_workers)
    second.load_state_dict(state)
    # the whole epoch (the StatefulDataLoader convention Lightning relies on)
    assert len(second) == total_batches
    assert second.dataset.remaining() == len(expected) - len(before)
    after = flat(second)
    assert before + after == expected
    assert len(set(expected)) == len(expected)  # no padding here: every key once


def test_resume_with_another_batch_size(url):
    expected = planned(url)
    first = make(url).loader(4, 1)
    before = take(first, 2)
    second = make(url).loader(3, 2)
    second.load_state_dict(first.state_dict())
    assert before + flat(second) == expected


def test_resume_then_later_epochs_with_persistent_workers(url):
    epoch0, epoch1, epoch2 = (planned(url, epoch) for epoch in (0, 1, 2))
    assert len({tuple(epoch0), tuple(epoch1), tuple(epoch2)}) == 3

    first = make(url).loader(batch_size=3, num_workers=2, workers="processes")
    assert first.persistent_workers
    before = take(first, 3)
    state = first.state_dict()
    del first

    ds = make(url)
    loader = ds.loader(batch_size=3, num_workers=1, workers="processes")
    assert loader.persistent_workers
    loader.load_state_dict(state)
    ds.set_epoch(0)  # a training loop's set_epoch of the resumed epoch keeps the position
    assert before + flat(loader) == epoch0
    ds.set_epoch(1)
    assert flat(loader) == epoch1
    ds.set_epoch(1)
    assert flat(loader) == epoch1
    ds.set_epoch(2)
    middle = take(loader, 2)
    state = loader.state_dict()
    assert state["epoch"] == 2

    ds3 = make(url)
    resumed = ds3.loader(batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    assert middle + flat(resumed) == epoch2


def test_epochs_with_persistent_workers_without_resume(url):
    ds = make(url)
    loader = ds.loader(batch_size=4, num_workers=3, workers="processes")
    for epoch in (0, 1, 2, 1):
        ds.set_epoch(epoch)
        assert flat(loader) == planned(url, epoch)


def test_a_complete_pass_moves_on_to_the_next_epoch_whole(url):
    for workers in (0, 2):
        first = make(url).loader(5, workers)
        before = take(first, 2)
        loader = make(url).loader(5, workers)
        loader.load_state_dict(first.state_dict())
        assert before + flat(loader) == planned(url)
        assert loader.dataset.epoch == 1
        # no set_epoch needed: the next epoch, from its start
        assert flat(loader) == planned(url, 1)
        assert len(loader) == 5
        loader.dataset.set_epoch(1)
        assert flat(loader) == planned(url, 1)  # an explicit set_epoch still repeats an epoch


def test_a_state_taken_after_the_last_batch_resumes_the_next_epoch_whole(url):
    loader = make(url).loader(5, 0)
    assert len(flat(loader)) == 22
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 0
    again = make(url).loader(5, 0)
    again.load_state_dict(state)
    assert len(again) == 5
    assert flat(again) == planned(url, 1)
    old_style = dict(state, epoch=0, consumed=22)  # an end-of-pass state of an earlier release
    again.load_state_dict(old_style)
    assert flat(again) == planned(url, 1)


def test_state_before_iterating_is_the_start_of_the_epoch(url):
    ds = make(url)
    ds.set_epoch(3)
    loader = ds.loader(4, 0)
    state = loader.state_dict()
    assert state["epoch"] == 3 and state["consumed"] == 0
    other = make(url)
    other_loader = other.loader(4, 0)
    other_loader.load_state_dict(state)
    assert flat(other_loader) == planned(url, 3)


def test_state_after_set_epoch_describes_the_new_epoch(url):
    ds = make(url)
    loader = ds.loader(4, 0)
    flat(loader)
    ds.set_epoch(1)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 0


def test_state_dict_is_small_json(url):
    ds = make(url, rank=1, world_size=2)
    loader = ds.loader(3, 0)
    take(loader, 2)
    state = loader.state_dict()
    text = json.dumps(state)
    assert json.loads(text) == state
    assert len(text) < 300
    assert state["epoch"] == 0 and state["seed"] == SEED and state["consumed"] == 6
    assert all(isinstance(v, (int, bool, list)) for k, v in state.items() if k != "fingerprint")
    assert state["fingerprint"] == ds.manifest.fingerprint and state["shuffle"] is True


def test_loading_a_state_of_another_dataset_or_seed_is_refused(url, tmp_path):
    state = make(url).loader(3, 0).state_dict()
    with pytest.raises(ShardstreamError, match="seed"):
        make(url, seed=SEED + 1).loader(3, 0).load_state_dict(state)
    other = write_dataset(tmp_path, [4, 4])
    with pytest.raises(ShardstreamError):
        make(other).loader(3, 0).load_state_dict(state)
    with pytest.raises(ShardstreamError, match="drop_last"):
        make(url, drop_last=True).loader(3, 0).load_state_dict(state)
    with pytest.raises(ShardstreamError, match="version"):
        make(url).loader(3, 0).load_state_dict({**state, "version": 99})


# -- resume with another world size -------------------------------------------------------------


def run_ranks(
    url: str,
    world_size: int,
    batch_size: int,
    k: int | None,
    state=None,
    workers: int = 0,
    **kwargs,
):
    """Each rank reads ``k`` batches (all if None) from ``state``; (keys per rank, state per rank)."""
    got, states = [], []
    for rank in range(world_size):
        loader = make(url, rank=rank, world_size=world_size, **kwargs).loader(batch_size, workers)
        if state is not None:
            loader.load_state_dict(state)
        got.append(flat(loader) if k is None else take(loader, k))
        states.append(loader.state_dict())
    return got, states


def test_resume_from_two_ranks_on_three(tmp_path):
    url = write_dataset(tmp_path, [7, 5, 9, 4, 5])  # 30 samples
    order = planned(url)
    first, states = run_ranks(url, 2, batch_size=3, k=2)
    assert all(s == states[0] for s in states)  # every rank saves the same state
    second, _ = run_ranks(
        url, 3, batch_size=3, k=None, state=json.loads(json.dumps(states[0])), workers=1
    )
    assert [len(g) for g in first] == [6, 6]
    assert [len(g) for g in second] == [6, 6, 6]  # 18 left: no padding
    everything = Counter(k for g in first + second for k in g)
    assert set(everything) == set(all_keys(30)) and max(everything.values()) == 1
    read_first = set(k for g in first for k in g)
    assert [k for g in second for k in g] == [
        k for k in order if k not in read_first
    ]  # the order goes on


def test_resume_on_another_world_size_with_padding(tmp_path):
    url = write_dataset(tmp_path, [7, 5, 9, 4, 6])  # 31 samples: rank spans of 16 on 2 ranks
    order = planned(url)
    first, states = run_ranks(url, 2, batch_size=3, k=2)
    read_first = set(k for g in first for k in g)
    remaining = [k for k in order if k not in read_first]
    assert len(remaining) == 19
    second, _ = run_ranks(url, 3, batch_size=3, k=None, state=states[0])
    assert [len(g) for g in second] == [7, 7, 7]  # 19 left on 3 ranks: 2 padded
    assert [k for g in second for k in g] == remaining + remaining[:2]
    everything = Counter(k for g in first + second for k in g)
    assert set(everything) == set(all_keys(31))
    assert sorted(k for k, c in everything.items() if c > 1) == sorted(remaining[:2])


def test_resume_through_several_world_sizes(tmp_path):
    url = write_dataset(tmp_path, [9, 3, 8, 6, 10])  # 36 samples
    order = planned(url)
    first, states = run_ranks(url, 2, batch_size=3, k=2)  # 12 read, 24 left
    second, states = run_ranks(url, 3, batch_size=3, k=1, state=states[0])  # 9 read, 15 left
    assert all(s == states[0] for s in states)
    third, _ = run_ranks(url, 1, batch_size=4, k=None, state=states[0])
    assert len(third[0]) == 15
    reads = [k for g in first + second + third for k in g]
    assert sorted(reads) == all_keys(36)
    read_before = set(k for g in first + second for k in g)
    assert third[0] == [k for k in order if k not in read_before]


# -- skipped samples are not read ---------------------------------------------------------------


@pytest.fixture
def opened(monkeypatch) -> list[int]:
    """Shards opened (loaded from storage) in this process."""
    record: list[int] = []
    original = OpenShards._load

    def load(self, shard):
        record.append(shard)
        return original(self, shard)

    monkeypatch.setattr(OpenShards, "_load", load)
    return record


def test_shards_consumed_before_the_state_are_not_opened_on_resume(tmp_path, opened):
    url = write_dataset(tmp_path, [5] * 6)
    first = make(url, shuffle=False).loader(5, 0)
    before = take(first, 3)
    assert before == all_keys(15)
    assert sorted(set(opened)) == [0, 1, 2]
    state = first.state_dict()
    opened.clear()
    second = make(url, shuffle=False).loader(5, 0)
    second.load_state_dict(state)
    assert flat(second) == all_keys(30)[15:]
    assert sorted(set(opened)) == [3, 4, 5]


def test_shards_consumed_before_the_state_are_not_opened_on_another_world_size(tmp_path, opened):
    url = write_dataset(tmp_path, [4] * 6)  # rank spans of 12 on 2 ranks: shards 0-2 and 3-5
    first, states = run_ranks(url, 2, batch_size=4, k=2, shuffle=False)
    assert first == [all_keys(8), all_keys(20)[12:]]
    assert sorted(set(opened)) == [0, 1, 3, 4]
    opened.clear()
    second, _ = run_ranks(url, 4, batch_size=2, k=None, state=states[0], shuffle=False)
    keys = all_keys(24)
    assert second == [keys[8:10], keys[10:12], keys[20:22], keys[22:24]]
    assert sorted(set(opened)) == [2, 5]


def test_consumed_samples_are_not_read_on_resume_with_shuffling(url, monkeypatch):
    read: list[str] = []

    def recording(original, key_of):
        def read_sample(self, i):
            out = original(self, i)
            read.append(key_of(out))
            return out

        return read_sample

    monkeypatch.setattr(TarShard, "sample", recording(TarShard.sample, lambda s: s["__key__"]))
    monkeypatch.setattr(TarShard, "views", recording(TarShard.views, lambda s: s["__key__"]))
    # mapped raw path
    monkeypatch.setattr(TarShard, "locate", recording(TarShard.locate, lambda found: found[0]))
    first = make(url).loader(4, 0)
    before = take(first, 3)
    assert read == before
    read.clear()
    second = make(url).loader(4, 0)
    second.load_state_dict(first.state_dict())
    after = flat(second)
    assert read == after
    assert not set(before) & set(read)


def test_spawned_persistent_workers_follow_set_epoch_and_resume(url):
    # macOS and Windows start workers with "spawn": the dataset is pickled, its control block must stay shared.
    ds = make(url)
    loader = ds.loader(batch_size=3, num_workers=1, multiprocessing_context="spawn")
    assert flat(loader) == planned(url, 0)
    ds.set_epoch(1)
    before = take(loader, 2)
    resumed = make(url).loader(batch_size=3, num_workers=1, multiprocessing_context="spawn")
    resumed.load_state_dict(loader.state_dict())
    assert before + flat(resumed) == planned(url, 1)


def test_more_workers_than_batches(tmp_path):
    url = write_dataset(tmp_path, [1, 2])
    ds = make(url)
    loader = ds.loader(batch_size=2, num_workers=3)  # two batches: the third worker reads nothing
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert len(loader) == 2
        assert flat(loader) == planned(url, epoch)


def test_load_state_into_a_loader_whose_workers_already_run(url):
    source = make(url).loader(3, 0)
    source.dataset.set_epoch(2)
    before = take(source, 3)
    ds = make(url)
    loader = ds.loader(3, 2)
    assert flat(loader) == planned(url, 0)  # the persistent workers are up
    loader.load_state_dict(source.state_dict())
    assert before + flat(loader) == planned(url, 2)


def test_a_state_saved_right_after_loading_one_resumes_the_same(url):
    first = make(url, rank=0, world_size=2).loader(3, 0)
    before = take(first, 1)
    middle = make(url, rank=0, world_size=3).loader(3, 0)
    middle.load_state_dict(first.state_dict())
    state = middle.state_dict()  # before iterating: the loaded position, resized to 3 ranks
    assert state["world_size"] == 3 and state["consumed"] == 0
    again = make(url, rank=0, world_size=3).loader(3, 0)
    again.load_state_dict(state)
    resumed = flat(again)
    assert resumed == flat(middle)
    # both old ranks read one batch: 16 left on 3 ranks
    assert len(resumed) == -(-(22 - 2 * 3) // 3)
    assert not set(before) & set(resumed)


# -- defaults ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cores,gpus,ranks,expected",
    [
        (2, 0, 1, 1),
        (1, 0, 1, 1),
        (16, 0, 1, 1),
        (16, 1, 1, 4),
        (16, 8, 1, 15),
        (64, 8, 1, 32),
        (1, 2, 1, 1),
        (96, 8, 8, 4),
        (16, 8, 8, 1),
        (64, 8, 2, 16),
    ],
)
def test_default_num_workers(monkeypatch, cores, gpus, ranks, expected):
    import torch

    from shardstream import host
    from shardstream.loader import shard_loader as loader_module

    # torchrun's processes on this machine share its cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    # min(4 x GPUs, cores - 1) / local ranks, at least 1
    assert loader_module.default_num_workers() == expected


def test_defaults_and_overrides(url):
    import torch

    from shardstream.loader import default_num_workers

    loader = make(url).loader(batch_size=4)
    # raw local batches: locations, one reader thread (no worker process)
    assert loader.reader_threads == min(default_num_workers(), 1) and loader.num_workers == 0
    decoded = make(url, decode="torch").loader(batch_size=4)
    assert decoded.num_workers == default_num_workers() and decoded.reader_threads == 0
    assert decoded.persistent_workers and decoded.prefetch_factor == 2
    assert loader.pin_memory == torch.cuda.is_available()
    processes = make(url).loader(batch_size=4, workers="processes")
    assert processes.num_workers == min(default_num_workers(), 1) and processes.reader_threads == 0
    assert processes.persistent_workers and processes.prefetch_factor == 2
    assert loader.generator is not None and loader.dataset.seed_workers
    generator = torch.Generator()
    custom = make(url).loader(  # a worker process's argument given: processes
        batch_size=4,
        num_workers=2,
        persistent_workers=False,
        prefetch_factor=5,
        pin_memory=False,
        generator=generator,
        seed_workers=False,
    )
    assert custom.num_workers == 2 and not custom.persistent_workers and custom.prefetch_factor == 5
    assert custom.generator is generator and custom.dataset.seed_workers is False
    assert flat(custom) == planned(url)
    none = make(url).loader(batch_size=4, num_workers=0)
    assert none.num_workers == 0 and not none.persistent_workers and none.prefetch_factor is None
    with pytest.raises(ValueError, match="shm_check"):
        make(url).loader(batch_size=4, shm_check="sometimes")


@pytest.mark.parametrize("workers", [0, 2])
def test_state_with_batches_pending_in_a_prefetching_wrapper(url, workers):
    expected = planned(url)
    loader = make(url).loader(3, workers)
    it = iter(loader)
    taken = [
        next(it) for _ in range(4)
    ]  # a wrapper took 4 batches; the training loop has 2 of them
    state = loader.state_dict(pending=2)
    assert state["consumed"] == 6
    assert loader.state_dict(pending=9)["consumed"] == 0
    resumed = make(url).loader(3, workers)
    resumed.load_state_dict(state)
    assert flat(taken[:2]) + flat(resumed) == expected
