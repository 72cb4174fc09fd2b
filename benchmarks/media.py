"""Media benchmark: 16-frame video clips and 1-second audio crops, shardstream against the peers.

Run it with the project's environment (PyAV comes with the ``media`` extra); the peers that are not
in it are installed apart and added with ``--site``::

    pip install --target /tmp/media-site --no-deps decord torchcodec
    python benchmarks/media.py --site /tmp/media-site                       # everything
    python benchmarks/media.py --videos 40 --recordings 40 --repeat 3 --kinds video
    git archive main shardstream | tar -x -C /tmp/main && python benchmarks/media.py --before /tmp/main

The data (made once, seeded, untimed): ``--videos`` videos of 10 s, 640x360, H.264 (libx264, preset
``veryfast``, a keyframe every 2 s), 25 fps, moving textures that compress like footage; and
``--recordings`` recordings of 5 s, 16 kHz mono WAV; both in 10 class folders, each packed with
``ss.pack`` (default settings). Each measurement is a fresh subprocess reading every file once, in a
torch ``DataLoader`` of batch ``--batch`` at 1 and 2 workers, one clip per file at a random start:

- ``shardstream``: ``ss.ShardDataset(..., decode={"mp4": ss.VideoClip(frames=16)})`` (or
  ``{"wav": ss.AudioClip(seconds=1.0)}``) through ``ds.loader(...)``, its default loader;
- ``pyav``: the loop a user writes over the files: ``av.open``, seek to the keyframe before the random
  start, decode 16 frames to RGB (``to_ndarray(format="rgb24")``), stack into a tensor;
- ``decord``: ``decord.VideoReader(path).get_batch(...)`` / ``decord.AudioReader``, default settings;
- ``before`` (with ``--before DIR``): shardstream from another checkout, the row ``shardstream`` is
  compared with;
- ``hf``: Hugging Face ``datasets`` ``Video()`` / ``Audio()`` features over the same files (it decodes
  with torchcodec): where it cannot run here, its row says why.

Printed: clips/s (from the first batch to the last), the first clip's latency (making the dataset and
loader to the first batch, imports included), medians of ``--repeat`` rounds with the tools in
alternating order, and each tool's ratio to shardstream. Timings on a shared machine are noisy: every
ratio compares runs of the same invocation.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(REPO_ROOT)]

SEED = 20_261_128
CLASSES = 10
WIDTH, HEIGHT, FPS, VIDEO_SECONDS, GOP_SECONDS = 640, 360, 25, 10, 2
RATE, AUDIO_SECONDS = 16_000, 5
FRAMES, CROP_SECONDS = 16, 1.0
GENERATOR_VERSION = 1
FIELD = {"video": "mp4", "audio": "wav"}
GOALS = {
    "pyav": "clips/s >= the plain PyAV loop's",
    "hf": "clips/s ahead of Hugging Face datasets'",
}


# -- data -------------------------------------------------------------------------------------------
def make_video(index: int) -> bytes:
    """Video ``index``: 10 s of a seeded texture drifting across a moving colour gradient, H.264."""
    import av
    import numpy as np

    rng = np.random.default_rng([SEED, index])
    texture = rng.integers(0, 256, (HEIGHT // 8, WIDTH // 8, 3), dtype=np.uint8)
    texture = texture.repeat(8, axis=0).repeat(8, axis=1)  # blocks of 8 px: detail, not pure noise
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH]
    speed = rng.integers(1, 6, 2)
    sink = io.BytesIO()
    with av.open(sink, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.gop_size = GOP_SECONDS * FPS
        stream.options = {"preset": "veryfast"}  # quicker to make; B-frames and all, as footage has
        for i in range(VIDEO_SECONDS * FPS):
            moved = np.roll(texture, (int(speed[0]) * i, int(speed[1]) * i), axis=(0, 1))
            wave = ((xs + ys + 3 * i) % 256).astype(np.uint16)
            pixels = ((moved.astype(np.uint16) + wave[..., None] * 3) // 4).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return sink.getvalue()


def make_recording(index: int) -> bytes:
    """Recording ``index``: 5 s at 16 kHz, mono 16-bit WAV, a few seeded tones in noise."""
    import av
    import numpy as np

    rng = np.random.default_rng([SEED, 1_000_000 + index])
    t = np.arange(RATE * AUDIO_SECONDS) / RATE
    wave = sum(0.2 * np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 2000, 3))
    wave = wave + 0.05 * rng.standard_normal(t.size)
    pcm = (np.clip(wave, -1, 1) * 32767).astype(np.int16)
    sink = io.BytesIO()
    with av.open(sink, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return sink.getvalue()


def prepare(data: Path, kind: str, count: int) -> dict[str, str]:
    """The ``count`` files of ``kind`` in class folders, and their shardstream pack (both made once)."""
    import shardstream as ss

    root = data / "media" / f"{kind}-{count}-v{GENERATOR_VERSION}"
    marker = root / "COMPLETE.json"
    if not marker.exists():
        started = time.perf_counter()
        make = make_video if kind == "video" else make_recording
        with Pool(2) as pool:
            for i, data in enumerate(pool.imap(make, range(count))):
                name = f"class_{i % CLASSES:02d}/{kind}_{i:05d}.{FIELD[kind]}"
                (root / "train" / name).parent.mkdir(parents=True, exist_ok=True)
                (root / "train" / name).write_bytes(data)
        seconds = time.perf_counter() - started
        ss.pack(root / "train", root / "packed", progress=False)
        marker.write_text(json.dumps({"count": count, "seconds": seconds}))
    files = sorted(str(p) for p in (root / "train").rglob(f"*.{FIELD[kind]}"))
    size = sum(os.path.getsize(f) for f in files)
    print(f"{kind}: {len(files)} files, {size / 1e6:.1f} MB, in {root}", flush=True)
    return {"files": json.dumps(files), "packed": str(root / "packed")}


# -- the measured children --------------------------------------------------------------------------
def start_fraction(path: str) -> float:
    """A peer's random start: a seeded fraction of the room the clip leaves, per file."""
    return random.Random(f"{SEED}:{Path(path).name}").random()


