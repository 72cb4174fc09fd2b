"""A loader configures its dataset through one call (``configure`` with a ``LoaderSetup``); while a
loader reads the dataset, the settings its batches and resume state depend on refuse changes."""

from __future__ import annotations

import gc

import pytest
from sample_datasets import key_of, write_dataset

from shardstream import ShardDataset
from shardstream.dataset import LoaderSetup
from shardstream.dataset.collate import collate
from shardstream.errors import ShardstreamError

COUNTS = [5, 7, 4]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("setup"), COUNTS)


def keys(loader) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


NEW_VALUES = {
    "shuffle": False, "seed": 9, "window": 3, "drop_last": True, "batch_size": 2, "on_error": "skip",
    "transform": lambda s: s, "collate_fn": collate, "decoder": None, "store": None, "manifest": None,
    "storage": None,
}


@pytest.mark.parametrize("name", sorted(NEW_VALUES))
def test_a_setting_refuses_changes_while_a_loader_reads_the_dataset(url, name):
    ds = ShardDataset(url, decode=None)
    loader = ds.loader(batch_size=4, num_workers=0)
    before = getattr(ds, name)
    with pytest.raises(ShardstreamError, match=f"cannot set '{name}' of a ShardDataset that a loader reads"):
        setattr(ds, name, NEW_VALUES[name])
    assert getattr(ds, name) is before
    assert len(keys(loader)) == sum(COUNTS)


def test_settings_can_change_again_once_the_loader_is_gone(url):
    ds = ShardDataset(url, decode=None, seed=1)
    loader = ds.loader(batch_size=4, num_workers=0)
    first = keys(loader)
    del loader
    gc.collect()
    ds.seed = 2
    assert ds.seed == 2
    assert sorted(keys(ds.loader(batch_size=4, num_workers=0))) == sorted(first)


def test_without_a_loader_settings_change_what_the_dataset_yields(url):
    ds = ShardDataset(url, decode=None, seed=1)
    ds.shuffle = False
    assert [s["__key__"] for s in ds] == [key_of(i) for i in range(sum(COUNTS))]


def test_state_such_as_the_epoch_still_moves_while_a_loader_reads(url):
    ds = ShardDataset(url, decode=None, seed=1)
    loader = ds.loader(batch_size=4, num_workers=0)
    ds.set_epoch(3)
    assert loader.state_dict()["epoch"] == 3


def test_the_loader_sets_up_batches_through_one_call(url):
    ds = ShardDataset(url, decode=None)
    assert ds.setup == LoaderSetup(batch_size=1)  # nothing configured: one sample at a time
    loader = ds.loader(batch_size=3, num_workers=0, seed_workers=False)
    assert ds.setup.batch_size == 3 and ds.batch_size == 3
    assert ds.setup.seed_workers is False and ds.seed_workers is False
    assert loader.dataset is ds


def test_a_setup_with_no_batch_is_refused(url):
    ds = ShardDataset(url, decode=None)
    with pytest.raises(ValueError, match="at least 1"):
        ds.configure(object(), LoaderSetup(batch_size=0))


def test_the_loader_that_configured_the_dataset_may_configure_it_again(url):
    ds = ShardDataset(url, decode=None)
    loader = ds.loader(batch_size=3, num_workers=0)
    ds.configure(loader, LoaderSetup(batch_size=5))
    assert ds.batch_size == 5


def test_state_dict_and_the_earlier_names_agree(url):
    ds = ShardDataset(url, decode=None, seed=4)
    loader = ds.loader(batch_size=2, num_workers=0)
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    other = ShardDataset(url, decode=None, seed=4)
    other.load_state(saved)
    assert other.state_dict() == other.state() == saved
    rest = keys(other.loader(batch_size=2, num_workers=0))
    assert len(rest) == sum(COUNTS) - 2


def test_a_user_part_that_workers_run_is_named(url):
    def shout(sample):
        return sample

    ds = ShardDataset(url, transform=shout, decode={"txt": bytes.decode}, collate_fn=collate)
    parts = ds.worker_parts()
    assert parts["the transform"] is shout
    assert parts["the decoder of field 'txt'"] is bytes.decode
    assert "the dataset's collate_fn" not in parts  # the default one
