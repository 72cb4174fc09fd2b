"""ShardDataset: equal per-rank counts, coverage, deterministic order, decoding, batches and errors."""

from __future__ import annotations

import io
import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from shardstream import plan
from shardstream.dataset import ShardDataset
from shardstream.dataset.samples.decode import DecodeError
from shardstream.errors import CorruptShardError, ShardstreamError
from shardstream.manifest import MANIFEST_NAME, load_manifest
from shardstream.packing.writer import ShardWriter
from shardstream.storage import Store
from tests.sample_datasets import key_of, text_sample, write_dataset

COUNTS = [5, 1, 7, 3, 6]  # uneven shards, 22 samples: not divisible by 3 or 4


def keys(iterable) -> list[str]:
    return [s["__key__"] for s in iterable]


def all_keys(counts=COUNTS) -> list[str]:
    return [key_of(i) for i in range(sum(counts))]


def planned_keys(counts, seed: int, epoch: int, shuffle: bool = True) -> list[str]:
    """The global order straight from the plan, mapped to the keys written in manifest order."""
    order = plan.EpochOrder.create(counts, seed, epoch, shuffle)
    shards, offsets = order.samples(np.arange(sum(counts)))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return [key_of(int(starts[s] + o)) for s, o in zip(shards, offsets)]


@pytest.fixture(scope="module")
def tar_ds(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("tar"), COUNTS)


@pytest.fixture(scope="module", params=["tar", "tar.zst", "arrow"])
def any_ds(request, tmp_path_factory) -> str:
    fmt, compression = {"tar": ("tar", None), "tar.zst": ("tar", "zstd"), "arrow": ("arrow", None)}[
        request.param
    ]
    return write_dataset(tmp_path_factory.mktemp(request.param), COUNTS, fmt, compression)


