"""ShardLoader follows the conventions trainers rely on (torch's StatefulDataLoader, Lightning,
accelerate): len is the whole epoch, sampler.set_epoch reaches the dataset, a complete pass moves on
to the next epoch, load_state_dict applies to the next pass, the rank is resolved when a pass starts,
and no other DataLoader reads a dataset a ShardLoader configured."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from shardstream.dataset import ShardDataset
from shardstream.errors import ShardstreamError
from shardstream.loader import ShardLoader
from tests.sample_datasets import key_of, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [6, 4, 8, 6]  # 24 samples
N = sum(COUNTS)


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(
        tmp_path_factory.mktemp("conv"), COUNTS, make=lambda i: {"__key__": key_of(i), "cls": i}
    )


def make(url: str, **kwargs) -> ShardDataset:
    return ShardDataset(url, seed=5, decode=None, **kwargs)


def keys(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def planned(url: str, epoch: int, **kwargs) -> list[str]:
    ds = make(url, **kwargs)
    ds.set_epoch(epoch)
    return [s["__key__"] for s in ds]


def test_len_is_the_whole_epoch_after_a_mid_epoch_load(url):
    first = make(url).loader(4, 0)
    it = iter(first)
    next(it), next(it)
    loader = make(url).loader(4, 0)
    loader.load_state_dict(first.state_dict())
    assert len(loader) == 6 and loader.dataset.remaining() == N - 8
    assert len(keys(loader)) == N - 8


def test_sampler_set_epoch_reaches_the_dataset(url):
    loader = make(url).loader(4, 0)
    # Lightning calls only this; accelerate calls it or dataset.set_epoch
    loader.sampler.set_epoch(3)
    assert loader.dataset.epoch == 3
    assert keys(loader) == planned(url, 3)
    loader.set_epoch(2)
    assert keys(loader) == planned(url, 2)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_consumer_that_stops_at_len_still_moves_on_to_the_next_epoch(url, workers):
    loader = make(url).loader(4, workers)
    for epoch in range(2):
        it = iter(loader)
        got = keys(next(it) for _ in range(len(loader)))  # as Lightning: never asks past len()
        assert got == planned(url, epoch)
        del it
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["consumed"] == 0


def test_load_state_dict_mid_iteration_applies_to_the_next_pass(url):
    loader = make(url).loader(4, 0)
    it = iter(loader)
    before = keys(next(it) for _ in range(2))
    state = loader.state_dict()
    next(it)
    loader.load_state_dict(state)
    assert len(keys(it)) == N - 12  # the live pass goes on as it was
    assert loader.state_dict() == state  # ...and leaves the loaded state in place
    assert before + keys(loader) == planned(url, 0)


def test_a_state_after_the_last_batch_is_the_next_epoch_and_pending_batches_stay_in_the_old_one(
    url,
):
    loader = make(url).loader(4, 0)
    assert keys(loader) == planned(url, 0)
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, 0)
    pending = loader.state_dict(pending=1)  # a prefetching wrapper holds the last batch still
    assert (pending["epoch"], pending["consumed"]) == (0, N - 4)
    again = make(url).loader(4, 0)
    again.load_state_dict(pending)
    assert keys(again) == planned(url, 0)[-4:]


def test_set_epoch_to_another_epoch_warns_that_it_drops_a_loaded_position(url):
    first = make(url).loader(4, 0)
    it = iter(first)
    next(it)
    loader = make(url).loader(4, 0)
    loader.load_state_dict(first.state_dict())
    loader.dataset.set_epoch(0)  # the loaded epoch: the position is kept
    assert loader.dataset.remaining() == N - 4
    with pytest.warns(
        UserWarning, match=r"set_epoch\(1\) drops the resume position loaded for epoch 0"
    ):
        loader.dataset.set_epoch(1)
    assert keys(loader) == planned(url, 1)


def test_the_rank_is_resolved_when_a_pass_starts(url, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    loader = make(url).loader(4, 0)  # built before the launcher set the rank (Lightning, torchrun)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ShardstreamError, match="rank is not known yet"):
        next(iter(loader))
    monkeypatch.setenv("RANK", "1")
    assert len(loader) == 3
    assert keys(loader) == planned(url, 0, rank=1, world_size=2)


@pytest.mark.parametrize("workers", [0, 1])
def test_another_dataloader_over_a_configured_dataset_raises_naming_the_fix(url, workers):
    ds = make(url)
    loader = ds.loader(4, 1)
    with pytest.raises(ShardstreamError, match="another DataLoader.*Pass the ShardLoader itself"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=workers)))
    assert keys(loader) == planned(url, 0)
    plain = make(url)  # a dataset of its own: any DataLoader reads it
    assert [
        s["__key__"] for s in DataLoader(plain, batch_size=None, num_workers=workers)
    ] == planned(url, 0)


def test_accelerate_prepare_leaves_a_shardloader_alone(url):
    from accelerate import Accelerator

    loader = make(url).loader(4, 0)
    # accelerate's own marker: prepare() returns such a loader as is
    assert ShardLoader._is_accelerate_prepared
    assert Accelerator(cpu=True).prepare(loader) is loader
    assert keys(loader) == planned(url, 0)


def test_a_loader_rebuilt_without_a_batch_size_names_the_fix(url):
    loader = make(url).loader(4, 0)
    with pytest.raises(ShardstreamError, match="trainer.predict"):
        ShardLoader(loader.dataset, batch_size=None, num_workers=0)
