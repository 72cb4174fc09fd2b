"""Media facts recorded beside the manifest (shardstream.manifest.media_facts): written, read back,
checked as untrusted input, summarised for info."""

from __future__ import annotations

import numpy as np
import pytest

from shardstream.errors import ManifestError
from shardstream.manifest.media_facts import (
    BLOCK,
    ShardMedia,
    block_digests,
    duration_summary,
    encode_media_facts,
    facts_of_shards,
    read_media_facts,
    reference_problem,
)
from tests.media import audio, video


def shards() -> list[ShardMedia]:
    """Two shards: 2 samples (a 2 s video and a 1 s recording, then a video alone), 1 sample (a bad
    video and a 0.5 s recording)."""
    first, second = ShardMedia(), ShardMedia()
    first.record("mp4", video(seconds=2.0))
    first.record("wav", audio(seconds=1.0))
    first.record("json", b"{}")
    first.end_sample()
    first.record("mp4", video(seconds=1.0, fps=5, size=(12, 16)))
    first.end_sample()
    second.record("mp4", b"not a video")
    second.record("wav", audio(seconds=0.5, rate=16000, channels=2))
    second.end_sample()
    return [first, second]


def test_facts_round_trip_through_the_side_file():
    facts = encode_media_facts(shards())
    assert facts is not None and facts.fields == ["mp4", "wav"]
    assert facts.kinds == {"mp4": "video", "wav": "audio"}
    store = {facts.reference["file"]: facts.data}
    back = read_media_facts(facts.reference, store.__getitem__, np.array([2, 1]))
    video_facts, audio_facts = back.columns["mp4"], back.columns["wav"]
    assert video_facts["duration"] == pytest.approx([2.0, 1.0, 0.0], abs=0.15)
    assert video_facts["fps"].tolist() == [10, 5, 0]  # 0: the bad video's headers do not read
    assert video_facts["frames"].tolist() == [20, 5, 0]
    assert video_facts["width"].tolist() == [32, 16, 0]
    assert video_facts["height"].tolist() == [24, 12, 0]
    assert back.codec_names("mp4") == ["mpeg4", "mpeg4", ""]
    assert audio_facts["sample_rate"].tolist() == [8000, 0, 16000]  # 0: sample 1 has no wav
    assert audio_facts["channels"].tolist() == [1, 0, 2]
    assert reference_problem(facts.reference) is None


def test_no_media_fields_record_nothing():
    plain = ShardMedia()
    plain.record("jpg", b"\xff\xd8")
    plain.end_sample()
    assert encode_media_facts([plain]) is None


def test_the_side_file_is_checked_before_it_is_used():
    facts = encode_media_facts(shards())
    name = facts.reference["file"]
    with pytest.raises(ManifestError, match="sha256"):
        read_media_facts(facts.reference, lambda n: facts.data + b"x", np.array([2, 1]))
    with pytest.raises(ManifestError, match="2 shards of 3 samples"):
        read_media_facts(facts.reference, {name: facts.data}.__getitem__, np.array([1, 2]))
    with pytest.raises(ManifestError, match="media reference"):
        read_media_facts({**facts.reference, "extra": 1}, {name: facts.data}.__getitem__, [2, 1])


def test_duration_summary_gives_hours_and_spread():
    facts = encode_media_facts(shards())
    summary = duration_summary(facts)
    assert summary["mp4"]["kind"] == "video" and summary["mp4"]["samples"] == 2
    assert summary["mp4"]["hours"] == pytest.approx(3.0 / 3600, abs=1e-4)
    assert summary["mp4"]["seconds"]["min"] == pytest.approx(1.0, abs=0.15)
    assert summary["mp4"]["seconds"]["max"] == pytest.approx(2.0, abs=0.15)
    assert summary["wav"]["samples"] == 2


def test_facts_of_shards_picks_joins_and_renumbers_codecs():
    first = encode_media_facts(shards())  # mp4 (mpeg4) and wav (pcm_s16le)
    webm = ShardMedia()
    webm.record("webm", video(fmt="webm", codec="libvpx"))
    webm.end_sample()
    second = encode_media_facts([webm])
    joined = facts_of_shards(
        [(first, [2, 1], [1]), (None, [3], [0]), (second, [1], [0]), (first, [2, 1], [0])]
    )
    assert joined.fields == ["mp4", "wav", "webm"] and joined.codecs == [
        "mpeg4",
        "pcm_s16le",
        "vp8",
    ]
    assert joined.counts.tolist() == [1, 3, 1, 2]
    assert joined.codec_names("mp4") == ["", "", "", "", "", "mpeg4", "mpeg4"]
    assert joined.codec_names("webm") == ["", "", "", "", "vp8", "", ""]
    assert joined.codec_names("wav") == ["pcm_s16le", "", "", "", "", "pcm_s16le", ""]
    back = read_media_facts(
        joined.reference, {joined.reference["file"]: joined.data}.get, [1, 3, 1, 2]
    )
    assert back.codec_names("webm") == joined.codec_names("webm")
    assert facts_of_shards([(None, [2], [0])]) is None


def large() -> list[ShardMedia]:
    """One shard: a field of 2 blocks and a byte (its headers do not read: still digested), a small one."""
    shard = ShardMedia()
    shard.record("mp4", bytes(range(256)) * (2 * BLOCK // 256) + b"x")
    shard.end_sample()
    shard.record("mp4", video())
    shard.end_sample()
    return [shard]


def test_block_digests_of_large_fields_round_trip_and_are_carried():
    facts = encode_media_facts(large())
    expected = block_digests(bytes(range(256)) * (2 * BLOCK // 256) + b"x")
    assert len(expected) == 3 * 16
    assert facts.block_digests("mp4", 0) == expected and facts.block_digests("mp4", 1) == b""
    files = {
        facts.reference["file"]: facts.data,
        facts.reference["blocks"]["file"]: facts.blocks_data,
    }
    back = read_media_facts(facts.reference, files.__getitem__, np.array([2]))
    assert back.block_digests("mp4", 0) == expected and back.block_digests("mp4", 1) == b""
    picked = facts_of_shards([(back, [2], [0]), (encode_media_facts(shards()), [2, 1], [1])])
    assert [picked.block_digests("mp4", j) for j in range(3)] == [expected, b"", b""]
    assert reference_problem(picked.reference) is None
    assert "blocks" not in encode_media_facts(shards()).reference  # no large field: no file


def test_the_block_digests_file_is_checked_before_it_is_used():
    facts = encode_media_facts(large())
    name = facts.reference["blocks"]["file"]
    files = {facts.reference["file"]: facts.data, name: facts.blocks_data[:-16] + bytes(16)}
    with pytest.raises(ManifestError, match="sha256"):
        read_media_facts(facts.reference, files.__getitem__, np.array([2]))
    with pytest.raises(ManifestError, match="media reference"):
        read_media_facts(
            {**facts.reference, "blocks": {"file": name}}, files.__getitem__, np.array([2])
        )
