"""Video and audio decoders: the frames and samples a batch needs, not the whole file.

``VideoClip`` decodes a video field to a ``torch.uint8`` tensor (frames, 3, H, W) in time order;
``AudioClip`` an audio field to ``torch.float32`` (channels, samples) in [-1, 1]. Used as
``decode={"mp4": ss.VideoClip(frames=8)}``; ``decode="torch"`` decodes video fields with
:data:`DEFAULT_VIDEO` and audio fields with :data:`DEFAULT_AUDIO`.

A clip starts at the container's first frame (``start="start"``), in the middle (``"center"``), at a
number of seconds, or at a random point (``"random"``): a fraction of the room the clip leaves, drawn
from (seed, epoch, key) by :func:`clip_fraction` — never from a global generator — so a sample gives
the same clip whatever the worker count, rank or resume. Paired fields of one key (``clip.mp4`` and
``clip.wav``) draw the same fraction. Decoding seeks to the keyframe at or before the clip's start
(PyAV's ``container.seek``) rather than decoding from the start. A clip that runs past the end repeats
the last frame (video) or is padded with silence (audio), so every clip of a setting has one shape.
Bad media (not a container, no stream of the kind, no frames, damaged data) raise a ``ValueError`` of
one line, which the decoder names with the sample (and ``on_error="skip"`` skips).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from ...formats.media_header import import_av, one_line, open_container, stream_seconds

Start = str | float | int


def clip_fraction(seed: int, epoch: int, key: Any) -> float:
    """A fraction in [0, 1) fixed by (seed, epoch, key): where a random clip starts in the room it has."""
    text = f"{int(seed)}\x00{int(epoch)}\x00{'' if key is None else key}".encode()
    value = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    return value / 2**64


def _check_start(start: Any) -> None:
    if isinstance(start, bool) or not (
        start in ("random", "start", "center")
        or (isinstance(start, (int, float)) and math.isfinite(start) and start >= 0)
    ):
        raise UsageError(
            f'start={start!r} must be "random", "start", "center" or a number of seconds >= 0'
        )


def _start_at(start: Start, duration: float, span: float, fraction: float) -> float:
    """The clip's start in seconds: of a container of ``duration`` seconds, a clip of ``span``."""
    room = max(duration - span, 0.0)
    if start == "start":
        return 0.0
    if start == "center":
        return room / 2
    if start == "random":
        return fraction * room
    return float(start)


class MediaClip:
    """What the decoder asks of a media decoder: ``decode(data, fraction)``."""

    kind = ""

    def decode(self, data: bytes | bytearray | memoryview, fraction: float) -> Any:
        raise NotImplementedError

    def __call__(
        self,
        data: bytes | bytearray | memoryview,
        *,
        seed: int = 0,
        epoch: int = 0,
        key: Any = None,
    ) -> Any:
        """Decode ``data`` on its own; a random start is drawn from (``seed``, ``epoch``, ``key``)."""
        return self.decode(data, clip_fraction(seed, epoch, key))


def _stream(container: Any, kind: str) -> Any:
    streams = container.streams.video if kind == "video" else container.streams.audio
    if not streams:
        raise ValueError(f"it has no {kind} stream")
    return streams[0]


