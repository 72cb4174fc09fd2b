"""Bucketed planned for the whole epoch from image sizes recorded at pack time: each batch one bucket,
every sample once, equal batches per rank, the same batches for any worker count, exact resume on
another world size, and the fallback (and the errors) where the sizes cannot be used."""

from __future__ import annotations

import io
import json
from collections import Counter

import numpy as np
import pytest
from PIL import Image

import shardstream as ss
from shardstream.errors import ManifestError
from shardstream.plan.buckets import epoch_batches, rank_batches

N = 41
SIZES = [(32, 16), (16, 16), (16, 32), (24, 16), (16, 24)]  # aspect 2, 1, 0.5, 1.5, 0.67
BOUNDARIES = [0.8, 1.25]


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format="JPEG")
    return out.getvalue()


def bucket_of_key(key: str) -> int:
    w, h = SIZES[int(key[1:]) % len(SIZES)]
    return int(np.searchsorted(BOUNDARIES, w / h, side="right"))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("planned") / "pics")
    with ss.ShardWriter(path, samples_per_shard=9) as writer:
        for i in range(N):
            writer.write({"__key__": f"k{i:03d}", "jpg": jpeg(*SIZES[i % len(SIZES)]), "cls": i})
    return path


def bucketed(url: str, rank: int = 0, world: int = 1, workers: int = 0, **kw) -> ss.Bucketed:
    ds = ss.ShardDataset(url, decode=None, seed=3, rank=rank, world_size=world, **kw)
    return ss.Bucketed(
        ds, ss.aspect_ratio("jpg"), BOUNDARIES, batch_size=4, num_workers=workers, window=8
    )


def keys(batch) -> list[str]:
    return list(batch["__key__"])


def test_the_plan_is_exact_equal_per_rank_and_the_same_for_any_world_size():
    buckets = np.arange(103) % 4
    batches = epoch_batches(buckets, 8, seed=1, epoch=2)
    again = epoch_batches(buckets, 8, seed=1, epoch=2)
    assert [b.tolist() for b in batches] == [b.tolist() for b in again]  # deterministic
    assert all(len(set(buckets[b])) == 1 and len(b) <= 8 for b in batches)
    for world in (1, 2, 3, 5, 7):
        parts = [rank_batches(batches, world, r) for r in range(world)]
        assert len({len(p) for p in parts}) == 1  # equal batches per rank
        read = np.concatenate([b for p in parts for b in p])
        assert sorted(read.tolist()) == list(range(103))  # every sample once
        assert all(len(set(buckets[b])) == 1 for p in parts for b in p)


@pytest.mark.parametrize(("first", "then", "done"), [(3, 2, 2), (2, 5, 1), (4, 1, 3), (2, 3, 0)])
def test_the_plan_resumes_exactly_on_another_world_size(first, then, done):
    buckets = np.arange(150) % 3
    batches = epoch_batches(buckets, 5, seed=0, epoch=0)
    read = [b for r in range(first) for b in rank_batches(batches, first, r)[:done]]
    consumed = [(done, first)]
    rest = [rank_batches(batches, then, r, consumed) for r in range(then)]
    assert len({len(p) for p in rest}) == 1
    read += [b for p in rest for b in p]
    assert sorted(np.concatenate(read).tolist()) == list(range(150))


def test_bucketed_plans_from_recorded_sizes_without_reading_a_window(url):
    shape = bucketed(url)
    assert shape.planned_up_front
    seen = []
    for batch in shape:
        assert len({bucket_of_key(k) for k in keys(batch)}) == 1
        assert batch["__bucket__"] == bucket_of_key(keys(batch)[0])
        seen += keys(batch)
    assert sorted(seen) == [f"k{i:03d}" for i in range(N)]


