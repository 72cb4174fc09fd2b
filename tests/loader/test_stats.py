"""loader.stats(): counts equal what was read, across workers, a resume and the disk cache; the verdict."""

from __future__ import annotations

import uuid

import pytest

from shardstream.dataset import ShardDataset
from shardstream.loader.stats import LoaderStats, verdict
from shardstream.manifest import load_manifest
from shardstream.storage import Store
from tests.sample_datasets import write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [6, 4, 7, 5]  # 22 samples
N = sum(COUNTS)


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("stats"), COUNTS)


def total_bytes(url: str) -> int:
    return int(load_manifest(Store(url)).nbytes.sum())


def to_memory(url: str) -> str:
    """A copy of ``url`` on ``memory://``, which shardstream treats as remote storage."""
    local, remote = Store(url), Store(f"memory://stats-{uuid.uuid4().hex}/ds")
    for name in local.list_files(recursive=True):  # .shardstream/ too: the shards' indexes
        remote.write_bytes(name, bytes(local.read_bytes(name)))
    return remote.url


@pytest.mark.parametrize("num_workers", [0, 2])
def test_counts_equal_what_the_epoch_read_summed_over_workers(url, num_workers):
    loader = ShardDataset(url, shuffle=False, decode="torch").loader(
        batch_size=4, num_workers=num_workers
    )
    batches = list(loader)
    s = loader.stats()
    assert (s.samples, s.batches, s.samples_read) == (N, len(batches), N)
    assert s.batches == -(-N // 4)
    # every worker maps the shards it reads: with one reader, each shard once
    assert s.storage_bytes == total_bytes(url) * (1 if num_workers == 0 else num_workers)
    assert (s.cache_bytes, s.cache_hits, s.cache_misses, s.skipped, s.last_skip) == (
        0,
        0,
        0,
        0,
        None,
    )
    assert (
        s.read_s > 0
        and s.decode_s > 0
        and s.collate_s > 0
        and s.transform_s == 0
        and s.download_s == 0
    )
    assert 0 < s.wait_s <= s.elapsed_s
    d = s.as_dict()
    assert (
        d["samples"] == N
        and 0 < d["data_wait_fraction"] <= 1
        and d["dominant_stage"] in ("read", "decode", "collate")
    )
    assert (
        all(isinstance(v, float) for v in s.scalars().values()) and "last_skip" not in s.scalars()
    )


def test_a_transform_is_timed_as_its_own_stage(url):
    loader = ShardDataset(
        url, decode="torch", transform=lambda s: {**s, "n": len(s["txt"])}
    ).loader(batch_size=5, num_workers=0)
    list(loader)
    assert loader.stats().transform_s > 0


def test_skips_are_counted_and_the_last_one_named(url):
    def txt(data: bytes) -> str:
        text = bytes(data).decode()
        if text in ("text 3", "text 13"):
            raise ValueError("damaged")
        return text

    loader = ShardDataset(url, shuffle=False, decode={"txt": txt}, on_error="skip").loader(
        batch_size=4, num_workers=2
    )
    list(loader)
    s = loader.stats()
    assert s.skipped == 2 and s.samples == N
    # sample 13 is the 4th of shard 2 (6 + 4 before it); with two workers either may report last, by time
    assert s.last_skip in (
        f"{Store(url).url_of(load_manifest(Store(url)).paths[0])}: sample at position 3 in the shard",
        f"{Store(url).url_of(load_manifest(Store(url)).paths[2])}: sample at position 3 in the shard",
    )


def test_the_second_epoch_over_remote_storage_reads_the_disk_cache(url, tmp_path):
    remote = to_memory(url)
    loader = ShardDataset(remote, shuffle=False, decode=None, cache_dir=tmp_path).loader(
        batch_size=4, num_workers=0
    )
    list(loader)
    first = loader.stats()
    assert (first.cache_misses, first.cache_hits) == (len(COUNTS), 0)
    assert (first.storage_bytes, first.cache_bytes) == (total_bytes(url), 0)
    assert first.transfer_s > 0
    list(loader)  # the next epoch: every shard from the cache
    second = loader.stats()
    assert (second.cache_misses, second.cache_hits) == (len(COUNTS), len(COUNTS))
    assert (second.storage_bytes, second.cache_bytes) == (total_bytes(url), total_bytes(url))
    assert second.samples == 2 * N and second.samples_read == 2 * N


def test_stats_add_up_across_a_resume(url):
    ds = ShardDataset(url, shuffle=True, seed=5, decode="torch")
    loader = ds.loader(batch_size=4, num_workers=2)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    del it
    assert loader.stats().samples == 8

    resumed = ShardDataset(url, shuffle=True, seed=5, decode="torch").loader(
        batch_size=4, num_workers=2
    )
    resumed.load_state_dict(state)
    list(resumed)
    assert resumed.stats().samples == N - 8 and resumed.stats().batches == -(-(N - 8) // 4)

    loader.load_state_dict(state)  # the same loader goes on: its counts keep adding up
    list(loader)
    assert loader.stats().samples == N
    assert loader.stats().samples_read >= N  # workers may have read ahead of the two batches taken


def test_report_stats_calls_back_every_n_batches(url):
    loader = ShardDataset(url, decode=None).loader(batch_size=2, num_workers=0)
    got: list[dict[str, float]] = []
    loader.report_stats(every=3, callback=got.append)
    list(loader)
    assert [d["batches"] for d in got] == [3.0, 6.0, 9.0]
    assert got[-1]["samples"] == 18.0
    loader.report_stats(every=0)
    list(loader)
    assert len(got) == 3
    with pytest.raises(ValueError, match="every"):
        loader.report_stats(every=-1)


def test_report_stats_logs_a_line_without_a_callback(url, caplog):
    loader = ShardDataset(url, decode=None).loader(batch_size=11, num_workers=0)
    loader.report_stats(every=1)
    with caplog.at_level("INFO", logger="shardstream"):
        list(loader)
    lines = [r.getMessage() for r in caplog.records if "samples/s" in r.getMessage()]
    assert len(lines) == 2 and "of step time waiting for data" in lines[-1]


def test_verdict_names_the_bound_and_the_stage_to_fix():
    stages = {"download": 0.0, "read": 1.0, "decode": 6.0, "transform": 2.0, "collate": 0.5}
    assert verdict(0.38, stages, steps=10) == (
        "input-bound: 38% of step time waiting for data; decode dominates; "
        "try more workers or the fast decoder (pip install 'shardstream[fast]')"
    )
    assert verdict(0.03, stages, steps=10).startswith(
        "compute-bound: 3% of step time waiting for data"
    )
    assert "host-to-device copies dominate" in verdict(0.5, stages, steps=10, copy_s=20.0)
    assert verdict(0.5, {}, steps=0) == "no batches yet"
    stats = LoaderStats(batches=4, decode_s=1.0, read_s=3.0, wait_s=1.0, elapsed_s=2.0)
    assert stats.dominant_stage == "read" and stats.stage_shares()["read"] == 0.75
    assert stats.verdict().startswith(
        "input-bound: 50% of step time waiting for data; read dominates"
    )


def test_a_fresh_loader_reports_zeros(url):
    s = ShardDataset(url, decode=None).loader(batch_size=4, num_workers=0).stats()
    assert s == LoaderStats() and s.verdict() == "no batches yet" and s.dominant_stage is None


def test_the_counters_table_is_shared_with_the_workers_a_dataset_is_sent_to(url):
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers the shared-memory reductions workers use

    ds = ShardDataset(url, decode=None)
    copy = pickle.loads(ForkingPickler.dumps(ds))  # as a spawn worker receives it
    copy.counters.add(samples=5)
    assert ds.counters.totals()["samples"] == 5  # the same shared memory
