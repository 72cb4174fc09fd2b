"""MixedDataset: exact quotas, world-size and worker independence, passes, resume, tokens, errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.dataset import MixedDataset, ShardDataset, TokenDataset
from shardstream.errors import UsageError
from tests.sample_datasets import write_dataset

SIZES = {"a": [5, 7, 3], "b": [4, 4], "c": [2, 9, 1]}  # 15, 8 and 12 samples, uneven shards


def sample_of(name: str, offset: int):
    return lambda i: {"__key__": f"{name}{i:03d}", "txt": f"{name} {i}", "cls": offset + i}


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    return {
        name: write_dataset(root, counts, name=name, make=sample_of(name, 100 * k))
        for k, (name, counts) in enumerate(SIZES.items())
    }


def make(urls, weights=(0.5, 0.3, 0.2), decode=None, **kwargs) -> MixedDataset:
    sources = [ShardDataset(urls[name], decode=decode, seed=k) for k, name in enumerate(SIZES)]
    return MixedDataset(sources, list(weights) if weights is not None else None, **kwargs)


def keys_of(loader, limit: int | None = None) -> list[str]:
    out: list[str] = []
    for n, batch in enumerate(loader, 1):
        out += batch["__key__"]
        if n == limit:
            break
    return out


def planned(urls, **kwargs) -> list[str]:
    return keys_of(make(urls, **kwargs).loader(4, 0))


def test_quotas_sources_and_len(urls):
    ds = make(urls, samples_per_epoch=40)
    assert ds.quota.tolist() == [20, 12, 8] and len(ds) == 40
    got = Counter()
    for batch in ds.loader(5, 0):
        assert [k[0] for k in batch["__key__"]] == ["abc"[i] for i in batch["__source__"].tolist()]
        got.update(batch["__source__"].tolist())
    assert got == {0: 20, 1: 12, 2: 8}


def test_default_weights_interleave_every_sample_once(urls):
    ds = make(urls, weights=None)
    assert len(ds) == 35
    keys = planned(urls, weights=None)
    assert sorted(keys) == sorted(f"{n}{i:03d}" for n, c in SIZES.items() for i in range(sum(c)))


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_the_order_is_the_same_for_any_number_of_workers(urls, workers):
    expected = planned(urls, samples_per_epoch=37)
    assert keys_of(make(urls, samples_per_epoch=37).loader(3, workers)) == expected


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    weights=st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
    total=st.integers(1, 60),
    world=st.integers(1, 5),
    batch=st.integers(1, 7),
)
def test_ranks_split_one_global_order(urls, weights, total, world, batch):
    expected = keys_of(make(urls, weights, samples_per_epoch=total).loader(batch, 0))
    per_rank = -(-total // world)
    got = []
    for rank in range(world):
        ds = make(urls, weights, samples_per_epoch=total, rank=rank, world_size=world)
        assert len(ds) == per_rank
        got.append(keys_of(ds.loader(batch, 0)))
    assert all(len(g) == per_rank for g in got)  # equal counts on every rank (padded)
    flat = [k for g in got for k in g]
    # padding wraps
    assert flat[:total] == expected and flat[total:] == (expected * world)[: len(flat) - total]
    q = make(urls, weights, samples_per_epoch=total).quota
    assert Counter(k[0] for k in expected) == {n: int(c) for n, c in zip("abc", q) if c}


def test_upsampled_source_repeats_every_sample_before_any_a_third_time(urls):
    keys = planned(urls, weights=(0.2, 0.7, 0.1), samples_per_epoch=30)  # b: 21 of 8 samples
    b = [k for k in keys if k[0] == "b"]
    assert len(b) == 21
    first, second, third = b[:8], b[8:16], b[16:]
    # whole passes, in turn
    assert sorted(first) == sorted(second) == [f"b{i:03d}" for i in range(8)]
    assert len(set(third)) == 5 and first != second  # each pass its own shuffle


def test_downsampled_source_continues_in_the_next_epoch(urls):
    ds = make(urls, weights=(0.1, 0.1, 0.8), samples_per_epoch=10)  # a: 1 per epoch of 15 samples
    loader = ds.loader(5, 0)
    a = []
    for epoch in range(30):
        ds.set_epoch(epoch)
        a += [k for k in keys_of(loader) if k[0] == "a"]
    assert len(a) == 30
    assert sorted(a[:15]) == sorted(a[15:]) == [f"a{i:03d}" for i in range(15)]  # two whole passes


def test_each_source_keeps_its_own_decode_and_transform(urls):
    sources = [
        ShardDataset(urls["a"], fields=["txt", "cls"]),
        ShardDataset(
            urls["b"], fields=["txt", "cls"], transform=lambda s: {**s, "cls": s["cls"] * 0 - 1}
        ),
    ]
    ds = MixedDataset(sources, [0.5, 0.5], samples_per_epoch=10)
    batch = next(iter(ds.loader(10, 0)))
    src = batch["__source__"]
    assert (batch["cls"][src == 1] == -1).all() and (batch["cls"][src == 0] >= 0).all()


def test_mapped_and_decoded_batches_hold_the_same_samples(urls):
    raw = make(urls, samples_per_epoch=20)
    assert raw.mapped
    got = [bytes(b["txt"][i]) for b in raw.loader(4, 2) for i in range(len(b["txt"]))]
    decoded = make(urls, decode="torch", samples_per_epoch=20)
    assert not decoded.mapped
    assert got == [t.encode() for b in decoded.loader(4, 2) for t in b["txt"]]


@pytest.mark.parametrize(
    ("before", "after"), [((2, 2), (3, 1)), ((3, 0), (1, 3)), ((1, 1), (2, 0))]
)
def test_resume_with_another_world_size_and_workers(urls, before, after):
    total = 36  # divisible by 2 and 3: no padding, every planned position read once
    expected = Counter(planned(urls, samples_per_epoch=total))
    first, states = [], []
    world, workers = before
    for rank in range(world):
        loader = make(urls, samples_per_epoch=total, rank=rank, world_size=world).loader(3, workers)
        first += keys_of(loader, limit=2)
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states)
    state = json.loads(json.dumps(states[0]))
    second = []
    world, workers = after
    for rank in range(world):
        loader = make(urls, samples_per_epoch=total, rank=rank, world_size=world).loader(2, workers)
        loader.load_state_dict(state)
        second.append(keys_of(loader))
    assert len({len(g) for g in second}) == 1
    assert Counter(first) + Counter(k for g in second for k in g) == expected


def test_a_state_of_another_mix_is_refused(urls):
    state = make(urls, samples_per_epoch=20).loader(2, 0).state_dict()
    with pytest.raises(Exception, match="fingerprint|samples"):
        make(urls, weights=(0.1, 0.1, 0.8), samples_per_epoch=20).loader(2, 0).load_state_dict(
            state
        )
    with pytest.raises(Exception, match="seed"):
        make(urls, samples_per_epoch=20, seed=3).loader(2, 0).load_state_dict(state)


def test_the_mix_seed_varies_the_passes(urls):
    assert planned(urls, samples_per_epoch=30) != planned(urls, samples_per_epoch=30, seed=1)
    assert planned(urls, samples_per_epoch=30, seed=1) == planned(
        urls, samples_per_epoch=30, seed=1
    )


def test_unbatched_samples_carry_their_source(urls):
    ds = make(urls, decode="torch", samples_per_epoch=6)
    samples = list(torch.utils.data.DataLoader(ds, batch_size=None))
    assert len(samples) == 6 and all(s["__key__"][0] == "abc"[s["__source__"]] for s in samples)


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1, 2], "2 weights for 3 sources"),
        ([1, -1, 1], "weight -1 of source 1"),
        ([1, float("nan"), 1], "weight nan of source 1"),
        ([0, 0, 0], "every weight of the mix is 0"),
    ],
)
def test_bad_weights_name_the_source(urls, weights, match):
    with pytest.raises(ValueError, match=match):
        make(urls, weights=weights)


def test_bad_sources_and_epochs(urls):
    with pytest.raises(ValueError, match="at least one source"):
        MixedDataset([])
    with pytest.raises(TypeError, match="source 1 of the mix is a str"):
        MixedDataset([ShardDataset(urls["a"]), urls["b"]])
    with pytest.raises(ValueError, match="samples_per_epoch"):
        make(urls, samples_per_epoch=0)


def test_sources_decoded_differently_are_refused_naming_the_field(urls):
    sources = [
        ShardDataset(urls["a"], decode=None, fields=["cls"]),
        ShardDataset(urls["b"], fields=["cls"]),
    ]
    ds = MixedDataset(sources, [0.5, 0.5], samples_per_epoch=8)
    expected = r"field 'cls' of source 1 of the mix \(.*b\) is a number, of source 0 .* bytes"
    with pytest.raises(UsageError, match=expected):
        keys_of(ds.loader(4, 0))


def test_sources_with_other_fields_are_refused_naming_the_field(urls):
    sources = [
        ShardDataset(urls["a"], fields=["txt", "cls"]),
        ShardDataset(urls["b"], fields=["txt"]),
    ]
    ds = MixedDataset(sources, [0.5, 0.5], samples_per_epoch=8)
    with pytest.raises(
        UsageError, match=r"source 1 of the mix \(.*b\) lacks field 'cls' that source 0"
    ):
        keys_of(ds.loader(4, 0))


# -- token sources -----------------------------------------------------------------------------------


def token_dataset(root: Path, name: str, docs: list[list[int]]) -> str:
    from shardstream.packing import pack

    src = root / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in docs))
    pack(
        str(src),
        str(root / name),
        format="tokens",
        tokenizer=lambda text: [int(t) for t in text.split()],
        eos_id=0,
        vocab_size=1000,
        progress=False,
        shard_size="64B",
    )
    return str(root / name)


def test_a_token_mix_weighs_tokens_and_keeps_document_boundaries(tmp_path):
    web = token_dataset(
        tmp_path, "web", [list(range(100 + 10 * d, 108 + 10 * d)) for d in range(20)]
    )
    code = token_dataset(
        tmp_path, "code", [list(range(500 + 10 * d, 505 + 10 * d)) for d in range(20)]
    )
    sources = [TokenDataset(web, 4, seed=1), TokenDataset(code, 4, seed=2)]
    ds = MixedDataset(sources, [0.75, 0.25], samples_per_epoch=40)
    tokens = Counter()
    for batch in ds.loader(8, 2):
        src = batch["__source__"]
        assert ((batch["input_ids"][src == 0] < 500) | (batch["input_ids"][src == 0] == 0)).all()
        assert ((batch["input_ids"][src == 1] >= 500) | (batch["input_ids"][src == 1] == 0)).all()
        assert (batch["labels"][:, :-1] == batch["input_ids"][:, 1:]).all()
        assert (
            batch["cu_seqlens"][-1] == batch["input_ids"].numel()
            and batch["cu_seqlens"].dtype == torch.int32
        )
        for i in (0, 1):
            tokens[i] += int((src == i).sum()) * 4
    assert tokens == {0: 120, 1: 40}  # labels per source, in the weights' ratio
    with pytest.raises(UsageError, match="seq_len"):
        MixedDataset([TokenDataset(web, 4), TokenDataset(code, 3)])


def test_tokens_and_samples_do_not_mix(tmp_path, urls):
    web = token_dataset(tmp_path, "web", [list(range(1, 30))])
    with pytest.raises(UsageError, match="TokenDataset"):
        MixedDataset([ShardDataset(urls["a"]), TokenDataset(web, 4)])


def test_len_of_a_rank_and_drop_last(urls):
    assert len(make(urls, samples_per_epoch=10, rank=0, world_size=3)) == 4
    assert len(make(urls, samples_per_epoch=10, rank=0, world_size=3, drop_last=True)) == 3
    ds = make(urls, samples_per_epoch=10, rank=2, world_size=3, drop_last=True)
    assert len(keys_of(ds.loader(2, 0))) == 3


# -- class-balanced sampling -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split_pack(tmp_path_factory) -> str:
    from shardstream import pack
    from tests.sample_datasets import make_files

    root = tmp_path_factory.mktemp("labels")
    counts = {"ant": 3, "cat": 24, "zebra": 9}  # 36 samples, skewed 1:8:3
    files = {f"{c}/{i:02d}.jpg": f"{c}{i}".encode() for c, n in counts.items() for i in range(n)}
    src = make_files(root / "src", files)
    pack(src, root / "split", split_by="cls", samples_per_shard=4, progress=False)
    return str(root / "split")


def test_by_label_balances_every_batch(split_pack):
    ds = MixedDataset.by_label(split_pack, decode=None)
    assert (
        ds.labels == ["ant", "cat", "zebra"] and len(ds) == 36 and ds.quota.tolist() == [12, 12, 12]
    )
    seen = Counter()
    for batch in ds.loader(6, 2):
        per_batch = Counter(int(bytes(c)) for c in batch["cls"])
        # every batch stratified
        assert all(v == 2 for v in per_batch.values()) and len(per_batch) == 3
        seen.update(batch["__key__"])
    ants = {k: n for k, n in seen.items() if k.startswith("ant/")}
    assert sorted(ants.values()) == [4, 4, 4]  # 3 ant images, 12 draws: each exactly 4 times
    cats = [k for k in seen if k.startswith("cat/")]
    # 12 of 24 cats, none twice: the rest next epoch
    assert len(cats) == 12 and max(seen[k] for k in cats) == 1


def test_by_label_weights(split_pack):
    assert MixedDataset.by_label(split_pack, None).quota.tolist() == [3, 24, 9]  # as the dataset is
    assert MixedDataset.by_label(split_pack, {"ant": 0, "cat": 1, "zebra": 1}).quota.tolist() == [
        0,
        18,
        18,
    ]
    assert MixedDataset.by_label(split_pack, "sqrt", samples_per_epoch=100).quota.sum() == 100
    with pytest.raises(ValueError, match="lack label 'zebra'"):
        MixedDataset.by_label(split_pack, {"ant": 1, "cat": 1})
    with pytest.raises(ValueError, match="name label 'dog'"):
        MixedDataset.by_label(split_pack, {"ant": 1, "cat": 1, "zebra": 1, "dog": 1})
    with pytest.raises(ValueError, match="weights must be"):
        MixedDataset.by_label(split_pack, "even")


def test_by_label_takes_a_mapping(urls):
    ds = MixedDataset.by_label({"x": urls["a"], "y": ShardDataset(urls["b"])}, samples_per_epoch=10)
    assert ds.labels == ["x", "y"] and ds.quota.tolist() == [5, 5]


def test_a_device_loader_over_a_mix_keeps_the_sources_and_the_resume_state(urls):
    from shardstream.device import DeviceLoader

    ds = make(urls, decode="torch", samples_per_epoch=12)
    loader = ds.loader(4, 1)
    device = DeviceLoader(loader, "cpu")
    batches = list(device)
    assert len(batches) == 3 and all(b["__source__"].dtype == torch.int64 for b in batches)
    assert [k for b in batches for k in b["__key__"]] == planned(
        urls, decode="torch", samples_per_epoch=12
    )
    assert device.state_dict()["epoch"] == 1  # a whole epoch read: the next one starts
