"""Tiny videos and recordings made with PyAV for the media tests: deterministic, a few kilobytes.

Each video frame is one flat gray whose level is 10 x its index, so a test reads which frame a clip
holds from any pixel (the codec is lossy: compare to within a few levels); each recording is a
ramp, so a test reads where a clip starts from its first sample.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

av = pytest.importorskip("av")


def video(
    seconds: float = 2.0,
    fps: int = 10,
    size: tuple[int, int] = (24, 32),
    fmt: str = "mp4",
    codec: str = "mpeg4",
    gop: int = 5,
    noise: int = 0,
    bit_rate: int | None = None,
) -> bytes:
    """A video of ``seconds`` at ``fps`` (height, width ``size``): frame i is gray level 10 * i (mod 250);
    ``noise``: plus random levels in [0, noise) (fixed by the frame's index), which compress badly: with a
    high ``bit_rate``, a video of megabytes from a few seconds."""
    height, width = size
    sink = io.BytesIO()
    with av.open(sink, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        for i in range(round(seconds * fps)):
            pixels = np.full((height, width, 3), (10 * i) % 250, np.uint8)
            if noise:
                grain = np.random.default_rng(i).integers(0, noise, (height, width, 3))
                pixels = np.clip(pixels.astype(np.int64) + grain, 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return sink.getvalue()


def audio(
    seconds: float = 1.0,
    rate: int = 8000,
    channels: int = 1,
    fmt: str = "wav",
    codec: str = "pcm_s16le",
) -> bytes:
    """A recording of ``seconds`` at ``rate``: sample n is the ramp n / (seconds * rate) - 0.5 (to within
    16 bits); with 2 channels the second is half the first."""
    n = round(seconds * rate)
    ramp = (np.arange(n) / max(n, 1) - 0.5) * 32767
    layout = "mono" if channels == 1 else "stereo"
    planes = np.stack([ramp, ramp / 2][:channels]).astype(np.int16)
    sink = io.BytesIO()
    with av.open(sink, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        if n:  # none: a container with an audio stream and no samples
            frame = av.AudioFrame.from_ndarray(planes.T.reshape(1, -1), format="s16", layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return sink.getvalue()


def frame_levels(clip) -> list[int]:
    """Each frame's gray level of a decoded (frames, 3, H, W) clip (its mean, rounded)."""
    return [round(float(f.float().mean())) for f in clip]


__all__ = ["audio", "av", "frame_levels", "video"]
