"""VideoClip and AudioClip (shardstream.dataset.samples.media): where a clip starts, its frames and
samples, the keyframe seek, random starts from (seed, epoch, key) whatever the workers, and bad media
as one line naming the sample, or skipped."""

from __future__ import annotations

import logging
import os

import pytest
import torch

import shardstream as ss
from shardstream.dataset.samples import media
from shardstream.dataset.samples.media import AudioClip, VideoClip, clip_fraction
from shardstream.errors import ShardstreamError, UsageError
from tests.media import audio, frame_levels, video

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def near(levels, expected, within=6):
    """Gray levels equal to within the codec's loss."""
    return len(levels) == len(expected) and all(
        abs(a - b) <= within for a, b in zip(levels, expected)
    )


@pytest.fixture(scope="module")
def clip():
    return video(seconds=2.0, fps=10, size=(24, 32), gop=5)  # frame i is gray 10 * i


def test_video_clip_is_uint8_frames_3_h_w_in_time_order(clip):
    out = VideoClip(frames=4, start="start")(clip)
    assert out.dtype == torch.uint8 and out.shape == (4, 3, 24, 32)
    assert near(frame_levels(out), [0, 10, 20, 30])


@pytest.mark.parametrize(
    ("start", "levels"),
    [
        ("center", [80, 90, 100, 110]),  # 2 s, a 0.4 s clip: from 0.8 s
        # mid-GOP: the seek lands on the keyframe before, then decodes on
        (1.3, [130, 140, 150, 160]),
        (0.95, [90, 100, 110, 120]),  # between frames: the frame shown at each time
        (1.9, [190, 190, 190, 190]),  # past the end: the last frame again
    ],
)
def test_video_clip_starts(clip, start, levels):
    assert near(frame_levels(VideoClip(frames=4, start=start)(clip)), levels)


def test_video_clip_fps_and_size(clip):
    assert near(frame_levels(VideoClip(frames=4, fps=5, start=0.0)(clip)), [0, 20, 40, 60])
    assert VideoClip(frames=2, size=(12, 16))(clip).shape == (2, 3, 12, 16)
    assert VideoClip(frames=2, size=8)(clip).shape == (2, 3, 8, 8)


@pytest.mark.parametrize(
    ("fmt", "codec"), [("webm", "libvpx"), ("matroska", "mpeg4"), ("mov", "h264"), ("avi", "mpeg4")]
)
def test_video_clip_of_other_containers(fmt, codec):
    data = video(seconds=2.0, fmt=fmt, codec=codec)
    assert near(frame_levels(VideoClip(frames=3, start=1.0)(data)), [100, 110, 120], within=10)


def test_decoding_seeks_to_a_keyframe_rather_than_from_the_start(clip, monkeypatch):
    seeks = []
    real = media._seek

    def spy(container, stream, seconds):
        seeks.append(seconds)
        real(container, stream, seconds)

    monkeypatch.setattr(media, "_seek", spy)
    decoded = []
    real_decoded = media._decoded

    def counting(container, stream):
        for frame in real_decoded(container, stream):
            decoded.append(frame.time)
            yield frame

    monkeypatch.setattr(media, "_decoded", counting)
    VideoClip(frames=2, start=1.6)(clip)
    assert seeks == [1.6]
    assert min(decoded) >= 1.0  # from the keyframe before 1.6 s, not from 0


def test_random_start_from_seed_epoch_and_key(clip):
    fractions = {clip_fraction(s, e, k) for s in (0, 1) for e in (0, 1) for k in ("a", "b")}
    assert len(fractions) == 8 and all(0 <= f < 1 for f in fractions)
    assert clip_fraction(3, 2, "k") == clip_fraction(3, 2, "k")
    one = VideoClip(frames=2)
    assert torch.equal(one(clip, seed=1, epoch=2, key="x"), one(clip, seed=1, epoch=2, key="x"))
    starts = {frame_levels(one(clip, seed=1, epoch=e, key="x"))[0] for e in range(8)}
    assert len(starts) > 1


def test_audio_clip_is_float32_channels_samples():
    # a ramp from -0.5; the second channel half of it
    data = audio(seconds=1.0, rate=8000, channels=2)
    stereo = AudioClip(seconds=0.25, start=0.5, mono=False)(data)
    assert stereo.dtype == torch.float32 and stereo.shape == (2, 2000)
    assert stereo[0, 0].item() == pytest.approx(0.0, abs=1e-3)
    assert stereo[0, -1].item() == pytest.approx(0.25, abs=1e-3)
    assert stereo[1, -1].item() == pytest.approx(0.125, abs=1e-3)
    mono = AudioClip(seconds=0.25, start=0.25)(data)
    assert mono.shape == (1, 2000)
    assert mono[0, 0].item() == pytest.approx(0.75 * -0.25, abs=1e-3)
    whole = AudioClip()(data)  # the whole recording, from its start
    assert whole.shape == (1, 8000) and whole[0, 0].item() == pytest.approx(-0.375, abs=1e-3)
    assert float(whole.abs().max()) <= 1.0


