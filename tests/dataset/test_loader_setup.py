"""A loader configures its dataset through one call (``configure`` with a ``LoaderSetup``); while a
loader reads the dataset, the settings its batches and resume state depend on refuse changes."""

from __future__ import annotations

import dataclasses
import functools
import gc

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardstream import ShardDataset
from shardstream.dataset import LoaderSetup
from shardstream.dataset.batches import collate as collate_module
from shardstream.dataset.batches.collate import collate
from shardstream.dataset.samples.decode import Decoder
from shardstream.errors import ShardstreamError
from shardstream.loader.transport import Ring, Shipment
from tests.sample_datasets import key_of, write_dataset

COUNTS = [5, 7, 4]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("setup"), COUNTS)


def keys(loader) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


NEW_VALUES = {
    "shuffle": False,
    "seed": 9,
    "window": 3,
    "drop_last": True,
    "batch_size": 2,
    "on_error": "skip",
    "transform": lambda s: s,
    "collate_fn": collate,
    "decoder": None,
    "seed_workers": False,
}
FIXED = {
    "store": None,
    "manifest": None,
    "storage": None,
    "disk_cache": None,
    "prefetch": 0,
    "sample_set": None,
}


@pytest.mark.parametrize("name", sorted(NEW_VALUES))
def test_a_setting_refuses_changes_while_a_loader_reads_the_dataset(url, name):
    ds = ShardDataset(url, decode=None)
    loader = ds.loader(batch_size=4, num_workers=0)
    before = getattr(ds, name)
    with pytest.raises(
        ShardstreamError, match=f"cannot set '{name}' of a ShardDataset that a loader reads"
    ):
        setattr(ds, name, NEW_VALUES[name])
    assert getattr(ds, name) is before
    assert len(keys(loader)) == sum(COUNTS)


@pytest.mark.parametrize("name", sorted(FIXED))
def test_what_the_dataset_was_made_with_is_fixed(url, name):
    ds = ShardDataset(url, decode=None)
    before = getattr(ds, name)
    with pytest.raises(
        ShardstreamError, match=f"'{name}' of a ShardDataset is fixed when it is made"
    ):
        setattr(ds, name, FIXED[name])
    assert getattr(ds, name) is before or getattr(ds, name) == before  # (prefetch is made anew)


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
    ds.transform = lambda s: {**s, "tagged": True}
    assert all(s["tagged"] for s in ds)
    ds.transform = None
    ds.decoder = Decoder("torch")
    assert isinstance(next(iter(ds))["txt"], str)  # decoded now


def test_on_error_set_after_construction_is_honoured(tmp_path):
    url = write_dataset(
        tmp_path, [4], make=lambda i: {"__key__": key_of(i), "cls": "x" if i == 2 else str(i)}
    )
    ds = ShardDataset(url, shuffle=False, decode="torch")
    with pytest.raises(ShardstreamError, match=r"sample 's0002' \(position 2 in the shard\)"):
        list(ds)
    ds.on_error = "skip"
    assert [s["cls"] for s in ds] == [0, 1, 1, 3]
    assert ds.skipped == 1
    ds.skipped = 0
    assert ds.skipped == 0


def test_seed_workers_is_the_datasets_own_setting_without_a_loader(url):
    ds = ShardDataset(url, decode=None)
    ds.seed_workers = False
    assert ds.seed_workers is False and ds.setup.seed_workers is False
    loader = ds.loader(batch_size=2, num_workers=0)
    # the loader takes the dataset's, unless told otherwise
    assert loader.dataset.seed_workers is False


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


def test_the_loader_that_reads_the_dataset_may_change_its_transport_but_not_its_batches(url):
    ds = ShardDataset(url, decode=None)
    loader = ds.loader(batch_size=3, num_workers=0)
    with pytest.raises(ShardstreamError, match="cannot change how its dataset makes batches"):
        ds.configure(loader, LoaderSetup(batch_size=5))
    assert ds.batch_size == 3 and len(keys(loader)) == sum(COUNTS)
    ds.configure(loader, dataclasses.replace(ds.setup, sender=print))
    assert ds.setup.sender is print


def test_once_its_loader_is_gone_the_dataset_forgets_its_transport(url):
    ds = ShardDataset(url, decode=None, shuffle=False)
    loader = ds.loader(
        batch_size=3, num_workers=2, workers="processes"
    )  # their shared-memory transport
    assert ds.setup.sender is not None
    del loader
    gc.collect()
    assert ds.setup.sender is None
    plain = DataLoader(ds, batch_size=3, num_workers=1)
    batches = list(plain)
    assert all(isinstance(b, dict) for b in batches)  # batches, not a gone loader's shipments
    assert [k for b in batches for k in b["__key__"]] == [key_of(i) for i in range(sum(COUNTS))]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("read_first", [False, True])
