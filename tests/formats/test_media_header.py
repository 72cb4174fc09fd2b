"""Media facts from container headers (shardstream.formats.media_header): every container the pack
reads, audio and video, and bad bytes giving None rather than an FFmpeg error."""

from __future__ import annotations

import pytest

from shardstream.formats.media_header import MediaHeader, media_header, media_kind
from tests.media import audio, video

VIDEOS = {  # extension -> (PyAV format, codec)
    "mp4": ("mp4", "mpeg4"),
    "webm": ("webm", "libvpx"),
    "mkv": ("matroska", "mpeg4"),
    "mov": ("mov", "mpeg4"),
    "avi": ("avi", "mpeg4"),
}
AUDIO = {  # extension -> (PyAV format, codec, codec name read back)
    "wav": ("wav", "pcm_s16le", "pcm_s16le"),
    "flac": ("flac", "flac", "flac"),
    "mp3": ("mp3", "libmp3lame", "mp3"),
    "ogg": ("ogg", "libopus", "opus"),
    "m4a": ("ipod", "aac", "aac"),
}


@pytest.mark.parametrize("ext", sorted(VIDEOS))
def test_video_facts_come_from_the_headers(ext):
    fmt, codec = VIDEOS[ext]
    found = media_header(video(seconds=2.0, fps=10, size=(24, 32), fmt=fmt, codec=codec), ext)
    assert found is not None and found.kind == "video"
    assert found.duration == pytest.approx(2.0, abs=0.15)
    assert (found.fps, found.frames, found.width, found.height) == (10.0, 20, 32, 24)
    assert found.codec == {"libvpx": "vp8"}.get(codec, codec)


@pytest.mark.parametrize("ext", sorted(AUDIO))
@pytest.mark.parametrize("channels", [1, 2])
def test_audio_facts_come_from_the_headers(ext, channels):
    fmt, codec, name = AUDIO[ext]
    rate = 48000 if codec == "libopus" else 16000  # Opus encodes at 48 kHz only
    found = media_header(audio(1.0, rate, channels, fmt, codec), ext)
    assert found is not None and found.kind == "audio"
    assert found.duration == pytest.approx(1.0, abs=0.1)
    assert (found.sample_rate, found.channels) == (rate, channels)
    assert found.codec.startswith(name)  # mp3 reads back as mp3float
    assert (found.frames, found.width, found.height) == (0, 0, 0)


def test_bad_bytes_give_none_never_an_error():
    clip = video()
    assert media_header(b"", "mp4") is None
    assert media_header(b"\x00" * 1000, "mp4") is None
    assert media_header(clip[: len(clip) // 3], "mp4") is None  # cut short: no moov atom
    assert media_header(audio(), "mp4") is None  # a recording named .mp4: no video stream
    assert media_header(clip, "wav") is None  # a video named .wav: no audio stream
    assert media_header(clip, "jpg") is None  # not a media extension at all


def test_media_kind_by_extension():
    assert [media_kind(e) for e in ("mp4", "webm", "mkv", "mov", "avi")] == ["video"] * 5
    assert [media_kind(e) for e in ("wav", "flac", "mp3", "ogg", "m4a")] == ["audio"] * 5
    assert media_kind("json") is None
    assert MediaHeader("audio").duration == 0.0  # unknown is 0