def test_audio_clip_resamples_and_pads():
    data = audio(seconds=1.0, rate=8000, fmt="flac", codec="flac")
    assert AudioClip(sample_rate=16000, seconds=0.5, start="center")(data).shape == (1, 8000)
    padded = AudioClip(seconds=2.0, start="start")(data)
    assert padded.shape == (1, 16000) and float(padded[0, 8000:].abs().max()) == 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: VideoClip(frames=0),
        lambda: VideoClip(fps=-1),
        lambda: VideoClip(start="end"),
        lambda: VideoClip(start=-1.0),
        lambda: VideoClip(size=(3,)),
        lambda: AudioClip(sample_rate=0),
        lambda: AudioClip(seconds=0),
        lambda: AudioClip(start=True),
    ],
)
def test_bad_settings_are_usage_errors(make):
    with pytest.raises(UsageError):
        make()


def bad_media() -> dict[str, bytes]:
    good = video(seconds=1.0)
    return {
        "truncated": good[: len(good) // 3],
        "no-video": audio(seconds=0.5),  # a recording named .mp4
        "garbage": b"\x00\x01" * 300,
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """8 videos of 2 s and recordings, keys k0..k7, in 4 shards."""
    url = str(tmp_path_factory.mktemp("media") / "ds")
    with ss.ShardWriter(url, shard_size="8KB") as writer:
        for i in range(8):
            writer.write({"__key__": f"k{i}", "mp4": video(), "wav": audio(), "cls": i})
    return url


def read_all(url, workers, epoch=0, **kw):
    ds = ss.ShardDataset(url, decode={"mp4": VideoClip(frames=3)}, seed=5, **kw)
    ds.set_epoch(epoch)
    out = {}
    for batch in ds.loader(batch_size=2, num_workers=workers):
        for key, frames in zip(batch["__key__"], batch["mp4"]):
            out[key] = frames
    return out


def test_the_same_clips_whatever_the_workers_and_other_clips_next_epoch(dataset):
    alone, spread = read_all(dataset, 0), read_all(dataset, 2)
    assert sorted(alone) == [f"k{i}" for i in range(8)]
    assert all(torch.equal(alone[k], spread[k]) for k in alone)
    later = read_all(dataset, 0, epoch=1)
    assert any(not torch.equal(alone[k], later[k]) for k in alone)


def test_decode_torch_decodes_media_fields_with_the_defaults(dataset):
    sample = next(iter(ss.ShardDataset(dataset, shuffle=False)))
    assert sample["mp4"].shape == (16, 3, 24, 32) and sample["mp4"].dtype == torch.uint8
    assert sample["wav"].shape == (1, 8000) and sample["wav"].dtype == torch.float32
    kept = next(iter(ss.ShardDataset(dataset, shuffle=False, decode={"mp4": None, "wav": None})))
    assert isinstance(kept["mp4"], bytes)
    as_numpy = next(iter(ss.ShardDataset(dataset, shuffle=False, decode="numpy")))
    assert as_numpy["mp4"].shape == (16, 3, 24, 32)


def test_shard_map_decodes_media_too(dataset):
    m = ss.ShardMap(dataset, decode={"mp4": VideoClip(frames=2, start="center")})
    assert near(frame_levels(m[0]["mp4"]), [90, 100])


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Keys good0, then each kind of bad media, then good1: one shard."""
    url = str(tmp_path_factory.mktemp("damaged") / "ds")
    with ss.ShardWriter(url) as writer:
        writer.write({"__key__": "good0", "mp4": video(), "wav": audio()})
        for name, data in bad_media().items():
            writer.write({"__key__": name, "mp4": data, "wav": audio()})
        writer.write({"__key__": "silent", "mp4": video(), "wav": audio(seconds=0.0)})
        writer.write({"__key__": "good1", "mp4": video(), "wav": audio()})
    return url


@pytest.mark.parametrize("key", ["truncated", "no-video", "garbage", "silent"])
def test_bad_media_is_one_line_naming_the_sample(damaged, key):
    m = ss.ShardMap(damaged, decode={"mp4": VideoClip(frames=2), "wav": AudioClip(seconds=0.1)})
    with pytest.raises(ShardstreamError) as caught:
        m.get(key)
    text = str(caught.value)
    assert "\n" not in text and key in text
    assert ("'wav'" if key == "silent" else "'mp4'") in text
    assert "Traceback" not in text


def test_bad_media_is_skipped_under_on_error_skip(damaged, caplog):
    ds = ss.ShardDataset(
        damaged,
        shuffle=False,
        on_error="skip",
        decode={"mp4": VideoClip(frames=2), "wav": AudioClip(seconds=0.1)},
    )
    with caplog.at_level(logging.WARNING):
        keys = [s["__key__"] for s in ds]
    assert keys == ["good0"] * 5 + ["good1"]  # each bad one stands in as the last good sample
    assert ds.skipped == 4


def test_without_pyav_decoding_media_says_how_to_install_it(dataset, monkeypatch):
    def missing():
        raise ImportError("decoding video and audio needs PyAV: pip install 'shardstream[media]'")

    monkeypatch.setattr(media, "import_av", missing)
    monkeypatch.setattr("shardstream.formats.media_header.import_av", missing)
    with pytest.raises(UsageError, match=r"shardstream\[media\].*decode=\{'mp4': None\}"):
        next(iter(ss.ShardDataset(dataset, shuffle=False, decode={"wav": None})))


def test_a_start_past_the_end_gives_the_last_frame(clip):
    assert near(frame_levels(VideoClip(frames=2, start=5.0)(clip)), [190, 190])


def test_the_same_clips_after_a_resume_mid_epoch(dataset):
    whole = read_all(dataset, 0, epoch=1)
    first = ss.ShardDataset(dataset, decode={"mp4": VideoClip(frames=3)}, seed=5)
    first.set_epoch(1)
    loader = first.loader(batch_size=2, num_workers=0)
    seen = next(iter(loader))["__key__"]
    state = loader.state_dict()
    again = ss.ShardDataset(dataset, decode={"mp4": VideoClip(frames=3)}, seed=5)
    second = again.loader(batch_size=2, num_workers=2)
    second.load_state_dict(state)
    rest = {k: f for batch in second for k, f in zip(batch["__key__"], batch["mp4"])}
    assert sorted([*seen, *rest]) == sorted(whole)
    assert all(torch.equal(whole[k], rest[k]) for k in rest)


def test_hugging_face_audio_values_in_arrow_rows_decode_by_their_path(tmp_path):
    url = str(tmp_path / "ds")
    with ss.ShardWriter(url, format="arrow") as writer:
        for i in range(2):
            value = {"bytes": audio(seconds=0.5), "path": f"a{i}.wav"}
            writer.write({"__key__": f"k{i}", "audio": value, "cls": i})
    assert next(iter(ss.ShardDataset(url, shuffle=False)))["audio"].shape == (1, 4000)
    clip = AudioClip(seconds=0.1, start="start")
    assert next(iter(ss.ShardDataset(url, decode={"audio": clip})))["audio"].shape == (1, 800)
    kept = next(iter(ss.ShardDataset(url, shuffle=False, decode="pil")))["audio"]
    assert isinstance(kept, dict) and kept["path"] == "a0.wav"


@pytest.mark.parametrize("kind", ["video", "audio"])
def test_damaged_media_decodes_or_raises_a_one_line_value_error(kind, clip):
    """Cuts and flipped bytes anywhere: a clip or a ValueError of one line, never FFmpeg's own error."""
    import random

    data = clip if kind == "video" else audio(seconds=0.5, fmt="flac", codec="flac")
    decoder = (
        VideoClip(frames=3, start=0.5) if kind == "video" else AudioClip(seconds=0.2, start=0.1)
    )
    rng = random.Random(42)
    for _ in range(40):
        damaged = bytearray(data)
        if rng.random() < 0.5:
            damaged = damaged[: rng.randrange(len(damaged))]
        else:
            for _ in range(8):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            decoder(bytes(damaged))
        except ValueError as exc:
            assert "\n" not in str(exc)


@pytest.mark.parametrize("start", [0.0, 1.3])
def test_decoding_with_threads_gives_the_same_frames(monkeypatch, start):
    """FFmpeg's frame and slice threads decode exactly the frames one thread does."""
    data = video(seconds=3.0, fps=10, size=(48, 64), gop=10)
    decoder = VideoClip(frames=8, start=start)
    monkeypatch.setattr(media, "decode_threads", lambda: 1)
    alone = decoder(data)
    monkeypatch.setattr(media, "decode_threads", lambda: 4)
    threaded = decoder(data)
    assert torch.equal(alone, threaded)
    assert near(frame_levels(threaded), [10 * (round(start * 10) + i) for i in range(8)])


def test_each_worker_decodes_with_its_share_of_the_cpus():
    cpus = len(os.sched_getaffinity(0))
    assert media.decode_threads() == cpus
    loader = torch.utils.data.DataLoader(Threads(), num_workers=2, batch_size=None)
    assert list(loader) == [max(1, cpus // 2)] * 2


class Threads(torch.utils.data.Dataset):
    """decode_threads() as a worker sees it."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return media.decode_threads()