def test_a_dataset_whose_loader_is_gone_yields_samples_to_a_plain_dataloader(
    tmp_path, workers, read_first
):
    """Not the gone loader's batches of 25, which a DataLoader batching again nests ([25, 25, ...])."""
    image = lambda i: {"__key__": key_of(i), "npy": np.full((3, 8, 8), i % 250, np.uint8), "cls": i}  # noqa: E731
    url = write_dataset(tmp_path, [40, 35], make=image)
    ds = ShardDataset(url, decode="torch", shuffle=False, rank=0, world_size=1)
    loader = ds.loader(batch_size=25, num_workers=workers)
    if read_first:
        assert sum(len(b["cls"]) for b in loader) == 75
    del loader
    gc.collect()
    assert ds.batch_size is None
    batches = list(DataLoader(ds, batch_size=25, num_workers=workers))
    # one level of batches
    assert all(b["npy"].shape[1:] == (3, 8, 8) and len(b["npy"]) <= 25 for b in batches)
    assert all(isinstance(k, str) for b in batches for k in b["__key__"])
    assert sorted(k for b in batches for k in b["__key__"]) == [
        key_of(i) for i in range(75)
    ]  # each worker its part
    # a new loader sets its own again
    assert ds.loader(batch_size=5, num_workers=0).dataset.batch_size == 5


def test_a_loader_that_torch_refuses_leaves_the_dataset_free(url):
    ds = ShardDataset(url, decode=None)
    try:
        ds.loader(batch_size=2, num_workers=0, prefetch_factor=2)
    except ValueError as exc:
        held = exc  # a notebook keeps the last error, and with it the half-made loader
    ds.seed = 5  # not refused: no loader reads the dataset
    assert len(keys(ds.loader(batch_size=2, num_workers=0))) == sum(COUNTS)
    assert "prefetch_factor" in str(held)


def test_a_user_part_that_workers_run_is_named(url):
    def shout(sample):
        return sample

    ds = ShardDataset(url, transform=shout, decode={"txt": bytes.decode}, collate_fn=collate)
    parts = ds.worker_parts()
    assert parts["the transform"] is shout
    assert parts["the decoder of field 'txt'"] is bytes.decode
    assert "the dataset's collate_fn" not in parts  # the default one


# -- in a worker: what the setup asks of the dataset's iteration ------------------------------------


class FakeWorker:
    """What torch's get_worker_info() gives inside a DataLoader worker."""

    num_workers, id = 1, 0


class Holder:
    """Stands in for the loader (the dataset keeps a weak reference to it)."""


@pytest.fixture
def in_a_worker(monkeypatch):
    from shardstream.dataset import contract

    monkeypatch.setattr(contract, "get_worker_info", lambda: FakeWorker())


def numbers(i: int) -> dict:
    return {"__key__": key_of(i), "cls": i, "npy": np.full(4, i, dtype=np.int32)}


def ring_sender():
    return functools.partial(Ring, torch.full((1, 4), -1, dtype=torch.int64), slots=4)


@pytest.mark.parametrize(
    ("fmt", "decode", "sender", "checked"),
    [
        ("tar", "numpy", False, True),  # samples decoded and collated
        ("tar", "numpy", True, True),  # ...into the transport's arena
        ("arrow", "torch", False, True),  # Arrow columns
        # locations in the shard files: nothing in shared memory to check
        (
            "tar",
            None,
            False,
            False,
        ),
    ],
)
def test_each_worker_checks_the_first_batch_of_each_pass_before_it_leaves(
    tmp_path, in_a_worker, fmt, decode, sender, checked
):
    url = write_dataset(tmp_path, COUNTS, fmt, make=numbers)
    ds = ShardDataset(url, decode=decode, shuffle=False)
    seen = []
    holder = Holder()
    ds.configure(
        holder,
        LoaderSetup(
            batch_size=4, sender=ring_sender() if sender else None, check_first_batch=seen.append
        ),
    )
    for _ in range(2):
        out = list(ds)
        assert len(out) == -(-sum(COUNTS) // 4)
    if not checked:
        assert seen == []
        return
    assert len(seen) == 2  # once per pass
    assert [int(v) for v in seen[0]["cls"]] == [0, 1, 2, 3]  # the pass's first batch
    if sender:
        assert all(isinstance(b, Shipment) for b in out)


def test_the_transport_allocates_only_while_the_batch_is_made(tmp_path, in_a_worker):
    url = write_dataset(tmp_path, COUNTS, make=numbers)
    ds = ShardDataset(url, decode="numpy", shuffle=False)
    holder = Holder()
    ds.configure(holder, LoaderSetup(batch_size=4, sender=ring_sender()))
    it = iter(ds)
    first = next(it)
    assert isinstance(first, Shipment)
    # not left active while the worker's generator waits
    assert collate_module._ALLOCATOR.get() is None
    assert collate([numbers(0)])["npy"].untyped_storage().data_ptr() != 0
    assert len(list(it)) == -(-sum(COUNTS) // 4) - 1


def test_a_collate_fn_of_the_users_gets_raw_samples_of_local_tars(url):
    def count(samples):
        return {
            "n": len(samples),
            "keys": [s["__key__"] for s in samples],
            "txt": [bytes(s["txt"]) for s in samples],
        }

    ds = ShardDataset(url, decode=None, shuffle=False, collate_fn=count)
    assert not ds.mapped
    batches = list(ds.loader(batch_size=4, num_workers=0))
    assert [b["n"] for b in batches] == [4, 4, 4, 4]
    assert batches[0]["txt"][0] == b"text 0"