# -- lengths and coverage ---------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 22, 23, 40])
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_is_the_per_rank_count(tar_ds, world_size, drop_last):
    n = sum(COUNTS)
    expected = n // world_size if drop_last else -(-n // world_size)
    for rank in sorted({0, world_size // 2, world_size - 1}):
        ds = ShardDataset(
            tar_ds, rank=rank, world_size=world_size, drop_last=drop_last, decode=None
        )
        assert len(ds) == expected


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_together_reads_every_key_once(any_ds, world_size, drop_last):
    n = sum(COUNTS)
    global_order = keys(ShardDataset(any_ds, seed=3, decode=None))
    per_rank = []
    for rank in range(world_size):
        ds = ShardDataset(
            any_ds, seed=3, rank=rank, world_size=world_size, drop_last=drop_last, decode=None
        )
        got = keys(ds)
        assert len(got) == len(ds)
        per_rank.append(got)
    counts = Counter(k for got in per_rank for k in got)
    if drop_last:
        assert max(counts.values()) == 1
        kept = world_size * (n // world_size)
        assert set(counts) == set(global_order[:kept])  # the tail of the epoch is dropped
    else:
        padding = world_size * -(-n // world_size) - n
        assert set(counts) == set(all_keys())
        assert sum(counts.values()) == n + padding
        repeats = sorted(k for k, c in counts.items() for _ in range(c - 1))
        assert repeats == sorted(global_order[:padding])  # padding repeats the start of the epoch


def test_uniform_shards_with_a_small_final_shard(tmp_path):
    url = str(tmp_path / "ds")
    with ShardWriter(url, samples_per_shard=4) as writer:
        for i in range(10):
            writer.write(text_sample(i))
    assert load_manifest(Store(url)).stored_counts.tolist() == [4, 4, 2]
    got = [keys(ShardDataset(url, rank=r, world_size=3, seed=1, decode=None)) for r in range(3)]
    assert [len(g) for g in got] == [4, 4, 4]
    flat = [k for g in got for k in g]
    assert set(flat) == set(all_keys([10]))
    assert flat[10:] == flat[:2]  # 12 reads for 10 samples: the first two again


def test_dataset_reads_the_plan(tar_ds):
    for epoch in (0, 1):
        ds = ShardDataset(tar_ds, seed=11, decode=None)
        ds.set_epoch(epoch)
        assert keys(ds) == planned_keys(COUNTS, 11, epoch)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("window", [None, 4])
def test_same_seed_same_global_order_for_any_world_size_and_workers(tar_ds, window):
    n = sum(COUNTS)
    reference = keys(ShardDataset(tar_ds, seed=5, shuffle_window=window, decode=None))
    assert sorted(reference) == all_keys()
    for world_size in (1, 2, 3):
        padding = world_size * -(-n // world_size) - n
        for workers in (0, 1, 2, 3):
            flat = []
            for rank in range(world_size):
                ds = ShardDataset(
                    tar_ds,
                    seed=5,
                    shuffle_window=window,
                    rank=rank,
                    world_size=world_size,
                    decode=None,
                )
                flat += keys(DataLoader(ds, batch_size=None, num_workers=workers))
            assert flat == reference + reference[:padding], (world_size, workers)


def test_set_epoch_changes_the_order_and_the_same_epoch_repeats_it(tar_ds):
    ds = ShardDataset(tar_ds, seed=2, decode=None)
    epoch0 = keys(ds)
    assert ds.epoch == 1  # a complete pass moves on to the next epoch
    ds.set_epoch(0)
    assert keys(ds) == epoch0
    epoch1 = keys(ds)
    assert sorted(epoch1) == sorted(epoch0) == all_keys()
    assert epoch1 != epoch0
    ds.set_epoch(1)
    assert keys(ds) == epoch1
    ds.set_epoch(0)
    assert keys(ds) == epoch0
    other = ShardDataset(tar_ds, seed=2, decode=None)
    other.set_epoch(1)
    assert keys(other) == epoch1  # a function of (seed, epoch), not of history
    assert keys(ShardDataset(tar_ds, seed=3, decode=None)) != epoch0


@pytest.mark.parametrize("world_size", [1, 3])
def test_shuffle_false_reads_in_manifest_order(any_ds, world_size):
    n = sum(COUNTS)
    per = -(-n // world_size)
    padded = all_keys() + all_keys()[: world_size * per - n]
    for rank in range(world_size):
        ds = ShardDataset(any_ds, shuffle=False, rank=rank, world_size=world_size, decode=None)
        ds.set_epoch(4)  # the epoch does not matter without shuffling
        assert keys(ds) == padded[rank * per : (rank + 1) * per]


@pytest.mark.parametrize("world_size", [6, 9])
def test_more_ranks_than_shards(tmp_path, world_size):
    url = write_dataset(tmp_path, [3, 4, 2])
    got = [
        keys(ShardDataset(url, rank=r, world_size=world_size, decode=None))
        for r in range(world_size)
    ]
    assert all(len(g) == 9 // world_size + (9 % world_size > 0) for g in got)
    assert set(k for g in got for k in g) == set(all_keys([9]))


@pytest.mark.parametrize("drop_last", [False, True])
def test_more_ranks_than_samples(tmp_path, drop_last):
    url = write_dataset(tmp_path, [1, 2])
    world_size = 5
    got = []
    for rank in range(world_size):
        ds = ShardDataset(url, rank=rank, world_size=world_size, drop_last=drop_last, decode=None)
        assert len(ds) == (0 if drop_last else 1)
        got.append(keys(ds))
        assert len(got[-1]) == len(ds)
    if not drop_last:
        assert set(k for g in got for k in g) == set(all_keys([3]))


# -- rank and world size ------------------------------------------------------------------


def test_rank_and_world_size_come_from_the_environment(tar_ds, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = ShardDataset(tar_ds, seed=4, decode=None)
    assert (ds.rank, ds.world_size) == (1, 3)
    assert len(ds) == 8
    explicit = ShardDataset(tar_ds, seed=4, rank=1, world_size=3, decode=None)
    assert keys(ds) == keys(explicit)


def test_explicit_rank_and_world_size_override_the_environment(tar_ds, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = ShardDataset(tar_ds, rank=0, world_size=2, decode=None)
    assert (ds.rank, ds.world_size, len(ds)) == (0, 2, 11)
    assert ShardDataset(tar_ds, rank=2, decode=None).world_size == 3  # only the rank given
    assert ShardDataset(tar_ds, world_size=4, decode=None).rank == 1  # only the world size given


def test_without_environment_rank_0_of_1(tar_ds, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ds = ShardDataset(tar_ds, decode=None)
    assert (ds.rank, ds.world_size, len(ds)) == (0, 1, 22)


@pytest.mark.parametrize("rank,world_size", [(3, 3), (-1, 2), (0, 0)])
def test_a_rank_outside_the_world_is_refused(tar_ds, rank, world_size):
    with pytest.raises(ShardstreamError):
        ShardDataset(tar_ds, rank=rank, world_size=world_size)


# -- decoding, transforms, batches ---------------------------------------------------------


def png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (5, 4), (i, 2 * i, 3 * i)).save(buf, format="PNG")
    return buf.getvalue()


def image_sample(i: int) -> dict:
    return {"__key__": key_of(i), "png": png(i), "cls": i, "txt": f"t{i}", "bin": bytes([i, i])}


@pytest.fixture(scope="module")
def image_ds(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("img"), [4, 3, 3], make=image_sample)


def test_decode_none_gives_bytes(image_ds):
    samples = list(ShardDataset(image_ds, shuffle=False, decode=None))
    assert len(samples) == 10
    for i, s in enumerate(samples):
        assert s == {
            "__key__": key_of(i),
            "png": png(i),
            "cls": str(i).encode(),
            "txt": f"t{i}".encode(),
            "bin": bytes([i, i]),
        }


def test_default_decode_is_torch(image_ds):
    s = next(iter(ShardDataset(image_ds, shuffle=False)))
    assert s["png"].shape == (3, 4, 5) and s["png"].dtype == torch.uint8
    assert s["png"][:, 0, 0].tolist() == [0, 0, 0]
    assert s["cls"] == 0 and s["txt"] == "t0" and s["bin"] == b"\0\0"


def test_transform_is_applied_to_decoded_samples(image_ds):
    seen = []

    def transform(sample):
        seen.append(type(sample["png"]))
        return (sample["__key__"], sample["png"].float().mean().item(), sample["cls"] * 10)

    out = list(ShardDataset(image_ds, shuffle=False, decode="torch", transform=transform))
    assert [o[0] for o in out] == all_keys([10])
    assert [o[2] for o in out] == [i * 10 for i in range(10)]
    assert out[1][1] == pytest.approx((1 + 2 + 3) / 3)
    assert set(seen) == {torch.Tensor}


def test_batch_size_yields_collated_batches(image_ds):
    batches = list(ShardDataset(image_ds, shuffle=False, batch_size=4))
    assert [len(b["__key__"]) for b in batches] == [4, 4, 2]  # the last batch is partial
    first, last = batches[0], batches[-1]
    assert first["__key__"] == all_keys([4])
    assert isinstance(first["png"], torch.Tensor) and first["png"].shape == (4, 3, 4, 5)
    assert last["png"].shape == (2, 3, 4, 5)
    assert torch.equal(first["cls"], torch.tensor([0, 1, 2, 3]))
    assert first["txt"] == ["t0", "t1", "t2", "t3"]
    assert first["bin"] == [bytes([i, i]) for i in range(4)]
    assert last["cls"].tolist() == [8, 9]


def test_batches_of_bytes_are_lists(image_ds):
    batches = list(ShardDataset(image_ds, shuffle=False, batch_size=3, decode=None))
    assert [len(b["png"]) for b in batches] == [3, 3, 3, 1]
    assert batches[0]["cls"] == [b"0", b"1", b"2"]
    assert batches[0]["png"] == [png(0), png(1), png(2)]


def test_batches_follow_the_sample_order(image_ds):
    ds = ShardDataset(image_ds, seed=9, decode=None)
    order = keys(ds)
    batched = ShardDataset(image_ds, seed=9, decode=None, batch_size=3)
    assert [k for b in batched for k in b["__key__"]] == order


# -- errors --------------------------------------------------------------------------------


def bad_jpg_sample(i: int) -> dict:
    return {"__key__": key_of(i), "png": b"not an image" if i == 5 else png(i), "cls": i}


@pytest.fixture(scope="module")
def bad_ds(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("bad"), [4, 4, 2], make=bad_jpg_sample)


def test_on_error_raise_names_the_shard_and_the_sample(bad_ds):
    ds = ShardDataset(bad_ds, shuffle=False)
    with pytest.raises(ShardstreamError) as info:
        list(ds)
    assert isinstance(info.value, DecodeError)
    message = str(info.value)
    assert os.path.join(bad_ds, "shard-000001.tar") in message
    assert repr(key_of(5)) in message
    assert "'png'" in message


def test_on_error_raise_for_a_failing_transform(tar_ds):
    def transform(sample):
        if sample["__key__"] == key_of(8):
            raise ValueError("transform failed here")
        return sample

    with pytest.raises(ShardstreamError) as info:
        list(ShardDataset(tar_ds, transform=transform))
    message = str(info.value)
    # shards of 5, 1, 7: key 8 is in the third
    assert os.path.join(tar_ds, "shard-000002.tar") in message
    assert repr(key_of(8)) in message and "transform failed here" in message


def test_on_error_skip_in_batches_keeps_the_length_and_counts(bad_ds, caplog):
    ds = ShardDataset(bad_ds, shuffle=False, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        batches = list(ds.loader(batch_size=4, num_workers=0))
    flat = [k for b in batches for k in b["__key__"]]
    assert len(flat) == len(ds) == 10
    assert key_of(5) not in flat
    assert flat[4:8] == [
        key_of(4),
        key_of(4),
        key_of(6),
        key_of(7),
    ]  # the last good sample stands in
    assert batches[1]["png"].shape == (4, 3, 4, 5)
    assert ds.skipped == 1
    assert any(
        key_of(5) in r.getMessage() and "shard-000001.tar" in r.getMessage() for r in caplog.records
    )


def test_on_error_skip_at_the_start_of_a_batch(tar_ds):
    def cls(
        data: bytes,
    ) -> int:  # a decode function: its failures are bad data (a transform's are bugs)
        if int(data) in (4, 5):
            raise ValueError("bad")
        return int(data)

    ds = ShardDataset(tar_ds, shuffle=False, on_error="skip", decode={"cls": cls, "*": None})
    flat = [k for b in ds.loader(batch_size=4, num_workers=0) for k in b["__key__"]]
    assert len(flat) == 22
    assert flat[4:8] == [
        key_of(3),
        key_of(3),
        key_of(6),
        key_of(7),
    ]  # the last good sample fills in
    assert ds.skipped == 2


def test_on_error_skip_without_batches_keeps_the_length_and_counts(bad_ds, caplog):
    ds = ShardDataset(bad_ds, shuffle=False, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = keys(ds)
    assert len(got) == len(ds) == 10
    assert key_of(5) not in got
    assert ds.skipped == 1
    assert any(key_of(5) in r.getMessage() for r in caplog.records)


def test_on_error_must_be_raise_or_skip(tar_ds):
    with pytest.raises(ValueError):
        ShardDataset(tar_ds, on_error="ignore")


def test_a_truncated_shard_is_an_error_naming_it(tmp_path):
    url = write_dataset(tmp_path, [3, 3, 3])
    path = Path(url) / "shard-000001.tar"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1024])
    ds = ShardDataset(url, shuffle=False, decode=None)
    with pytest.raises(CorruptShardError) as info:
        list(ds)
    assert str(path) in str(info.value)


def test_a_missing_manifest_is_an_error(tmp_path):
    url = write_dataset(tmp_path, [2])
    os.remove(os.path.join(url, MANIFEST_NAME))
    with pytest.raises(ShardstreamError, match=MANIFEST_NAME):
        ShardDataset(url)


def test_the_manifest_url_opens_the_dataset(tar_ds):
    ds = ShardDataset(os.path.join(tar_ds, MANIFEST_NAME), shuffle=False, decode=None)
    assert keys(ds) == all_keys()


# -- other sources ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wds_tars(tmp_path_factory) -> list[str]:
    wds = pytest.importorskip("webdataset")
    root = tmp_path_factory.mktemp("wds")
    with wds.ShardWriter(str(root / "part-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": key_of(i), "txt": f"text {i}", "cls": i})
    return sorted(str(p) for p in root.glob("part-*.tar"))


def test_webdataset_tars_by_brace_pattern(wds_tars):
    assert len(wds_tars) == 3
    pattern = os.path.join(os.path.dirname(wds_tars[0]), "part-{000000..000002}.tar")
    ds = ShardDataset(pattern, shuffle=False)
    assert len(ds) == 10
    samples = list(ds)
    assert keys(samples) == all_keys([10])
    assert samples[3]["txt"] == "text 3" and samples[3]["cls"] == 3


def test_webdataset_tars_by_list(wds_tars):
    ds = ShardDataset(wds_tars, seed=1, rank=1, world_size=2, decode=None)
    assert len(ds) == 5
    other = ShardDataset(wds_tars, seed=1, rank=0, world_size=2, decode=None)
    assert sorted(keys(ds) + keys(other)) == all_keys([10])
    assert all(int(s["cls"]) == int(s["__key__"][1:]) for s in ds)


def test_a_single_webdataset_tar(wds_tars):
    ds = ShardDataset(wds_tars[-1], shuffle=False, decode=None)
    assert keys(ds) == [key_of(8), key_of(9)]


def arrow_sample(i: int) -> dict:
    return {
        "__key__": key_of(i),
        "label": i,
        "score": i / 4,
        "name": f"n{i}",
        "data": bytes([i]) * 3,
    }


def test_arrow_rows_come_back_as_dicts(tmp_path):
    url = write_dataset(tmp_path, [3, 2, 4], fmt="arrow", make=arrow_sample)
    assert keys(ShardDataset(url, shuffle=False)) == all_keys([9])
    for decode in ("torch", None):
        rows = list(ShardDataset(url, shuffle=False, decode=decode))
        assert rows == [arrow_sample(i) for i in range(9)]
    batch = next(iter(ShardDataset(url, shuffle=False, batch_size=4)))
    assert batch["label"].tolist() == [0, 1, 2, 3]
    assert batch["score"].tolist() == [0.0, 0.25, 0.5, 0.75]
    assert batch["name"] == ["n0", "n1", "n2", "n3"]
    assert batch["data"] == [bytes([i]) * 3 for i in range(4)]


def test_arrow_batch_mode_gives_writable_tensors_for_flat_and_list_columns(tmp_path):
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream import pack

    table = pa.table({"x": pa.array(range(10), pa.float32()), "v": [[i, i + 1] for i in range(10)]})
    pq.write_table(table, tmp_path / "t.parquet")
    pack(tmp_path / "t.parquet", tmp_path / "ds", progress=False, shuffle=False)
    ds = ShardDataset(str(tmp_path / "ds"), shuffle=False, decode=None, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about tensors over read-only memory
        first = next(iter(ds))
    assert first["x"].tolist() == [0.0, 1.0, 2.0, 3.0] and first["v"].tolist() == [
        [0, 1],
        [1, 2],
        [2, 3],
        [3, 4],
    ]
    first["x"] += 1  # own memory: writing is fine and leaves the shard alone
    again = next(iter(ShardDataset(str(tmp_path / "ds"), shuffle=False, decode=None, batch_size=4)))
    assert again["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


# -- remote storage (fsspec's in-memory filesystem stands in for a bucket; tests/remote uses real endpoints)


def to_memory(url: str) -> str:
    """A copy of the local dataset ``url`` on ``memory://``, which shardstream treats as remote."""
    import uuid

    local = Store(url)
    remote = Store(f"memory://dataset-test-{uuid.uuid4().hex}/ds")
    for name in local.list_files(recursive=True):  # .shardstream/ too: the shards' indexes
        remote.write_bytes(name, bytes(local.read_bytes(name)))
    return remote.url


@pytest.fixture(scope="module")
def remote_ds(any_ds) -> str:
    """``any_ds`` (each of its formats once) copied to ``memory://``."""
    return to_memory(any_ds)


@pytest.mark.parametrize("prefetch", [0, 100, "512MB"])
def test_a_remote_dataset_reads_the_plan_through_the_cache(remote_ds, tmp_path, prefetch):
    ds = ShardDataset(remote_ds, seed=3, decode=None, cache_dir=tmp_path, prefetch=prefetch)
    assert keys(ds) == planned_keys(COUNTS, 3, 0)
    m = ds.manifest
    cached = {p.name.removesuffix(".shard") for p in tmp_path.glob("*.shard")}
    # whole shards, and the sample indexes of those whose first samples came by ranged reads (on a busy
    # machine, a small shard's every sample may: its whole download is then never needed)
    assert cached <= set(m.sha256) | set(m.index_sha256 or [])
    assert cached & set(m.sha256)  # and shards were read through the cache
    if not m.index_sha256:  # no ranged reads: every shard came whole
        assert cached == set(m.sha256)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_remote_dataset_through_the_loader_matches_the_local_one(
    any_ds, remote_ds, tmp_path, num_workers
):
    # the same shards
    assert load_manifest(Store(any_ds)).sha256 == load_manifest(Store(remote_ds)).sha256
    local = ShardDataset(any_ds, seed=5, decode=None).loader(4, num_workers=num_workers)
    remote = ShardDataset(remote_ds, seed=5, decode=None, cache_dir=tmp_path).loader(
        4, num_workers=num_workers
    )
    got = [k for batch in remote for k in batch["__key__"]]
    assert got == [k for batch in local for k in batch["__key__"]]
    assert sorted(got) == all_keys()


def test_remote_shards_are_prefetched_in_the_order_the_plan_needs_them(
    tar_ds, tmp_path, monkeypatch
):
    from shardstream.storage import prefetch as prefetch_module

    wanted: list[int] = []
    original = prefetch_module.Prefetcher.want

    def spy(self, items):
        items = list(items)
        wanted.extend(i for i in items if i not in wanted)
        return original(self, items)

    monkeypatch.setattr(prefetch_module.Prefetcher, "want", spy)
    ds = ShardDataset(to_memory(tar_ds), seed=8, decode=None, cache_dir=tmp_path, shuffle_window=4)
    m = ds.manifest
    starts = np.concatenate([[0], np.cumsum(COUNTS)[:-1]])
    shard_of = {
        key_of(i): int(np.searchsorted(starts, i, side="right") - 1) for i in range(sum(COUNTS))
    }
    first_use = list(dict.fromkeys(shard_of[k] for k in keys(ds)))
    assert wanted == first_use
    assert len(wanted) == m.num_shards


def test_a_missing_remote_shard_names_its_url(tar_ds, tmp_path):
    url = to_memory(tar_ds)
    store = Store(url)
    store.remove("shard-000002.tar")
    ds = ShardDataset(url, shuffle=False, decode=None, cache_dir=tmp_path)
    with pytest.raises(ShardstreamError, match=r"shard-000002\.tar.*no such file"):
        keys(ds)


def test_stopping_early_leaves_no_prefetch_threads(tar_ds, tmp_path):
    import gc
    import threading
    import time

    def prefetchers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("shardstream-prefetch")}

    before = prefetchers()  # other tests' threads may still be on their way out
    ds = ShardDataset(to_memory(tar_ds), decode=None, cache_dir=tmp_path)
    it = iter(ds)
    next(it)
    started = prefetchers() - before
    assert started
    it.close()
    del it
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in started)


def test_a_bad_remote_shard_is_fetched_a_bounded_number_of_times_per_pass_when_skipping(
    tar_ds, tmp_path, monkeypatch
):
    url = to_memory(tar_ds)
    store = Store(url)
    original = bytes(store.read_bytes("shard-000002.tar"))
    # damaged in storage
    store.write_bytes("shard-000002.tar", bytes([original[0] ^ 1]) + original[1:])
    ds = ShardDataset(
        url, shuffle=False, decode=None, cache_dir=tmp_path, on_error="skip", retries=1
    )
    reads = []
    fs = ds.store.fs
    real = fs.cat_ranges

    def spy(paths, starts, ends, *a, **k):
        reads.extend(zip(paths, starts, ends))
        return real(paths, starts, ends, *a, **k)

    monkeypatch.setattr(fs, "cat_ranges", spy)
    got = keys(ds)
    assert len(got) == sum(COUNTS) and ds.skipped == COUNTS[2]
    size = len(original)
    bad = [(s, e) for p, s, e in reads if p.endswith("shard-000002.tar")]
    whole = [r for r in bad if r[0] in (0, None) and r[1] in (size, None)]
    # retries + 1 whole GETs, not that many per sample; ranged GETs of its first samples (through its
    # sample index, which fail their sha256 too) at most as many, if the server serves them fast enough
    assert len(whole) == 2 and len(bad) - len(whole) <= 2