def pyav_clip(path: str) -> Any:
    """The plain PyAV loop: seek to the keyframe before a random start, 16 frames to RGB, a tensor."""
    import av
    import numpy as np
    import torch

    with av.open(path) as container:
        stream = container.streams.video[0]
        duration = float(stream.duration * stream.time_base)
        start = start_fraction(path) * max(duration - FRAMES / float(stream.average_rate), 0.0)
        container.seek(int(start / stream.time_base), stream=stream, backward=True)
        frames = []
        for frame in container.decode(stream):
            if frame.time < start:
                continue
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) == FRAMES:
                break
    frames += [frames[-1]] * (FRAMES - len(frames))
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)


def pyav_crop(path: str) -> Any:
    """The plain PyAV loop for audio: seek, decode, cut one second at a random start."""
    import av
    import numpy as np
    import torch

    with av.open(path) as container:
        stream = container.streams.audio[0]
        duration = float(stream.duration * stream.time_base)
        start = start_fraction(path) * max(duration - CROP_SECONDS, 0.0)
        container.seek(int(start / stream.time_base), stream=stream, backward=True)
        parts, first = [], None
        for frame in container.decode(stream):
            first = frame.time if first is None else first
            parts.append(frame.to_ndarray().astype(np.float32) / 32768)
            if first + sum(p.shape[1] for p in parts) / RATE >= start + CROP_SECONDS:
                break
    samples = np.concatenate(parts, axis=1)
    skip = max(round((start - first) * RATE), 0)
    return torch.from_numpy(samples[:, skip : skip + round(CROP_SECONDS * RATE)])


def decord_clip(path: str) -> Any:
    import decord
    import torch

    reader = decord.VideoReader(path)
    start = int(start_fraction(path) * max(len(reader) - FRAMES, 0))
    indexes = [min(start + i, len(reader) - 1) for i in range(FRAMES)]
    return torch.from_numpy(reader.get_batch(indexes).asnumpy()).permute(0, 3, 1, 2)


