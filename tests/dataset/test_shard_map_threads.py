"""One ShardMap shared by threads (a thread pool fetching samples, a thread-based loader): every call gives
exactly the samples one thread alone reads, with no error, though the threads open and close shards
(more shards than a map keeps open) and look keys up at once. Threads switch as often as the interpreter
allows, so that interleavings which a coarse switch interval would hide happen in every run."""

from __future__ import annotations

import random
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream import ShardMap
from shardstream.manifest.index_parquet import index_parquet
from tests.sample_datasets import key_of, write_dataset

SHARDS = 40  # more than the 16 shards a map keeps open: threads close each other's shards
PER_SHARD = 5
THREADS = 4


@pytest.fixture(autouse=True)
def switch_often():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _parquet(root) -> str:
    (root / "data").mkdir(parents=True)
    for f in range(SHARDS):
        ids = range(f * PER_SHARD, (f + 1) * PER_SHARD)
        table = pa.table({"__key__": [key_of(i) for i in ids], "txt": [f"text {i}" for i in ids]})
        pq.write_table(table, root / "data" / f"part-{f:03d}.parquet", row_group_size=2)
    return index_parquet([str(root / "data" / "*.parquet")]).url


@pytest.fixture(scope="module", params=["tar", "parquet"])
def dataset(request, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("threads")
    if request.param == "parquet":
        return _parquet(root)
    return write_dataset(root, [PER_SHARD] * SHARDS)


def _bytes(sample) -> tuple:
    return tuple(
        sorted((k, bytes(v) if isinstance(v, memoryview) else v) for k, v in sample.items())
    )


def test_threads_sharing_a_map_get_exactly_the_samples_and_no_errors(dataset):
    n = SHARDS * PER_SHARD
    alone = ShardMap(dataset, decode=None)
    expected = [_bytes(alone[i]) for i in range(n)]
    m = ShardMap(dataset, decode=None)
    rng = random.Random(1)
    calls = [
        [rng.randrange(n)] if c % 2 else [rng.randrange(n) for _ in range(8)] for c in range(1500)
    ]
    errors: Counter[str] = Counter()

    def call(indexes: list[int]) -> int:
        try:
            got = m.__getitems__(indexes)
        except Exception as exc:  # counted: the test says which, and how often
            errors[f"{type(exc).__name__}: {exc}"] += 1
            return 0
        return sum(_bytes(s) != expected[i] for s, i in zip(got, indexes))

    with ThreadPoolExecutor(THREADS) as pool:
        wrong = sum(pool.map(call, calls))
    assert not errors, errors.most_common(3)
    assert wrong == 0


def _look_up_at_once(m: ShardMap, wanted: list[int]) -> dict[int, int | str]:
    """``m.index_of`` of the keys of ``wanted``, split among threads that start together."""
    barrier = threading.Barrier(THREADS)
    found: dict[int, int | str] = {}

    def look(part: list[int]) -> None:
        barrier.wait()
        for i in part:
            try:
                found[i] = m.index_of(key_of(i))
            except KeyError as exc:
                found[i] = f"KeyError: {exc}"

    threads = [threading.Thread(target=look, args=(wanted[t::THREADS],)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return found


def test_threads_looking_keys_up_at_once_find_every_key(dataset):
    n = SHARDS * PER_SHARD
    for trial in range(6):
        m = ShardMap(dataset, decode=None)  # nothing scanned yet: the threads scan together
        wanted = random.Random(trial).sample(range(n), 3 * THREADS)
        assert _look_up_at_once(m, wanted) == {i: i for i in wanted}
