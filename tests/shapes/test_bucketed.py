"""Bucketed: each batch from one bucket (by a field, a length, or an image's aspect ratio read from its
header), every sample once, the same batches for any worker count, equal batch counts, resume."""

from __future__ import annotations

import io
import json
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream import ShardDataset
from shardstream.dataset import MixedDataset
from shardstream.dataset.batches.bucketed import Bucketed, aspect_ratio, image_size, length_of
from shardstream.plan.bins import bucket_batches, bucket_of
from tests.sample_datasets import key_of, write_dataset

N = 37
SIZES = [(32, 16), (16, 16), (16, 32), (24, 16), (16, 24)]  # aspect 2, 1, 0.5, 1.5, 0.67


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


def make(i: int) -> dict:
    w, h = SIZES[i * 3 % len(SIZES)]
    return {"__key__": key_of(i), "png": png(w, h), "cls": i % 3, "ids.npy": np.arange(1 + i % 13)}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("bucketed"), [10, 8, 11, 8], make=make)


def aspect_of(i: int) -> float:
    w, h = SIZES[i * 3 % len(SIZES)]
    return w / h


def bucketed(url, key=None, boundaries=(0.8, 1.2), batch=4, **kw) -> Bucketed:
    ds = ShardDataset(
        url,
        decode=kw.pop("decode", None),
        seed=2,
        rank=kw.pop("rank", None),
        world_size=kw.pop("world_size", None),
    )
    return Bucketed(
        ds,
        key or aspect_ratio("png"),
        boundaries,
        batch,
        window=kw.pop("window", 12),
        num_workers=kw.pop("workers", 0),
    )


def test_image_size_reads_the_header_of_bytes_and_the_shape_of_decoded_images():
    data = png(40, 10)
    assert image_size(data) == (40, 10)
    assert image_size(torch.zeros(3, 10, 40)) == (40, 10)
    assert image_size(np.zeros((10, 40, 3))) == (40, 10)
    assert image_size(Image.open(io.BytesIO(data))) == (40, 10)
    assert bucket_of(np.array([0.5, 0.8, 1.0, 1.2, 3]), [0.8, 1.2]).tolist() == [0, 1, 1, 2, 2]
    got = bucket_batches(np.array([2, 0, 2, 2, 0, 2]), 2)
    assert [g.tolist() for g in got] == [[1, 4], [0, 2], [3, 5]]


def batches(b: Bucketed) -> list[list[str]]:
    out = []
    for batch in b:
        keys = list(batch["__key__"])
        buckets = {int(bucket_of(np.array([aspect_of(int(k[1:]))]), [0.8, 1.2])[0]) for k in keys}
        assert buckets == {batch["__bucket__"]} and 1 <= len(keys) <= 4
        out.append(keys)
    return out


@pytest.mark.parametrize("decode", [None, "torch"])
def test_every_batch_holds_one_aspect_bucket_and_every_sample_once(url, decode):
    got = batches(bucketed(url, decode=decode))
    assert sorted(k for b in got for k in b) == [key_of(i) for i in range(N)]