def test_the_same_batches_for_any_worker_count_and_equal_counts_per_rank(url):
    one = [keys(b) for b in bucketed(url, workers=0)]
    assert one == [keys(b) for b in bucketed(url, workers=2)]
    parts = [[keys(b) for b in bucketed(url, r, 3)] for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    assert Counter(k for p in parts for b in p for k in b) == Counter(f"k{i:03d}" for i in range(N))


def test_resume_on_another_world_size_reads_each_sample_once(url):
    read: list[str] = []
    states = []
    for r in range(3):
        shape = bucketed(url, r, 3)
        it = iter(shape)
        for _ in range(2):
            read += keys(next(it))
        states.append(shape.state_dict())
    assert states[0] == states[1] == states[2]
    json.dumps(states[0])  # a few integers, saved as JSON
    parts = []
    for r in range(2):
        shape = bucketed(url, r, 2)
        shape.load_state_dict(states[0])
        parts.append([keys(b) for b in shape])
    assert len(parts[0]) == len(parts[1])
    read += [k for p in parts for b in p for k in b]
    assert Counter(read) == Counter(f"k{i:03d}" for i in range(N))


def test_the_next_epoch_is_another_plan(url):
    shape = bucketed(url)
    first = [keys(b) for b in shape]
    second = [keys(b) for b in shape]
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))
    shape.set_epoch(0)
    assert [keys(b) for b in shape] == first


def test_without_recorded_sizes_buckets_come_from_the_windows(tmp_path):
    with ss.ShardWriter(str(tmp_path / "old"), image_sizes=False) as writer:
        for i in range(12):
            writer.write({"__key__": f"k{i:03d}", "jpg": jpeg(*SIZES[i % len(SIZES)])})
    shape = bucketed(str(tmp_path / "old"))
    assert not shape.planned_up_front
    seen = [k for b in shape for k in keys(b)]
    assert sorted(seen) == [f"k{i:03d}" for i in range(12)]
    ds = ss.ShardDataset(str(tmp_path / "old"), decode=None)
    by_area = ss.Bucketed(ds, ss.image_area("jpg"), [300, 450], 4, num_workers=0)
    assert not by_area.planned_up_front  # read from each header, in place
    for batch in by_area:
        areas = [np.prod(SIZES[int(k[1:]) % len(SIZES)]) for k in keys(batch)]
        assert len({int(np.searchsorted([300, 450], a, side="right")) for a in areas}) == 1
    with pytest.raises(ss.UsageError, match="saved by a Bucketed planned from recorded sizes"):
        bucketed(str(tmp_path / "old")).load_state_dict({"planned": {"epoch": 0, "consumed": []}})


def test_a_damaged_size_file_is_an_error_naming_it(tmp_path, url):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(url, copy)
    ref = json.loads((copy / "_manifest.json").read_text())["image_sizes"]
    data = bytearray((copy / ref["file"]).read_bytes())
    data[-1] ^= 1
    (copy / ref["file"]).write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=f"{ref['file']} does not match its sha256"):
        bucketed(str(copy))


def test_a_planned_epoch_decodes_as_the_dataset_does(url):
    ds = ss.ShardDataset(url, decode="torch", seed=3)
    shape = ss.Bucketed(ds, ss.aspect_ratio("jpg"), BOUNDARIES, batch_size=4, num_workers=1)
    assert shape.planned_up_front
    seen = []
    for batch in shape:
        buckets = {
            int(np.searchsorted(BOUNDARIES, x.shape[-1] / x.shape[-2], side="right"))
            for x in batch["jpg"]
        }
        assert buckets == {batch["__bucket__"]}  # decoded images (C x H x W) of one bucket
        seen += keys(batch)
    assert sorted(seen) == [f"k{i:03d}" for i in range(N)]


def test_an_image_area_key_is_planned_from_the_recorded_sizes_too(url):
    ds = ss.ShardDataset(url, decode=None, seed=3)
    shape = ss.Bucketed(ds, ss.image_area("jpg"), [300, 450], batch_size=4, num_workers=0)
    assert shape.planned_up_front
    seen = []
    for batch in shape:
        areas = [np.prod(SIZES[int(k[1:]) % len(SIZES)]) for k in keys(batch)]
        assert len({int(np.searchsorted([300, 450], a, side="right")) for a in areas}) == 1
        seen += keys(batch)
    assert sorted(seen) == [f"k{i:03d}" for i in range(N)]