def decode_threads() -> int:
    """FFmpeg's decoding threads per clip: this process's share of the CPUs it may run on (all of them
    in the main process, a 1/n share in each of n ``DataLoader`` workers), at least 1."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) // (info.num_workers if info is not None else 1))


def _seek(container: Any, stream: Any, seconds: float) -> None:
    """To the keyframe at or before ``seconds`` into ``stream`` (nothing to do at its start)."""
    if seconds <= 0 or stream.time_base is None:
        return
    offset = int(seconds / stream.time_base) + (stream.start_time or 0)
    av = import_av()
    try:
        container.seek(offset, stream=stream, backward=True, any_frame=False)
    except av.FFmpegError as exc:
        raise ValueError(f"it does not seek to {seconds:.3f} s ({one_line(exc)})") from None


def _decoded(container: Any, stream: Any) -> Any:
    """The stream's frames from where the container is; FFmpeg's errors as one line."""
    av = import_av()
    try:
        yield from container.decode(stream)
    except av.FFmpegError as exc:
        raise ValueError(f"its data does not decode ({one_line(exc)})") from None


@dataclass(frozen=True)
class VideoClip(MediaClip):
    """``frames`` frames of a video field as ``torch.uint8`` (frames, 3, H, W), in time order.

    Args:
        frames: frames per clip (default 16).
        fps: frames per second of the clip; None (the default): the video's own rate, consecutive
            frames.
        start: where the clip starts: ``"random"`` (the default; from seed, epoch and key),
            ``"start"``, ``"center"`` or a number of seconds.
        size: (height, width), or one number for a square, resized while converting to RGB; None
            (the default): as stored.
    """

    frames: int = 16
    fps: float | None = None
    start: Start = "random"
    size: int | tuple[int, int] | None = None
    kind = "video"

    def __post_init__(self) -> None:
        if isinstance(self.frames, bool) or not isinstance(self.frames, int) or self.frames < 1:
            raise UsageError(f"VideoClip(frames={self.frames!r}) must be a whole number >= 1")
        if self.fps is not None and not (isinstance(self.fps, (int, float)) and self.fps > 0):
            raise UsageError(f"VideoClip(fps={self.fps!r}) must be a number > 0, or None")
        _check_start(self.start)
        size = (self.size, self.size) if isinstance(self.size, int) else self.size
        if size is not None and not (
            len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size)
        ):
            raise UsageError(
                f"VideoClip(size={self.size!r}) must be (height, width), one number or None"
            )

    def decode(self, data: bytes | bytearray | memoryview, fraction: float) -> Any:
        with open_container(data) as container:
            stream = _stream(container, "video")
            threads, codec = decode_threads(), stream.codec_context
            if (
                threads > 1 and codec is not None
            ):  # frame and slice threads: the same frames, sooner
                codec.thread_type, codec.thread_count = "AUTO", threads
            rate = stream.average_rate or stream.base_rate or stream.guessed_rate
            native = float(rate) if rate else 0.0
            step = 1 / (self.fps or native or 25.0)
            begin = _start_at(
                self.start, stream_seconds(container, stream), self.frames * step, fraction
            )
            _seek(container, stream, begin)
            arrays = self._frames(_decoded(container, stream), begin, step, native)
        if not arrays:
            raise ValueError("it holds no video frames")
        arrays += [arrays[-1]] * (self.frames - len(arrays))  # past the end: the last frame again
        import numpy as np
        import torch

        return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)

    def _frames(self, frames: Any, begin: float, step: float, native: float) -> list[Any]:
        """The clip's frames as H x W x 3 arrays: for each wanted time, the last frame shown by then.
        Frames decoded on the way from the keyframe are converted to RGB only if the clip takes them;
        a start past the last frame gives the last frame."""
        wanted = [begin + i * step for i in range(self.frames)]
        slack = 0.5 / native if native else 1e-6  # a frame's time rounded in its time base
        out: list[Any] = []
        last = last_rgb = None
        for n, frame in enumerate(frames):
            shown = frame.time if frame.time is not None else n / (native or 25.0)
            while len(out) < self.frames and last is not None and shown > wanted[len(out)] + slack:
                last_rgb = self._rgb(last) if last_rgb is None else last_rgb
                out.append(last_rgb)  # the wanted time falls before this frame: the one before it
            if len(out) == self.frames:
                break
            last, last_rgb = frame, None
            if shown >= wanted[len(out)] - slack:
                last_rgb = self._rgb(frame)
                out.append(last_rgb)
                if len(out) == self.frames:
                    break
        if not out and last is not None:
            out.append(self._rgb(last))
        return out

    def _rgb(self, frame: Any) -> Any:
        if self.size is None:
            return frame.to_ndarray(format="rgb24")
        height, width = (self.size, self.size) if isinstance(self.size, int) else self.size
        return frame.reformat(width=width, height=height, format="rgb24").to_ndarray()


@dataclass(frozen=True)
class AudioClip(MediaClip):
    """An audio field as ``torch.float32`` (channels, samples) in [-1, 1].

    Args:
        sample_rate: resampled to this rate; None (the default): as stored.
        seconds: the clip's length; None (the default): the whole recording, from ``start`` where it
            is a number of seconds, else from its start.
        mono: the channels' mean as one channel (default True).
        start: where the clip starts, as :class:`VideoClip`'s (default ``"random"``).
    """

    sample_rate: int | None = None
    seconds: float | None = None
    mono: bool = True
    start: Start = "random"
    kind = "audio"

    def __post_init__(self) -> None:
        rate = self.sample_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 1):
            raise UsageError(
                f"AudioClip(sample_rate={rate!r}) must be a whole number >= 1, or None"
            )
        if self.seconds is not None and not (
            isinstance(self.seconds, (int, float)) and self.seconds > 0
        ):
            raise UsageError(f"AudioClip(seconds={self.seconds!r}) must be a number > 0, or None")
        _check_start(self.start)

    def decode(self, data: bytes | bytearray | memoryview, fraction: float) -> Any:
        import numpy as np
        import torch

        av = import_av()
        with open_container(data) as container:
            stream = _stream(container, "audio")
            rate = self.sample_rate or stream.rate
            if not rate:
                raise ValueError("it has no sample rate")
            # the whole recording: from a number of seconds, else from its start
            if self.seconds is None:
                begin = 0.0 if isinstance(self.start, str) else float(self.start)
            else:
                begin = _start_at(
                    self.start, stream_seconds(container, stream), self.seconds, fraction
                )
            _seek(container, stream, begin)
            # samples already at the rate in a format of known scale are converted here; others resampled
            resampler = (
                None
                if rate == stream.rate
                and stream.format is not None
                and stream.format.name in _SCALES
                else av.AudioResampler(format="fltp", rate=rate)
            )
            first, parts = self._decode(_decoded(container, stream), resampler, begin, rate)
        if not parts:
            raise ValueError("it holds no audio samples")
        samples = np.concatenate(parts, axis=1)
        skip = max(round((begin - first) * rate), 0)
        samples = samples[:, skip:]
        if self.seconds is not None:
            length = round(self.seconds * rate)
            samples = samples[:, :length]
            if samples.shape[1] < length:  # past the end: silence
                samples = np.pad(samples, ((0, 0), (0, length - samples.shape[1])))
        if self.mono:
            samples = samples.mean(axis=0, keepdims=True)
        return torch.from_numpy(np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False))

    def _decode(
        self, frames: Any, resampler: Any, begin: float, rate: int
    ) -> tuple[float, list[Any]]:
        """The time of the first decoded sample, and the samples as (channels, n) arrays from there on,
        until the clip's end."""
        end = None if self.seconds is None else begin + self.seconds
        first, parts, got = None, [], 0
        for frame in frames:
            if first is None:
                first = frame.time if frame.time is not None else 0.0
            for out in [frame] if resampler is None else resampler.resample(frame):
                parts.append(_planes(out) if resampler is None else out.to_ndarray())
                got += out.samples
            if end is not None and first + got / rate >= end:
                break
        else:
            if resampler is not None:
                parts += [out.to_ndarray() for out in resampler.resample(None)]
        return first or 0.0, [p for p in parts if p.shape[-1]]


