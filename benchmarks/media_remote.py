"""Bytes and time per clip from a long video in a local S3 (moto): the whole member against its blocks.

Makes one video of about ``--megabytes`` MB with PyAV (``mpeg4`` at ``--bitrate`` Mbit/s, 20 by default,
noise frames at 640x360, 30 fps, a keyframe every ``--gop`` frames, 30 by default: noise compresses
badly, so every frame takes its share of the bit rate and 200 MB is 80 s of video), packs
it as one sample of one tar shard, uploads the dataset to a moto S3 server started here, and reads a
16-frame clip at each of ``--clips`` start times spread over the video with ``ShardMap`` and
``VideoClip``:

- ``whole member``: ``partial_media=None``, the sample's span fetched by one checked ranged read;
- ``blocks (default)``: the default ``partial_media`` (8 MiB): the container's index and the 1 MiB
  blocks the clip reads, each checked against its digest recorded at pack time.

Each clip is read by a new map with an empty cache (what a process's first read of a sample costs; a
map reading the same shard again would have it in its cache), the two ways alternating, for
``--rounds`` rounds. Bytes are those the map fetched by ranged reads from the shard (the sample index
and manifest, a few KB, are left out of both); times are of ``m[i]`` alone (fetch and decode), median
over rounds and clips. Prints a table and the ratios; absolute times on a shared machine are noise.

    python benchmarks/media_remote.py [--megabytes 200] [--clips 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._remote import BUCKET, RemoteS3  # noqa: E402
from shardstream.dataset.shards.media_ranges import PARTIAL_MEDIA  # noqa: E402

FPS = 30
SIZE = (360, 640)  # height, width
NOISE_FRAMES = 64  # distinct noise frames, cycled


def make_video(path: Path, megabytes: float, gop: int, bit_rate: int) -> bytes:
    """A video of about ``megabytes`` MB of noise frames (made once, kept at ``path``)."""
    if path.exists():
        return path.read_bytes()
    import av
    import numpy as np

    rng = np.random.default_rng(0)
    height, width = SIZE
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(NOISE_FRAMES)]
    tmp = path.with_suffix(".tmp")
    with av.open(str(tmp), "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.bit_rate = bit_rate
        stream.codec_context.gop_size = gop
        written, i = 0, 0
        while written < megabytes * 1e6:
            frame = av.VideoFrame.from_ndarray(frames[i % NOISE_FRAMES], format="rgb24")
            for packet in stream.encode(frame):
                written += packet.size
                container.mux(packet)
            i += 1
        for packet in stream.encode():
            container.mux(packet)
    tmp.rename(path)
    return path.read_bytes()


def one_clip(
    url: str, options: dict, start: float, partial: object, cache: Path
) -> tuple[int, float]:
    """(bytes fetched, seconds) of a 16-frame clip at ``start`` by a new map with an empty cache."""
    import shardstream as ss

    m = ss.ShardMap(
        url,
        decode={"mp4": ss.VideoClip(frames=16, start=start), "txt": None},
        storage_options=options,
        cache_dir=str(cache),
        partial_media=partial,
    )
    began = time.perf_counter()
    sample = m[0]
    seconds = time.perf_counter() - began
    assert tuple(sample["mp4"].shape) == (16, 3, *SIZE), sample["mp4"].shape
    fetched = sum(m._open().sparse.ranged_bytes.values())
    return fetched, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200.0)
    parser.add_argument("--gop", type=int, default=FPS, help="frames per keyframe group (1 s)")
    parser.add_argument("--bitrate", type=float, default=20.0, help="Mbit/s of the video")
    parser.add_argument("--clips", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--scratch", default=str(Path(tempfile.gettempdir()) / "media-remote-bench")
    )
    args = parser.parse_args(argv)

    import shardstream as ss

    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    video = make_video(
        scratch / f"noise-{args.megabytes:g}MB-{args.bitrate:g}Mbps-gop{args.gop}.mp4",
        args.megabytes,
        args.gop,
        int(args.bitrate * 1e6),
    )
    print(f"video: {len(video) / 1e6:.1f} MB, made or read in {time.perf_counter() - began:.0f} s")
    local = Path(tempfile.mkdtemp(dir=scratch)) / "ds"
    with ss.ShardWriter(str(local), samples_per_shard=1) as writer:
        writer.write({"__key__": "long", "mp4": video, "txt": "one long video"})
    duration = _duration(video)
    starts = [duration * (k + 0.5) / args.clips for k in range(args.clips)]

    ways = {"whole member": None, "blocks (default)": PARTIAL_MEDIA}
    results: dict[str, list[tuple[int, float]]] = {name: [] for name in ways}
    with RemoteS3(latencies=()) as remote:
        remote.upload(local, "media")
        url = f"s3://{BUCKET}/media"
        options = {"client_kwargs": {"endpoint_url": remote.endpoint_url}}
        n = 0
        for r in range(args.rounds):
            for start in starts:
                order = list(ways) if (r + n) % 2 == 0 else list(reversed(ways))
                for name in order:
                    cache = scratch / f"cache-{n}"
                    n += 1
                    results[name].append(one_clip(url, options, start, ways[name], cache))
    print(
        f"\n16-frame clips at {args.clips} starts over {duration:.0f} s, {args.rounds} rounds, "
        f"moto S3 on 127.0.0.1; median per clip"
    )
    print(f"{'way':<18} {'MB fetched':>11} {'% of video':>11} {'seconds':>8}")
    medians = {}
    for name, found in results.items():
        mb = statistics.median(b for b, _ in found) / 1e6
        s = statistics.median(t for _, t in found)
        medians[name] = (mb, s)
        print(f"{name:<18} {mb:>11.2f} {100 * mb * 1e6 / len(video):>10.2f}% {s:>8.3f}")
    (wb, ws), (bb, bs) = medians["whole member"], medians["blocks (default)"]
    print(f"\nbytes: blocks / whole = {bb / wb:.4f}; time: blocks / whole = {bs / ws:.3f}")
    worst = max(b for b, _ in results["blocks (default)"]) / len(video)
    print(f"largest fetch of a clip by blocks: {100 * worst:.2f}% of the video (target < 10%)")


def _duration(video: bytes) -> float:
    import io

    import av

    with av.open(io.BytesIO(video)) as container:
        stream = container.streams.video[0]
        return float(stream.duration * stream.time_base)


if __name__ == "__main__":
    main()
