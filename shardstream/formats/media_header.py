"""A video's or audio recording's facts from its container headers, through PyAV, without decoding a frame.

Video (``mp4``, ``webm``, ``mkv``, ``mov``, ``avi``): duration, frame rate, frame count, width, height
and codec of its first video stream; audio (``wav``, ``flac``, ``mp3``, ``ogg``, ``m4a``): sample rate,
channels, duration and codec of its first audio stream. Containers that do not store a frame count
(WebM, Matroska) give duration x frame rate, rounded. Every byte is untrusted: what does not open, or
has no stream of its kind, gives ``None``, never an FFmpeg error. PyAV is the ``media`` extra.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, BinaryIO

VIDEO_EXTENSIONS = frozenset({"mp4", "webm", "mkv", "mov", "avi"})
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "ogg", "m4a"})
MEDIA_EXTENSIONS = VIDEO_EXTENSIONS | AUDIO_EXTENSIONS
INSTALL_HINT = "pip install 'shardstream[media]' (PyAV)"


def media_kind(ext: str) -> str | None:
    """``"video"``, ``"audio"`` or None, by a field's extension (its name's last part)."""
    if ext in VIDEO_EXTENSIONS:
        return "video"
    return "audio" if ext in AUDIO_EXTENSIONS else None


@dataclass(frozen=True)
class MediaHeader:
    """What a container's headers say of its first stream of ``kind``; 0 (and ``""``) where they do not."""

    kind: str
    duration: float = 0.0  # seconds
    fps: float = 0.0
    frames: int = 0
    width: int = 0
    height: int = 0
    codec: str = ""
    sample_rate: int = 0
    channels: int = 0


def import_av() -> Any:
    """PyAV, or an ImportError that says how to install it."""
    try:
        import av
    except ImportError:
        raise ImportError(f"decoding video and audio needs PyAV: {INSTALL_HINT}") from None
    return av


def open_container(data: bytes | bytearray | memoryview | BinaryIO) -> Any:
    """An input container over ``data``, bytes or a seekable file (PyAV's ``av.open``); FFmpeg's errors as
    a ValueError of one line."""
    av = import_av()
    try:
        source = data if hasattr(data, "read") else io.BytesIO(bytes(data))  # type: ignore[arg-type]
        return av.open(source, mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise ValueError(f"not a media container FFmpeg opens ({one_line(exc)})") from None


def one_line(exc: BaseException) -> str:
    """An FFmpeg error's message as one short line (its first, at most 160 characters)."""
    lines = str(exc).splitlines()
    return (lines[0] if lines else type(exc).__name__)[:160]


def stream_seconds(container: Any, stream: Any) -> float:
    """The stream's duration in seconds from the headers (the container's when the stream has none)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return 0.0


def media_header(data: bytes | bytearray | memoryview, ext: str) -> MediaHeader | None:
    """The facts of ``data``, a field of extension ``ext``, from its headers; None where they do not read."""
    kind = media_kind(ext)
    if kind is None:
        return None
    try:
        container = open_container(data)
    except (ValueError, ImportError):
        return None
    with container:
        streams = container.streams.video if kind == "video" else container.streams.audio
        if not streams:
            return None
        stream = streams[0]
        seconds = max(stream_seconds(container, stream), 0.0)
        codec = stream.codec_context.name or ""
        if kind == "audio":
            return MediaHeader(
                kind, seconds, codec=codec, sample_rate=int(stream.rate or 0),
                channels=int(stream.channels or 0),
            )  # fmt: skip
        rate = stream.average_rate or stream.base_rate or 0
        fps = float(rate) if rate else 0.0
        frames = int(stream.frames or 0) or round(seconds * fps)
        ctx = stream.codec_context
        return MediaHeader(kind, seconds, fps, frames, int(ctx.width), int(ctx.height), codec)


__all__ = [
    "AUDIO_EXTENSIONS",
    "INSTALL_HINT",
    "MEDIA_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "MediaHeader",
    "import_av",
    "media_header",
    "media_kind",
    "one_line",
    "open_container",
    "stream_seconds",
]
