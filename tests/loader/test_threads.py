"""Reader threads (``workers="threads"``): the planned order, resume, errors and early stops, as with
worker processes."""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path

import pytest

from shardstream import MixedDataset, ShardDataset
from shardstream.errors import CorruptShardError
from shardstream.manifest.side_names import index_name
from tests.sample_datasets import key_of
from tests.sample_datasets import write_dataset as _write_dataset

COUNTS = [5, 1, 7, 3, 6, 4, 9]
SEED = 21


def write_dataset(root: Path, counts, name: str = "ds") -> str:
    return _write_dataset(root, counts, make=lambda i: {"__key__": key_of(i), "cls": i}, name=name)


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("threads"), COUNTS)


def make(url: str, **kwargs) -> ShardDataset:
    kwargs.setdefault("seed", SEED)
    kwargs.setdefault("decode", None)
    return ShardDataset(url, **kwargs)


def flat(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("shardstream-reader")]


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_threads_give_the_planned_order_of_worker_processes(
    url, threads, batch_size, rank, world_size
):
    expected = flat(make(url, rank=rank, world_size=world_size).loader(batch_size, 0))
    loader = make(url, rank=rank, world_size=world_size).loader(
        batch_size, threads, workers="threads"
    )
    assert loader.reader_threads == threads and loader.num_workers == 0
    batches = list(loader)
    assert flat(batches) == expected
    assert len(loader) == len(batches)


def test_decoded_batches_and_later_epochs(url):
    ds = make(url, decode="torch", shuffle=False)
    loader = ds.loader(batch_size=4, num_workers=2, workers="threads")
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = list(loader)
        assert [c for b in batches for c in b["cls"].tolist()] == list(range(sum(COUNTS)))


@pytest.mark.parametrize("before,after", [("threads", "processes"), ("processes", "threads")])
def test_a_resume_state_of_threads_resumes_with_processes_and_back(url, before, after):
    expected = flat(make(url).loader(3, 0))
    first = make(url).loader(3, 2, workers=before)
    it = iter(first)
    got = [k for _ in range(4) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    second = make(url).loader(3, 3, workers=after)
    second.load_state_dict(state)
    assert got + flat(second) == expected


def test_a_mix_reads_in_threads_as_in_the_main_process(tmp_path):
    a = write_dataset(tmp_path, [4, 6, 3], name="a")
    b = write_dataset(tmp_path, [5, 5], name="b")

    def mix() -> MixedDataset:
        return MixedDataset([make(a), make(b)], weights=[1, 2], seed=3, samples_per_epoch=30)

    expected = flat(mix().loader(4, 0))
    assert flat(mix().loader(4, 2, workers="threads")) == expected


def test_an_error_in_a_thread_is_raised_in_the_main_thread_with_its_message(tmp_path):
    url = write_dataset(tmp_path, [4, 4, 4])
    shard = sorted(Path(url).glob("*.tar"))[1]
    shard.write_bytes(b"\0" * shard.stat().st_size)  # same size, no tar
    (shard.parent / index_name(shard.name)).unlink()
    loader = make(url, shuffle=False).loader(2, 2, workers="threads")
    with pytest.raises(CorruptShardError, match=shard.name):
        list(loader)
    gc.collect()
    assert not [t for t in reader_threads() if t.is_alive()]


def test_leaving_a_pass_early_stops_its_threads(url):
    loader = make(url).loader(1, 3, workers="threads")
    it = iter(loader)
    next(it)
    assert len(reader_threads()) == 3
    it.close()  # the loop is left: the pass's threads are told to stop and joined
    del it
    gc.collect()
    assert not [t for t in reader_threads() if t.is_alive()]


def test_unknown_worker_mode_is_refused(url):
    with pytest.raises(ValueError, match="workers must be one of"):
        make(url).loader(2, 2, workers="fibers")


def test_threads_take_prefetch_factor_and_persistent_workers_without_complaint(url):
    loader = make(url).loader(2, 2, workers="threads", prefetch_factor=4, persistent_workers=True)
    assert flat(loader) == flat(make(url).loader(2, 0))


def test_token_windows_read_in_threads_as_in_the_main_process(tmp_path):
    from shardstream import TokenDataset
    from tests.token_corpus import pack_positions

    url, _ = pack_positions(tmp_path, [5, 1, 30, 12, 7, 3, 44, 9, 2, 18], shard_size="120B")

    def windows(**kwargs) -> list[list[int]]:
        loader = TokenDataset(url, 6, seed=2).loader(3, **kwargs)
        return [row for b in loader for row in b["input_ids"].tolist()]

    assert windows(num_workers=2, workers="threads") == windows(num_workers=0)


def test_a_dataset_that_skips_failing_samples_reads_with_processes(url):
    # the stand-in for a failing sample is each worker's last good one, kept per process
    auto = make(url, on_error="skip").loader(2, 2)
    assert auto.reader_threads == 0 and auto.num_workers == 2
    with pytest.raises(ValueError, match="on_error='skip'"):
        make(url, on_error="skip").loader(2, 2, workers="threads")


def test_auto_reads_stored_bytes_with_threads_and_user_code_with_processes(tmp_path):
    """ "auto": threads for batches of stored bytes with nothing of the user's in them (local tars, and
    compressed or remote shards, whose batches are not locations), processes as soon as user code runs."""
    zst = _write_dataset(
        tmp_path, [5, 4], compression="zstd", make=lambda i: {"__key__": key_of(i), "cls": i}
    )
    raw = ShardDataset(zst, decode=None, shuffle=False)
    assert not raw.mapped  # its batches are bytes, not locations
    loader = raw.loader(2, 2)
    assert loader.reader_threads == 2 and loader.num_workers == 0
    assert flat(loader) == flat(ShardDataset(zst, decode=None, shuffle=False).loader(2, 0))
    for user_code in (
        {"transform": lambda s: s},
        {"decode": "torch"},
    ):
        assert ShardDataset(zst, shuffle=False, **user_code).loader(2, 2).reader_threads == 0
    custom = ShardDataset(zst, decode=None, collate_fn=lambda b: b).loader(2, 2)
    assert custom.reader_threads == 0 and custom.num_workers == 2


def test_auto_reads_token_windows_with_processes_and_threads_when_named(tmp_path):
    """ "auto" for token windows: worker processes (measured faster than reader threads); threads when
    named; the count is the user's either way, and the windows are the same."""
    from shardstream import TokenDataset
    from tests.token_corpus import pack_positions

    url, _ = pack_positions(tmp_path, [5, 1, 30, 12, 7, 3, 44, 9, 2, 18], shard_size="120B")

    def rows(loader) -> list[list[int]]:
        return [row for b in loader for row in b["input_ids"].tolist()]

    expected = rows(TokenDataset(url, 6, seed=2).loader(3, 0))
    auto = TokenDataset(url, 6, seed=2).loader(3, 2)
    assert auto.reader_threads == 0 and auto.num_workers == 2
    assert rows(auto) == expected
    threads = TokenDataset(url, 6, seed=2).loader(3, 2, workers="threads")
    assert threads.reader_threads == 2 and threads.num_workers == 0
    assert rows(threads) == expected
    named = TokenDataset(url, 6, seed=2).loader(3, 1, workers="processes")
    assert named.reader_threads == 0 and named.num_workers == 1
