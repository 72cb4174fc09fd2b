"""ShardMap: m[i] is the i-th sample of an unshuffled ShardDataset epoch for every shard format, get(key),
negative and out-of-range indexes, and samplers with DataLoader workers reading every index once."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, WeightedRandomSampler

from shardstream import ShardDataset, ShardMap, TokenDataset
from shardstream.errors import TransformError, UsageError
from shardstream.manifest.index_parquet import index_parquet
from shardstream.storage import RetryPolicy
from tests.sample_datasets import key_of, write_dataset
from tests.token_corpus import pack_positions

COUNTS = [5, 1, 7, 3]  # uneven shards on purpose


def parquet_dataset(root) -> str:
    """Three Parquet files of 7, 1 and 12 rows in row groups of 3, indexed in place."""
    (root / "data").mkdir(parents=True)
    first = 0
    for f, rows in enumerate([7, 1, 12]):
        ids = list(range(first, first + rows))
        table = pa.table(
            {"__key__": [key_of(i) for i in ids], "txt": [f"text {i}" for i in ids], "cls": ids}
        )
        pq.write_table(table, root / "data" / f"train-{f:05d}-of-00003.parquet", row_group_size=3)
        first += rows
    return index_parquet([str(root / "data" / "*.parquet")]).url


@pytest.fixture(
    scope="module", params=["tar", "tar.zst", "arrow", "parquet"], ids=lambda p: p.replace(".", "-")
)
def dataset(request, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("map")
    if request.param == "parquet":
        return parquet_dataset(root)
    fmt, compression = ("tar", "zstd") if request.param == "tar.zst" else (request.param, None)
    return write_dataset(root, COUNTS, fmt=fmt, compression=compression)


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("decode", [None, "torch"])
def test_each_index_is_the_sample_an_unshuffled_epoch_yields_there(dataset, decode):
    epoch = list(ShardDataset(dataset, shuffle=False, decode=decode, rank=0, world_size=1))
    m = ShardMap(dataset, decode=decode)
    assert len(m) == len(epoch)
    for i, expected in enumerate(epoch):
        assert same(m[i], expected), i
    # negative indexes count from the end
    assert same(m[-1], epoch[-1]) and same(m[-len(m)], epoch[0])


@pytest.mark.parametrize("decode", [None, "torch"])
def test_a_batch_across_shards_is_what_its_indexes_read_one_by_one(dataset, decode):
    m = ShardMap(dataset, decode=decode, transform=None if decode else _with_index_of_key)
    n = len(m)
    order = np.random.default_rng(0).permutation(n).tolist()
    # repeats, negative indexes and numpy integers too, in the batch's order
    batch = [*order, order[0], -1, -n, np.int64(2), order[1]]
    one = [m[i] for i in batch]
    got = m.__getitems__(batch)
    assert len(got) == len(batch) and all(same(a, b) for a, b in zip(one, got))
    assert m.__getitems__([]) == []
    with pytest.raises(IndexError, match=f"sample {n} is out of range"):
        m.__getitems__([0, n, 1])


def _with_index_of_key(sample):
    return {**sample, "index": int(sample["__key__"][1:])}  # (keys are key_of(i))


def test_a_default_loader_reads_each_batch_in_one_call(dataset, monkeypatch):
    calls = []
    batch_of = ShardMap.__getitems__

    def counted(self, indexes):
        calls.append(list(indexes))
        return batch_of(self, indexes)

    monkeypatch.setattr(ShardMap, "__getitems__", counted)
    m = ShardMap(dataset, decode=None)
    order = np.random.default_rng(1).permutation(len(m)).tolist()
    loader = DataLoader(m, batch_size=4, sampler=order, collate_fn=list)  # otherwise its defaults
    keys = [s["__key__"] for batch in loader for s in batch]
    assert keys == [m[i]["__key__"] for i in order]
    assert calls == [order[k : k + 4] for k in range(0, len(order), 4)]


def test_out_of_range_indexes_raise_index_error_naming_the_dataset(dataset):
    m = ShardMap(dataset, decode=None)
    for bad in (len(m), -len(m) - 1, 10**9):
        with pytest.raises(IndexError, match="out of range"):
            m[bad]
    with pytest.raises(TypeError):
        m[1.5]
    # iteration by index stops at the end, as a sequence's does
    assert len(list(m)) == len(m)


def test_get_finds_a_sample_by_its_key(dataset):
    m = ShardMap(dataset, decode=None)
    n = len(m)
    for i in (n - 1, 0, n // 2):
        assert m.get(key_of(i))["__key__"] == key_of(i)
        assert m.index_of(key_of(i)) == i
    with pytest.raises(KeyError, match="no sample with key 'nope'"):
        m.get("nope")
    assert list(m.keys()) == [key_of(i) for i in range(n)]


def test_fields_and_transform_apply_as_in_the_streaming_dataset(dataset):
    m = ShardMap(dataset, decode=None, fields=["txt"], transform=lambda s: s["txt"])
    d = ShardDataset(
        dataset, shuffle=False, decode=None, fields=["txt"], transform=lambda s: s["txt"]
    )
    assert [m[i] for i in range(len(m))] == list(d)

    def broken(sample):
        raise ValueError("boom")

    with pytest.raises(TransformError, match=r"sample 's0000' \(position 0 in the shard\)"):
        ShardMap(dataset, decode=None, transform=broken)[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_with_workers_reads_every_index_exactly_once(dataset, workers):
    m = ShardMap(dataset, decode=None, transform=lambda s: s["__key__"])
    # without replacement, over every index: each read once, whatever the weights
    weights = torch.linspace(1.0, 3.0, len(m))
    sampler = WeightedRandomSampler(weights, len(m), replacement=False)
    loader = DataLoader(
        m,
        sampler=sampler,
        batch_size=4,
        num_workers=workers,
        collate_fn=list,
        persistent_workers=False,
    )
    keys = [k for batch in loader for k in batch]
    assert Counter(keys) == Counter(key_of(i) for i in range(len(m)))


def test_a_forked_or_unpickled_map_opens_its_own_shards(dataset):
    m = ShardMap(dataset, decode=None)
    before = m[0]
    copy = pickle.loads(pickle.dumps(m))
    assert copy._opened is None and copy[0] == before
    # a process forked after reads opens its shards again (nothing of the parent's is used)
    ctx = torch.multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        assert pool.apply(_read_last, (m,)) == m[-1]["__key__"]


def _read_last(m: ShardMap) -> str:
    return m[-1]["__key__"]


def test_token_windows_by_index(tmp_path):
    url, _ = pack_positions(tmp_path, [5, 1, 30, 12, 7, 3, 44, 9], shard_size="160B")
    epoch = list(TokenDataset(url, 4, shuffle=False, rank=0, world_size=1))
    m = ShardMap(url, seq_len=4)
    assert len(m) == len(epoch)
    for i, expected in enumerate(epoch):
        got = m[i]
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in got), i
    with pytest.raises(UsageError, match="seq_len"):
        ShardMap(url)
    with pytest.raises(UsageError, match="no keys"):
        m.get("x")


def test_index_errors_are_index_errors_for_python_sequences(tmp_path):
    url = write_dataset(tmp_path, [2], fmt="tar")
    m = ShardMap(url, decode=None)
    assert [s["__key__"] for s in m] == [key_of(0), key_of(1)]
    assert m.sample_set.per_shard.tolist() == [2]


def test_a_bool_is_not_a_sample_index(tmp_path):
    url = write_dataset(tmp_path, [3], fmt="tar")
    m = ShardMap(url, decode=None)
    for bad in (True, False, np.bool_(True)):
        with pytest.raises(TypeError, match="sample indexes are integers, not"):
            m[bad]
        with pytest.raises(TypeError, match="sample indexes are integers, not"):
            m.__getitems__([0, bad])
    assert m[np.int64(1)]["__key__"] == key_of(1)  # numpy integers are integers


def test_the_storage_keywords_of_shard_dataset(tmp_path):
    url = write_dataset(tmp_path, [3], fmt="tar")
    kw = {"retries": 2, "timeout": 7.5, "cache_limit": "1MB", "cache_dir": str(tmp_path / "c")}
    m, d = ShardMap(url, decode=None, **kw), ShardDataset(url, decode=None, **kw)
    assert m.storage == d.storage
    assert (m.storage.retries, m.storage.timeout, m.storage.cache_limit) == (2, 7.5, "1MB")
    assert m.store.retry == RetryPolicy(2, 7.5)
    with pytest.raises(ValueError, match="retries must be 0 or more"):
        ShardMap(url, retries=-1)


def test_spawned_workers_open_their_own_shards(tmp_path):
    url = write_dataset(tmp_path, [3, 2], fmt="tar")
    m = ShardMap(url, decode=None, transform=_key)
    m[0]  # the parent has shards open: they are not pickled into the workers
    loader = DataLoader(
        m, batch_size=2, num_workers=2, collate_fn=list, multiprocessing_context="spawn"
    )
    assert [k for batch in loader for k in batch] == [key_of(i) for i in range(5)]


def _key(sample) -> str:
    return sample["__key__"]


def test_ls_keys_and_cat_read_through_the_map(dataset):
    from click.testing import CliRunner

    from shardstream.cli import cli

    n = len(ShardMap(dataset, decode=None))
    listed = CliRunner().invoke(cli, ["ls", dataset, "--keys"])
    assert listed.exit_code == 0, listed.output
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [(int(i), k) for i, k, _ in rows] == [(i, key_of(i)) for i in range(n)]
    shown = CliRunner().invoke(cli, ["cat", dataset, "--key", key_of(n - 1), "--field", "txt"])
    assert shown.stdout_bytes == f"text {n - 1}".encode()
    missing = CliRunner().invoke(cli, ["cat", dataset, str(n)])
    assert missing.exit_code != 0 and "out of range" in missing.output


def test_a_split_part_reads_the_same_by_index_and_by_batch(tmp_path):
    import shardstream as ss

    url = write_dataset(tmp_path / "ds", COUNTS)
    parts = ss.split(url, tmp_path / "parts", {"a": 0.5, "b": 0.5}, seed=0)
    for part in parts:
        m = ShardMap(str(tmp_path / "parts" / part), decode=None)
        assert m.sample_set.selected  # stored rows mapped from the selection
        epoch = list(ShardDataset(str(tmp_path / "parts" / part), decode=None, shuffle=False))
        order = np.random.default_rng(1).permutation(len(m)).tolist()
        one = [m[i] for i in order]
        assert all(same(a, b) for a, b in zip(one, m.__getitems__(order)))
        assert all(same(one[k], epoch[i]) for k, i in enumerate(order))
        assert same(m[-1], epoch[-1])