# sample formats converted without a resampler: (dtype's offset, scale to [-1, 1])
_SCALES = {
    "u8": (128.0, 128.0), "u8p": (128.0, 128.0),
    "s16": (0.0, 32768.0), "s16p": (0.0, 32768.0),
    "s32": (0.0, 2147483648.0), "s32p": (0.0, 2147483648.0),
    "flt": (0.0, 1.0), "fltp": (0.0, 1.0),
    "dbl": (0.0, 1.0), "dblp": (0.0, 1.0),
}  # fmt: skip


def _planes(frame: Any) -> Any:
    """A decoded audio frame as float32 (channels, samples) in [-1, 1], as a resampler to ``fltp`` gives."""
    import numpy as np

    offset, scale = _SCALES[frame.format.name]
    array = frame.to_ndarray()
    if not frame.format.is_planar:  # (1, samples x channels), interleaved
        array = array.reshape(-1, len(frame.layout.channels)).T
    out = array.astype(np.float32)
    if offset:
        out -= offset
    if scale != 1.0:
        out /= scale
    return out


DEFAULT_VIDEO = VideoClip()
DEFAULT_AUDIO = AudioClip()


__all__ = ["DEFAULT_AUDIO", "DEFAULT_VIDEO", "AudioClip", "MediaClip", "VideoClip", "clip_fraction"]