def decord_crop(path: str) -> Any:
    import decord
    import torch

    reader = decord.AudioReader(path, sample_rate=RATE, mono=True)
    length = round(CROP_SECONDS * RATE)
    start = int(start_fraction(path) * max(reader.shape[1] - length, 0))
    return torch.from_numpy(reader[start : start + length].asnumpy())


class Files:
    """A map-style dataset over the files: each item one clip or crop made by ``read``."""

    def __init__(self, files: list[str], read: Any):
        self.files, self.read = files, read

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        return self.read(self.files[index])


class HFClips:
    """Hugging Face ``datasets`` over the files: a ``Video()`` feature gives torchcodec decoders, from
    which the clip's frames are taken; an ``Audio()`` feature decodes and resamples the recording."""

    def __init__(self, files: list[str], kind: str):
        import datasets

        try:  # what datasets decodes with: say why it does not load, not only that
            import torchcodec  # noqa: F401
        except Exception as exc:
            cause = f" ({exc.__cause__})" if exc.__cause__ else ""
            raise SystemExit(
                f"HF datasets' decoder torchcodec does not load: {exc}{cause}"
            ) from None

        feature = datasets.Video() if kind == "video" else datasets.Audio(sampling_rate=RATE)
        self.kind = kind
        self.ds = datasets.Dataset.from_dict({"media": files}).cast_column("media", feature)
        self.files = files

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, index: int) -> Any:
        import torch

        value = self.ds[index]["media"]
        fraction = start_fraction(self.files[index])
        if self.kind == "video":  # a torchcodec VideoDecoder
            count = value.metadata.num_frames
            start = int(fraction * max(count - FRAMES, 0))
            return value.get_frames_in_range(start, min(start + FRAMES, count)).data
        samples = value.get_all_samples() if hasattr(value, "get_all_samples") else value
        array = samples.data if hasattr(samples, "data") else torch.as_tensor(samples["array"])
        length = round(CROP_SECONDS * RATE)
        start = int(fraction * max(array.shape[-1] - length, 0))
        return array[..., start : start + length]


def stack(items: list[Any]) -> Any:
    import torch

    return torch.stack(items)


def child(tool: str, kind: str, paths: dict[str, str], workers: int, batch: int) -> dict[str, Any]:
    """One pass over every file: clips/s and the first clip's latency."""
    from torch.utils.data import DataLoader

    files = json.loads(paths["files"])
    started = time.perf_counter()
    if tool in ("shardstream", "before"):
        if tool == "before":  # another checkout's shardstream, e.g. the one before a change
            sys.path.insert(0, paths["before"])
        import shardstream as ss

        clip = (
            ss.VideoClip(frames=FRAMES) if kind == "video" else ss.AudioClip(seconds=CROP_SECONDS)
        )
        ds = ss.ShardDataset(paths["packed"], decode={FIELD[kind]: clip})
        loader = ds.loader(batch_size=batch, num_workers=workers)
        field = FIELD[kind]
    else:
        if tool == "hf":
            dataset: Any = HFClips(files, kind)
        else:
            read = {
                ("pyav", "video"): pyav_clip,
                ("pyav", "audio"): pyav_crop,
                ("decord", "video"): decord_clip,
                ("decord", "audio"): decord_crop,
            }[tool, kind]
            dataset = Files(files, read)
        loader = DataLoader(
            dataset, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=stack
        )
        field = None
    count, first, shape, first_count = 0, 0.0, None, 0
    for out in loader:
        clips = out[field] if field else out
        count += len(clips)
        if shape is None:
            first, shape, first_count = time.perf_counter() - started, list(clips.shape[1:]), count
    seconds = time.perf_counter() - started - first
    if count != len(files):
        raise SystemExit(f"{tool} read {count} clips of {len(files)} files")
    # clips/s after the first batch: the first clip's latency is its own column
    return {"rate": (count - first_count) / seconds, "first": first, "clips": count, "shape": shape}


