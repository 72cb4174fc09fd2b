"""on_error="skip" in every read mode: equal counts on every rank, skips counted across workers,
one log line per failing shard, and the user's transform errors never skipped."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from shardstream.dataset import MappedBytes, ShardDataset
from shardstream.dataset.samples.decode import DecodeError
from shardstream.dataset.samples.reader import SkipCount, TransformError
from shardstream.errors import CorruptShardError, ShardstreamError
from tests.sample_datasets import key_of, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [5, 1, 7, 3, 6]  # 22 samples; shard 2 holds keys 6..12
BAD = {key_of(i) for i in range(6, 13)}
GOOD_BEFORE_BAD = {key_of(i) for i in range(6)}


def damage(url: str, *shards: int) -> str:
    """Cut the end off ``shards``: each then fails as a whole (its size disagrees with the manifest)."""
    for shard in shards:
        path = Path(url) / f"shard-{shard:06d}.{'arrow' if url.endswith('arrow') else 'tar'}"
        if not path.exists():
            path = path.with_suffix(".tar.zst")
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return url


def identity(sample):
    return sample


# read mode -> (format, compression, dataset keywords)
MODES = {
    "tar-decoded": ("tar", None, {"decode": "torch"}),
    "tar-mapped": ("tar", None, {"decode": None}),  # raw bytes of local tars, as locations
    "tar.zst-raw": ("tar", "zstd", {"decode": None}),  # raw bytes, copied into batches
    "arrow-rows": ("arrow", None, {"decode": None, "transform": identity}),
    "arrow-columnar": ("arrow", None, {"decode": None}),  # whole columns, no per-row Python
}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    made: dict[str, str] = {}

    def get(mode: str, *bad: int) -> str:
        fmt, compression, _ = MODES[mode]
        name = f"{fmt}{'-zst' if compression else ''}-{'-'.join(map(str, bad))}-{fmt}"
        if name not in made:
            made[name] = damage(
                write_dataset(tmp_path_factory.mktemp("skip"), COUNTS, fmt, compression, name=name),
                *bad,
            )
        return made[name]

    return get


def make(url: str, mode: str, **kwargs) -> ShardDataset:
    return ShardDataset(url, on_error="skip", **{"shuffle": False, **MODES[mode][2], **kwargs})


def flat_keys(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_skip_keeps_every_count_and_counts_across_workers(damaged, mode, num_workers):
    ds = make(damaged(mode, 2), mode)
    loader = ds.loader(batch_size=4, num_workers=num_workers)
    batches = list(loader)
    got = flat_keys(batches)
    assert len(batches) == 6 and len(got) == len(ds) == 22
    assert [len(b["__key__"]) for b in batches] == [4, 4, 4, 4, 4, 2]
    assert not BAD & set(got)
    assert got[13:] == [key_of(i) for i in range(13, 22)]
    assert set(got[6:13]) <= GOOD_BEFORE_BAD  # each worker's last good sample stands in
    if num_workers == 0:
        assert got[:13] == [key_of(i) for i in range(6)] + [key_of(5)] * 7
    assert ds.skipped == loader.skipped == 7  # counted in the workers, seen here
    for batch in batches:  # stand-ins are whole samples, of the batch's type
        assert all(len(v) == len(batch["__key__"]) for v in batch.values())
    if mode == "tar-mapped" and num_workers == 0:
        assert isinstance(batches[0]["txt"], MappedBytes)  # good batches keep the fast path


@pytest.mark.parametrize("mode", ["tar-decoded", "tar-mapped", "arrow-rows", "arrow-columnar"])
def test_skip_without_batches_counts_in_a_plain_dataloaders_workers(damaged, mode):
    ds = make(damaged(mode, 2), mode)
    got = [s["__key__"] for s in DataLoader(ds, batch_size=None, num_workers=2)]
    assert len(got) == 22 and not BAD & set(got)
    assert ds.skipped == 7
    assert len([s["__key__"] for s in ds]) == 22  # and in this process too
    assert ds.skipped == 14


def test_skips_add_up_over_epochs_with_persistent_workers_and_can_be_reset(damaged):
    ds = make(damaged("arrow-columnar", 2), "arrow-columnar", shuffle=True, seed=4)
    loader = ds.loader(batch_size=4, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert len(flat_keys(loader)) == 22
    assert ds.skipped == 14
    ds.skipped = 0
    ds.set_epoch(2)
    assert len(flat_keys(loader)) == 22
    assert ds.skipped == loader.skipped == 7


@pytest.mark.parametrize("shuffle", [False, True])
def test_columnar_batches_fill_in_as_rows_do(damaged, shuffle):
    url = damaged("arrow-columnar", 2)
    columnar = flat_keys(
        make(url, "arrow-columnar", shuffle=shuffle, seed=5, shuffle_window=9).loader(
            batch_size=4, num_workers=0
        )
    )
    rows = flat_keys(
        make(url, "arrow-rows", shuffle=shuffle, seed=5, shuffle_window=9).loader(
            batch_size=4, num_workers=0
        )
    )
    assert columnar == rows and len(columnar) == 22 and not BAD & set(columnar)


def test_columnar_batches_that_fail_first_take_a_stand_in(damaged):
    ds = make(damaged("arrow-columnar", 0), "arrow-columnar")  # the rank's first 5 samples fail
    got = flat_keys(ds.loader(batch_size=4, num_workers=0))
    assert got[:5] == [key_of(5)] * 5 and got[5:] == [key_of(i) for i in range(5, 22)]
    assert ds.skipped == 5


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["tar-decoded", "tar-mapped", "arrow-columnar"])
def test_two_ranks_each_with_a_damaged_shard_yield_the_same_batches(damaged, mode, num_workers):
    url = damaged(mode, 1, 4)  # unshuffled, rank 0 reads shards 0-2 and rank 1 shards 2-4
    lengths, skipped = [], []
    for rank in range(2):
        ds = make(url, mode, rank=rank, world_size=2)
        batches = list(ds.loader(batch_size=4, num_workers=num_workers))
        assert sum(len(b["__key__"]) for b in batches) == len(ds) == 11
        lengths.append(len(batches))
        skipped.append(ds.skipped)
    assert lengths == [3, 3]
    assert skipped == [1, 6]


def test_a_rank_whose_every_sample_fails_says_so(damaged):
    ds = make(damaged("arrow-columnar", 0, 1, 2, 3, 4), "arrow-columnar")
    with pytest.raises(ShardstreamError, match="no sample of this rank's part of .* loads") as info:
        list(ds.loader(batch_size=4, num_workers=0))
    assert "(the first: " in str(info.value) and "the manifest says" in str(info.value)  # why, too


def test_on_error_raise_in_columnar_batches_names_the_shard_that_does_not_load(damaged):
    url = damaged("arrow-columnar", 2)
    ds = ShardDataset(url, shuffle=False, decode=None)
    with pytest.raises(CorruptShardError) as info:
        list(ds.loader(batch_size=4, num_workers=0))
    # the shard is truncated: no sample of it is to blame
    shard = Path(url) / "shard-000002.arrow"
    assert str(info.value).startswith(
        f"{os.path.join(url, shard.name)}: {shard.stat().st_size} bytes, "
    )


# -- one log line per shard ----------------------------------------------------------------------


def shard_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("shard ")]


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_lost_shard_is_logged_once_per_pass(damaged, caplog, batch_size):
    url = damaged("tar-decoded", 2)
    ds = make(url, "tar-decoded")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        for _ in range(2):
            got = (
                [s["__key__"] for s in ds]
                if batch_size is None
                else flat_keys(ds.loader(batch_size=batch_size, num_workers=0))
            )
            assert len(got) == 22
    lines = shard_lines(caplog)
    assert len(lines) == 2  # one per pass, not one per sample
    first = 1 if batch_size is None else 2  # the samples of the batch that met the shard first
    path = os.path.join(url, "shard-000002.tar")
    assert lines[0].startswith(
        f"shard 2 ({path}): skipped {first} sample{'s' if first > 1 else ''}: "
        "the shard does not load: "
    )
    assert "the manifest says" in lines[0] and path not in lines[0][len(path) + 10 :]  # named once
    assert "ds.skipped is" in lines[0]
    if batch_size is not None:  # and the loader's summary of the pass, with the total
        assert (
            "epoch 1: skipped 7 samples of rank 0 (on_error='skip'); ds.skipped is 14"
            in caplog.text
        )


def test_many_lost_shards_are_logged_up_to_a_limit(tmp_path, caplog):
    url = damage(write_dataset(tmp_path, [1] * 30), *range(25))
    ds = ShardDataset(url, shuffle=False, on_error="skip", decode=None)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert len([s["__key__"] for s in ds]) == 30
    lines = shard_lines(caplog)
    assert len(lines) == 20
    assert "more shards fail in this pass: they are counted, not logged" in lines[-1]
    assert ds.skipped == 25


def test_a_shard_one_worker_reported_is_not_reported_by_another(monkeypatch):
    count = SkipCount()
    assert count.claim(3)
    monkeypatch.setattr(SkipCount, "slot", staticmethod(lambda: 2))  # another process of the rank
    assert not count.claim(3)
    assert count.claim(4)
    count.add(5)
    monkeypatch.setattr(SkipCount, "slot", staticmethod(lambda: 1))
    assert count.claim(3)  # a process's own shard: its own per-pass rule decides
    count.add(2)
    assert count.total == 7


# -- the user's code: transform errors are not bad data ------------------------------------------


def fails_on_key_8(sample):
    if sample["__key__"] == key_of(8):
        raise ValueError("a bug in the transform")
    return sample


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_error_is_raised_even_when_skipping(damaged, num_workers):
    url = damaged("tar-decoded", 4)  # damaged elsewhere: skipping is on and works
    ds = ShardDataset(url, shuffle=False, on_error="skip", transform=fails_on_key_8)
    with pytest.raises(TransformError) as info:
        list(ds.loader(batch_size=4, num_workers=num_workers))
    message = str(info.value)
    assert (
        "the transform raised ValueError on sample 's0008' (position 2 in the shard) of " in message
    )
    assert os.path.join(url, "shard-000002.tar") in message and "a bug in the transform" in message
    assert "not skipped by on_error='skip'" in message


def test_a_transform_error_raised_while_finding_a_stand_in_is_not_swallowed(damaged):
    def fails_always(sample):
        raise KeyError("jpg")

    ds = ShardDataset(
        damaged("tar-decoded", 0), shuffle=False, on_error="skip", transform=fails_always
    )
    with pytest.raises(TransformError, match="the transform raised KeyError"):
        list(ds)


def test_a_decode_function_that_fails_is_bad_data_and_skipped(damaged, caplog):
    def cls(data: bytes) -> int:
        if int(data) in (4, 5):
            raise ValueError("not a class")
        return int(data)

    url = damaged("tar-decoded", 4)
    ds = ShardDataset(url, shuffle=False, on_error="skip", decode={"cls": cls, "*": None})
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = flat_keys(ds.loader(batch_size=4, num_workers=0))
    # keys 4 and 5 are in shards 0 and 1
    assert shard_lines(caplog)[0] == (
        f"shard 0 ({os.path.join(url, 'shard-000000.tar')}): skipped 1 sample: the first, sample 's0004' (position 4 in the shard): "
        "field 'cls' does not decode (the decoder given for it raised ValueError: not a class) (later ones of "
        "this shard are counted, not logged: ds.skipped is 2)"
    )
    assert got[:8] == [key_of(i) for i in range(4)] + [key_of(3)] * 2 + [key_of(6), key_of(7)]
    assert ds.skipped == 2 + 6

    def whole(sample):
        raise ValueError("cannot parse")

    with pytest.raises(DecodeError, match="the decode function raised ValueError: cannot parse"):
        list(ShardDataset(url, shuffle=False, decode=whole))