def test_classes_and_lengths_as_keys(url):
    for batch in bucketed(url, key="cls", boundaries=None, decode="torch"):
        assert len(set(batch["cls"].tolist())) == 1 and batch["__bucket__"] == batch["cls"][0]
    for batch in bucketed(url, key=length_of("ids.npy"), boundaries=[5, 10], decode="torch"):
        lengths = [len(v) for v in batch["ids.npy"]]
        assert len({int(bucket_of(np.array([n]), [5, 10])[0]) for n in lengths}) == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_the_batches_are_the_same_for_any_number_of_workers(url, workers):
    assert batches(bucketed(url, workers=workers)) == batches(bucketed(url))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_read_every_sample(url, world):
    per_rank = [batches(bucketed(url, rank=r, world_size=world)) for r in range(world)]
    counted = Counter(k for g in per_rank for b in g for k in b)
    assert set(counted) == {key_of(i) for i in range(N)}
    assert all(sum(map(len, g)) == -(-N // world) for g in per_rank)


def test_a_larger_agreed_count_halves_batches_within_their_bucket(url):
    b = bucketed(url, window=N)
    window = next(iter(b.loader))
    groups = b.plan(window)
    more = b.fit(groups, len(groups) + 4)
    assert len(more) == len(groups) + 4
    assert sorted(i for g in more for i in g.tolist()) == list(range(N))
    for g in more:
        assert len({int(b.last_buckets[i]) for i in g.tolist()}) == 1


def test_resume_mid_window_on_the_same_world_size(url):
    full = batches(bucketed(url))
    first = bucketed(url)
    taken = []
    for n, batch in enumerate(first, 1):
        taken.append(list(batch["__key__"]))
        if n == 4:
            break
    state = json.loads(json.dumps(first.state_dict()))
    second = bucketed(url, workers=1)
    second.load_state_dict(state)
    assert taken + batches(second) == full


def test_buckets_under_a_mix(url, tmp_path):
    other = write_dataset(tmp_path, [5], make=lambda i: make(i + 100), name="o")
    mix = MixedDataset(
        [ShardDataset(url, decode=None), ShardDataset(other, decode=None)],
        [0.7, 0.3],
        samples_per_epoch=30,
    )
    got = Counter()
    for batch in Bucketed(mix, aspect_ratio("png"), [0.8, 1.2], 4, window=10, num_workers=0):
        got.update(batch["__source__"].tolist())
    assert got == {0: 21, 1: 9}


def test_bad_boundaries_are_refused(url):
    with pytest.raises(ValueError, match="must increase"):
        bucketed(url, boundaries=[1.2, 0.8])


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "WEBP"])
@pytest.mark.parametrize("size", [(37, 11), (1, 300), (640, 480)])
def test_header_sizes_match_pillow(fmt, size):
    from shardstream.formats.image_header import image_size as header_size

    out = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(out, format=fmt)
    data = out.getvalue()
    assert header_size(data) == size == Image.open(io.BytesIO(data)).size
    assert header_size(memoryview(data)) == size


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xd8",
        b"\xff\xd8\xff\xe0\x00\x01",
        b"\xff\xd8\xff\xda\x00\x08",
        b"\x89PNG\r\n\x1a\n",
    ],
)
def test_truncated_or_odd_headers_give_none(data):
    from shardstream.formats.image_header import image_size as header_size

    assert header_size(data) is None
    assert (
        header_size(b"\xff\xd8" + b"\xff\xe1\xff\xff" + b"\x00" * 10) is None
    )  # a length past the end


def test_raw_windows_cross_from_workers(url):
    # raw values are memoryviews into the shard: a worker sends a window's as bytes (a memoryview
    # cannot be pickled, and the DataLoader would wait for that window forever); timeout: fail, not hang
    from shardstream.dataset.batches.collate import collate

    ds = ShardDataset(url, decode=None)
    b = Bucketed(ds, "cls", None, 4, window=10, collate_fn=collate, num_workers=1, timeout=120)
    assert not b.in_place
    got = [k for batch in b for k in batch["__key__"]]
    assert sorted(got) == [key_of(i) for i in range(N)]


def test_raw_local_batches_stay_in_place_and_hold_the_same_bytes(url):
    from shardstream.dataset.batches.collate import collate
    from shardstream.dataset.shards.mapped import MappedBytes

    in_place = bucketed(url, workers=1)
    copied = Bucketed(
        ShardDataset(url, decode=None, seed=2),
        aspect_ratio("png"),
        (0.8, 1.2),
        4,
        window=12,
        collate_fn=collate,
        num_workers=1,
    )
    assert in_place.in_place and not copied.in_place
    a, b = list(in_place), list(copied)
    assert all(isinstance(x["png"], MappedBytes) for x in a)
    assert [x["__key__"] for x in a] == [x["__key__"] for x in b]
    assert [[bytes(v) for v in x["png"]] for x in a] == [[bytes(v) for v in x["png"]] for x in b]
