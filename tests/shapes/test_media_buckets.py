"""Batch shapes for media: ``Bucketed`` by ``ss.duration`` planned from the media facts recorded at pack
time (each batch one bucket, every sample once, exact resume, no decoding to plan, the errors where the
facts are missing), and ``AudioCollate`` padding or cropping decoded recordings to the batch's length."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import shardstream as ss
from shardstream.errors import UsageError
from tests.media import audio, av, video

N = 29
SECONDS = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
BOUNDARIES = [0.6, 1.2]  # buckets: [.25, .5], [.75, 1.0], [1.25, 1.5, 2.0]
RATE = 8000


def seconds_of(key: str) -> float:
    return SECONDS[int(key[1:]) % len(SECONDS)]


def bucket_of(seconds: float) -> int:
    return int(np.searchsorted(BOUNDARIES, seconds, side="right"))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("media") / "speech")
    with ss.ShardWriter(path, samples_per_shard=6) as writer:
        for i in range(N):
            writer.write(
                {"__key__": f"k{i:03d}", "wav": audio(seconds_of(f"k{i}"), RATE), "cls": i}
            )
    return path


def bucketed(url: str, rank: int = 0, world: int = 1, workers: int = 0, **kw) -> ss.Bucketed:
    collate_fn = kw.pop("collate_fn", None)
    ds = ss.ShardDataset(url, seed=4, rank=rank, world_size=world, **kw)
    return ss.Bucketed(
        ds,
        ss.duration("wav"),
        BOUNDARIES,
        batch_size=3,
        num_workers=workers,
        collate_fn=collate_fn,
    )


def keys(batches) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


def test_duration_buckets_are_planned_from_the_recorded_facts(url):
    batches = bucketed(url, decode=None)
    assert batches.planned_up_front
    read = keys(batches)
    assert Counter(k for b in read for k in b) == Counter(f"k{i:03d}" for i in range(N))
    for batch in read:  # each batch's durations fall in one bucket
        assert len({bucket_of(seconds_of(k)) for k in batch}) == 1
        assert 1 <= len(batch) <= 3
    assert read == keys(bucketed(url, decode=None))  # deterministic
    assert read == keys(bucketed(url, decode=None, workers=2))  # for any worker count


def test_planning_decodes_nothing(url, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a container was opened to plan")

    monkeypatch.setattr(av, "open", refuse)
    batches = bucketed(url, decode=None)
    assert batches.planned_up_front and len(batches.planned) >= N // 3  # the epoch's batches


@pytest.mark.parametrize("stop", [1, 4])
def test_exact_resume_mid_epoch_gives_the_same_batches(url, stop):
    whole = keys(bucketed(url, decode=None))
    first = bucketed(url, decode=None)
    it = iter(first)
    head = keys(next(it) for _ in range(stop))
    state = first.state_dict()
    again = bucketed(url, decode=None)
    again.load_state_dict(state)
    assert head + keys(again) == whole


def test_resume_on_another_world_size_reads_each_sample_once(url):
    read, states = [], []
    for rank in range(3):  # 3 ranks read one batch each, then stop
        batches = bucketed(url, rank=rank, world=3, decode=None)
        read += list(next(iter(batches))["__key__"])
        states.append(batches.state_dict())
    for rank in range(2):  # and go on as 2 ranks
        batches = bucketed(url, rank=rank, world=2, decode=None)
        batches.load_state_dict(states[0])
        for batch in keys(batches):
            assert len({bucket_of(seconds_of(k)) for k in batch}) == 1
            read += batch
    assert Counter(read) == Counter(f"k{i:03d}" for i in range(N))


def test_a_split_part_plans_from_its_own_samples_durations(url, tmp_path):
    ss.split(url, tmp_path / "parts", {"train": 0.6, "val": 0.4}, seed=1)
    read = {}
    for name in ("train", "val"):
        batches = bucketed(str(tmp_path / "parts" / name), decode=None)
        assert batches.planned_up_front
        read[name] = [k for b in keys(batches) for k in b]
        part = [s["__key__"] for s in ss.ShardDataset(str(tmp_path / "parts" / name), decode=None)]
        assert sorted(read[name]) == sorted(part)
        for batch in keys(bucketed(str(tmp_path / "parts" / name), decode=None)):
            assert len({bucket_of(seconds_of(k)) for k in batch}) == 1
    assert sorted(read["train"] + read["val"]) == [f"k{i:03d}" for i in range(N)]


def test_decoded_audio_padded_to_the_longest_of_each_bucket(url):
    pad = ss.AudioCollate("wav")
    batches = bucketed(url, decode={"wav": ss.AudioClip(start="start")}, collate_fn=pad, workers=1)
    seen = 0
    for batch in batches:
        lengths = [round(seconds_of(k) * RATE) for k in batch["__key__"]]
        assert batch["wav"].shape == (len(lengths), 1, max(lengths))
        assert batch["wav_lengths"].tolist() == lengths
        assert batch["wav_mask"].sum(dim=1).tolist() == lengths
        assert batch["cls"].tolist() == [int(k[1:]) for k in batch["__key__"]]
        seen += len(lengths)
    assert seen == N


def clip(n: int, channels: int = 1, offset: float = 0.0) -> torch.Tensor:
    return torch.linspace(-0.9, 0.9, n).repeat(channels, 1) + offset


def samples() -> list[dict]:
    return [
        {"__key__": "a", "wav": clip(5, 2), "cls": 0},
        {"__key__": "b", "wav": clip(8, 2, 0.05), "cls": 1},
        {"__key__": "c", "wav": clip(3, 2, -0.05), "cls": 2},
    ]


def test_audio_collate_pads_to_the_longest_with_lengths_and_a_mask():
    given = samples()
    batch = ss.AudioCollate("wav", padding_value=-7.0)(given)
    assert batch["wav"].shape == (3, 2, 8) and batch["wav"].dtype == torch.float32
    assert batch["wav_lengths"].tolist() == [5, 8, 3]
    assert batch["wav_mask"].tolist() == [[i < n for i in range(8)] for n in (5, 8, 3)]
    for row, sample, n in zip(batch["wav"], given, (5, 8, 3)):
        assert torch.equal(row[:, :n], sample["wav"])  # unaltered within its length
        assert (row[:, n:] == -7.0).all()  # the padding value after it
    assert batch["cls"].tolist() == [0, 1, 2] and batch["__key__"] == ["a", "b", "c"]


def test_audio_collate_crops_to_the_shortest():
    given = samples()
    batch = ss.AudioCollate(["wav"], mode="crop")(given)
    assert batch["wav"].shape == (3, 2, 3)
    assert batch["wav_lengths"].tolist() == [3, 3, 3] and batch["wav_mask"].all()
    for row, sample in zip(batch["wav"], given):
        assert torch.equal(row, sample["wav"][:, :3])


def test_audio_collate_refuses_what_it_cannot_batch():
    with pytest.raises(UsageError, match='"pad" or "crop"'):
        ss.AudioCollate("wav", mode="stretch")
    mixed = samples()
    mixed[1]["wav"] = clip(8, 1)
    with pytest.raises(UsageError, match=r"'wav' holds \[1, 2\] channels.*mono=True"):
        ss.AudioCollate("wav")(mixed)
    raw = samples()
    raw[2]["wav"] = b"RIFF"
    with pytest.raises(UsageError, match=r"'wav' of sample 'c' holds a bytes.*AudioClip"):
        ss.AudioCollate("wav")(raw)


def test_a_dataset_without_media_facts_is_an_error_naming_the_field_and_the_fix(tmp_path):
    path = str(tmp_path / "bare")
    with ss.ShardWriter(path, samples_per_shard=4, image_sizes=False) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "wav": audio(0.25, RATE)})
    with pytest.raises(UsageError, match=r"duration\('wav'\).*no media facts for 'wav'.*re-pack"):
        ss.Bucketed(ss.ShardDataset(path, decode=None), ss.duration("wav"), BOUNDARIES)


def test_an_unrecorded_field_or_a_transform_is_an_error(url):
    with pytest.raises(UsageError, match=r"no media facts for 'flac' \(it records wav\)"):
        ss.Bucketed(ss.ShardDataset(url, decode=None), ss.duration("flac"), BOUNDARIES)
    ds = ss.ShardDataset(url, decode=None, transform=lambda s: s)
    with pytest.raises(UsageError, match="without the dataset's transform"):
        ss.Bucketed(ds, ss.duration("wav"), BOUNDARIES)


def test_a_sample_without_a_recorded_duration_is_an_error_naming_its_shard(tmp_path):
    path = str(tmp_path / "gap")
    with ss.ShardWriter(path, samples_per_shard=2) as writer:
        for i in range(3):
            sample = {"__key__": f"k{i}", "cls": i}
            if i != 2:
                sample["wav"] = audio(0.25, RATE)
            writer.write(sample)
    with pytest.raises(UsageError, match=r"1 samples .* \(the first: sample 0 of shard .*\.tar\)"):
        ss.Bucketed(ss.ShardDataset(path, decode=None), ss.duration("wav"), BOUNDARIES)


def test_video_durations_plan_buckets_too(tmp_path):
    path = str(tmp_path / "clips")
    lengths = [0.5, 1.0, 2.0, 0.5, 2.0]
    with ss.ShardWriter(path, samples_per_shard=2) as writer:
        for i, s in enumerate(lengths):
            writer.write({"__key__": f"v{i}", "mp4": video(seconds=s, fps=10)})
    ds = ss.ShardDataset(path, decode=None, shuffle=False)
    batches = ss.Bucketed(ds, ss.duration("mp4"), [0.75, 1.5], batch_size=4, num_workers=0)
    assert batches.planned_up_front
    grouped = sorted(sorted(b["__key__"]) for b in batches)
    assert grouped == [["v0", "v3"], ["v1"], ["v2", "v4"]]
    assert ss.duration("mp4")({"mp4": video(seconds=1.0, fps=10)}) == pytest.approx(1.0, abs=0.1)
    with pytest.raises(UsageError, match=r"reads encoded media, not a Tensor"):
        ss.duration("wav")({"wav": torch.zeros(1, 8)})
    with pytest.raises(ValueError, match=r"sample 'x': the headers of its 'mp4' do not give"):
        ss.duration("mp4")({"__key__": "x", "mp4": b"not a video"})