def run_child(args: argparse.Namespace, *argv: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.site:  # the peers installed apart
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), args.site]))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *argv], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        reason = next(
            (ln for ln in reversed(lines) if "Error" in ln or "does not" in ln),
            lines[-1] if lines else "",
        )
        return {"error": f"exit {proc.returncode}: {reason.strip()[:300]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the parent -------------------------------------------------------------------------------------
def backend(tool: str, kind: str) -> str:
    if tool in ("shardstream", "before", "pyav"):
        import av

        return f"PyAV {av.__version__} (FFmpeg {av.library_versions['libavcodec'][0]}.x avcodec)"
    if tool == "decord":
        return "decord (its bundled FFmpeg)"
    return "torchcodec"


def part(args: argparse.Namespace, kind: str, paths: dict[str, str]) -> list[str]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    cases = [(t, w) for w in args.workers for t in args.tools]
    for r in range(args.repeat):
        tools = args.tools[r % len(args.tools) :] + args.tools[: r % len(args.tools)]
        for workers in args.workers:
            for tool in tools:
                if len(runs.get((tool, workers), [])) and "error" in runs[tool, workers][0]:
                    continue  # a tool that cannot run here fails the same way every round
                found = run_child(
                    args, tool, kind, json.dumps(paths), str(workers), str(args.batch)
                )
                print(f"  {kind} {tool} workers={workers}: {found}", flush=True)
                runs.setdefault((tool, workers), []).append(found)
    what = f"{FRAMES}-frame clips" if kind == "video" else f"{CROP_SECONDS:g} s crops"
    lines = [
        f"| {kind}: {what} | backend | workers | clips/s (median of {args.repeat}) "
        f"| first clip (s) | shardstream's clips/s vs this |",
        "|---|---|---:|---:|---:|---:|",
    ]
    rate: dict[tuple[str, int], float] = {}
    for tool, workers in cases:
        ok = [r for r in runs[tool, workers] if "error" not in r]
        if not ok:
            error = runs[tool, workers][0]["error"].replace("|", "/")
            lines.append(f"| {tool} | {backend(tool, kind)} | {workers} | failed: {error} | | |")
            continue
        rate[tool, workers] = statistics.median(r["rate"] for r in ok)
        first = statistics.median(r["first"] for r in ok)
        ours = rate.get(("shardstream", workers))
        ratio = f"{ours / rate[tool, workers]:.2f}x" if ours else ""
        lines.append(
            f"| {tool} | {backend(tool, kind)} | {workers} | {rate[tool, workers]:.1f} "
            f"| {first:.3f} | {ratio} |"
        )
    for peer, goal in GOALS.items():
        for workers in args.workers:
            if ("shardstream", workers) in rate and (peer, workers) in rate:
                ratio = rate["shardstream", workers] / rate[peer, workers]
                verdict = "met" if ratio >= 1 else "missed"
                lines.append(f"\nGoal ({goal}, {workers} workers): {verdict}: {ratio:.2f}x")
            elif peer in args.tools and workers == args.workers[0]:
                lines.append(f"\nGoal ({goal}): not measured, {peer} did not run")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "bench-data")
    parser.add_argument("--kinds", default="video,audio")
    parser.add_argument("--tools", default="shardstream,pyav,decord,hf")
    parser.add_argument("--videos", type=int, default=40, help="10 s 360p videos")
    parser.add_argument("--recordings", type=int, default=200, help="5 s 16 kHz recordings")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch", type=int, default=4, help="clips per batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--site", default=None, help="a folder of peers to add to the children's path"
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a folder holding another shardstream package (e.g. from `git archive`), measured as "
        "the row 'before'",
    )
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        tool, kind, paths, workers, batch = args.child
        print(json.dumps(child(tool, kind, json.loads(paths), int(workers), int(batch))))
        return 0
    args.tools = [t for t in args.tools.split(",") if t] + (["before"] if args.before else [])
    args.workers = [int(w) for w in args.workers.split(",") if w]
    report = [f"machine: {os.cpu_count()} CPUs (shared), python {sys.version.split()[0]}"]
    for kind in args.kinds.split(","):
        count = args.videos if kind == "video" else args.recordings
        paths = prepare(args.data, kind, count)
        if args.before:
            paths["before"] = str(args.before.resolve())
        print(f"{kind} ...", flush=True)
        report += ["", f"### {kind}", "", *part(args, kind, paths)]
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
