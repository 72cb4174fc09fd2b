"""Video and audio classification: pack class folders of clips and recordings, train on 16-frame clips
and 1-second audio crops, stop mid-epoch, resume exactly.

    python examples/video_audio.py --media ./my-clips --work ./run --steps 20
    python examples/video_audio.py --work ./run --steps 20            # makes small class folders first
    python examples/video_audio.py --work ./run --steps 20 --resume   # continues where the last run stopped

The folder is ``root/<class>/<name>.mp4`` with ``root/<class>/<name>.wav`` beside it (one sample of two
fields; either alone works too). Packing reads each file's duration, frame rate and sample rate from
its container headers (``shardstream info`` shows the hours); reading decodes only the frames and audio
samples of each clip, seeking to the keyframe before it, with random starts drawn from (seed, epoch,
key): a resumed run sees the same clips an uninterrupted one would. Needs the ``media`` extra (PyAV):
``pip install 'shardstream[media]'``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import av
import numpy as np
import torch

import shardstream as ss

FPS, SIZE, RATE = 10, (32, 48), 16000


def write_video(path: Path, level: int, seconds: float, rng: np.random.Generator) -> None:
    """A small mp4 whose frames are noisy gray around ``level`` (the class), with a keyframe a second."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=FPS)
        stream.height, stream.width = SIZE
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = FPS
        for _ in range(round(seconds * FPS)):
            pixels = (level + rng.integers(-20, 20, (*SIZE, 3))).clip(0, 255).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_audio(path: Path, tone: float, seconds: float) -> None:
    """A wav of a sine at ``tone`` Hz (the class) at 16 kHz."""
    t = np.arange(round(seconds * RATE)) / RATE
    samples = (0.5 * np.sin(2 * np.pi * tone * t) * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def make_media(root: Path, classes: int = 3, per_class: int = 8) -> None:
    """Class folders of paired clips and recordings, 2-4 s each (stands in for yours)."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            seconds = float(rng.uniform(2, 4))
            write_video(folder / f"{i:03d}.mp4", 50 + 70 * c, seconds, rng)
            write_audio(folder / f"{i:03d}.wav", 220.0 * (c + 1), seconds)


class Classifier(torch.nn.Module):
    """A video branch (mean frame) and an audio branch (a spectrum's coarse bands), one linear head."""

    def __init__(self, classes: int):
        super().__init__()
        self.video = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten())
        self.head = torch.nn.Linear(3 * 16 + 64, classes)

    def forward(self, clips: torch.Tensor, sounds: torch.Tensor) -> torch.Tensor:
        frames = self.video(clips.float().mean(dim=1) / 255)  # (batch, 3*16)
        spectrum = torch.fft.rfft(sounds[:, 0]).abs()  # (batch, RATE // 2 + 1)
        bands = torch.nn.functional.adaptive_avg_pool1d(spectrum[:, None], 64)[:, 0]
        return self.head(torch.cat([frames, bands.log1p()], dim=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--media", help="class folders of .mp4 and .wav (default: make small ones)")
    parser.add_argument("--work", default="run-media", help="shards and the checkpoint go here")
    parser.add_argument("--steps", type=int, default=20, help="training steps in this run")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    args = parser.parse_args(argv)
    work = Path(args.work)
    media = Path(args.media) if args.media else work / "media"
    if not args.media and not media.exists():
        make_media(media)
    shards = work / "shards"
    if not (shards / "_manifest.json").exists():
        print(ss.pack(media, shards, shard_size="1MB").summary())

    decode = {
        "mp4": ss.VideoClip(frames=16, size=(32, 48)),  # 16 frames from a random start
        "wav": ss.AudioClip(sample_rate=RATE, seconds=1.0),  # a 1-second crop, mono
    }
    ds = ss.ShardDataset(shards, shuffle=True, seed=7, decode=decode)
    loader = ds.loader(batch_size=args.batch_size, num_workers=args.num_workers)
    model = Classifier(len(ds.manifest.classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    checkpoint, step = work / "checkpoint.pt", 0
    if args.resume:
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["data"])
        step = state["step"]
    print(f"{len(ds)} samples of {len(ds.manifest.classes)} classes: {ds.manifest.classes}")
    end, epoch = step + args.steps, ds.epoch
    with open(work / "seen.jsonl", "a") as seen:  # which samples each step read (the test checks)
        while step < end:
            for batch in loader:
                logits = model(batch["mp4"], batch["wav"])
                loss = torch.nn.functional.cross_entropy(logits, batch["cls"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                seen.write(json.dumps({"epoch": epoch, "keys": batch["__key__"]}) + "\n")
                if step == end:
                    break
            else:
                epoch += 1
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "data": loader.state_dict(), "step": step}, checkpoint)
    clip, sound = batch["mp4"], batch["wav"]
    print(
        f"step {step} epoch {epoch} loss {loss.item():.3f}; "
        f"clips {tuple(clip.shape)} {clip.dtype}, audio {tuple(sound.shape)} {sound.dtype}"
    )


if __name__ == "__main__":
    main()
