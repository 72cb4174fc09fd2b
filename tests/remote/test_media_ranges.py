"""A clip of a large video in a bucket, read by the blocks it needs (ShardMap with a media clip): the same
frames as from the whole bytes, a small part of the video fetched, every block checked against its
digest recorded at pack time, and smaller videos read whole."""

from __future__ import annotations

import pytest
import torch

import shardstream as ss
from shardstream.dataset.samples.media import VideoClip
from shardstream.errors import CorruptShardError
from shardstream.manifest.media_facts import BLOCK
from tests.media import video

from .test_shard_map_bucket import upload

CLIP = VideoClip(frames=4, start="center")


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """A local dataset of a large noisy video (about 16 blocks) and a short one, one shard each."""
    long = video(seconds=40, fps=10, size=(192, 256), gop=10, noise=60, bit_rate=40_000_000)
    short = video(seconds=2)
    assert len(long) > 8 * BLOCK
    folder = tmp_path_factory.mktemp("media-ranges")
    with ss.ShardWriter(str(folder / "ds"), samples_per_shard=1) as writer:
        writer.write({"__key__": "long", "mp4": long, "txt": "a long one"})
        writer.write({"__key__": "short", "mp4": short, "txt": "a short one"})
    return folder / "ds", long, short


def opened(bucket, url, tmp_path, **kw) -> ss.ShardMap:
    return ss.ShardMap(
        url,
        decode={"mp4": CLIP, "txt": None},
        storage_options=bucket.storage_options,
        cache_dir=str(tmp_path / "cache"),
        **kw,
    )


def media_of(m: ss.ShardMap):
    return m._open().sparse.media


def test_a_clip_by_blocks_equals_the_clip_of_the_whole_bytes(s3_bucket, tmp_path, videos):
    local, long, _ = videos
    url = upload(s3_bucket, local, "ds")
    m = opened(s3_bucket, url, tmp_path, partial_media="1MiB")
    sample = m.get("long")
    assert torch.equal(sample["mp4"], CLIP(long))
    assert sample["txt"] == b"a long one"
    media = media_of(m)
    assert media.samples == 1
    # the container's index and the keyframe group of the clip: a small part of the video
    assert 0 < media.fetched < 0.4 * len(long)
    assert not m._open().sparse.fetcher.cached(0)


def test_media_under_the_threshold_is_read_whole(s3_bucket, tmp_path, videos):
    local, long, short = videos
    url = upload(s3_bucket, local, "ds")
    m = opened(s3_bucket, url, tmp_path, partial_media="1MiB")
    assert torch.equal(m.get("short")["mp4"], CLIP(short))
    assert media_of(m).samples == 0
    m = opened(s3_bucket, url, tmp_path, partial_media="64MiB")
    assert torch.equal(m.get("long")["mp4"], CLIP(long))
    assert media_of(m).samples == 0


def test_partial_media_none_reads_whole(s3_bucket, tmp_path, videos):
    local, long, _ = videos
    url = upload(s3_bucket, local, "ds")
    m = opened(s3_bucket, url, tmp_path, partial_media=None)
    assert torch.equal(m.get("long")["mp4"], CLIP(long))
    assert media_of(m) is None


def test_decode_none_reads_the_whole_bytes(s3_bucket, tmp_path, videos):
    local, long, _ = videos
    url = upload(s3_bucket, local, "ds")
    m = ss.ShardMap(
        url,
        decode=None,
        storage_options=s3_bucket.storage_options,
        cache_dir=str(tmp_path / "cache"),
        partial_media="1MiB",
    )
    assert m.get("long")["mp4"] == long
    assert media_of(m).samples == 0


def test_a_flipped_byte_in_a_fetched_block_is_one_line_naming_the_sample(
    s3_bucket, tmp_path, videos
):
    local, long, _ = videos
    shard = sorted(local.glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    start = bytes(data).find(long)
    assert start > 0
    # the last block: the container's index (PyAV reads it first)
    data[start + len(long) - 100] ^= 0xFF
    url = upload(s3_bucket, local, "ds")
    s3_bucket.write(f"ds/{shard.name}", bytes(data))
    m = opened(s3_bucket, url, tmp_path, partial_media="1MiB", retries=0)
    with pytest.raises(CorruptShardError) as err:
        m.get("long")
    message = str(err.value)
    assert "\n" not in message
    assert shard.name in message and "long" in message and "'mp4'" in message
    assert "differs from the digest recorded at pack time" in message


def test_block_digests_are_recorded_for_large_media_only(videos):
    local, long, short = videos
    from shardstream.manifest.media_facts import recorded_media

    m = ss.ShardMap(str(local))
    facts = recorded_media(m.store, m.manifest)
    assert len(facts.block_digests("mp4", 0)) == 16 * -(-len(long) // BLOCK)
    assert facts.block_digests("mp4", 1) == b""
