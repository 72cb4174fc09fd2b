"""Decoding, as the other tools' users would write it (shardstream.dataset.samples.decode does the same)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def pil_chw(data: bytes) -> torch.Tensor:
    """A JPEG as a uint8 CHW RGB tensor, decoded by Pillow."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return torch.from_numpy(np.asarray(image.convert("RGB"))).permute(2, 0, 1)


def simplejpeg_chw(data: bytes) -> torch.Tensor:
    """A JPEG as a uint8 CHW RGB tensor, decoded by simplejpeg."""
    import simplejpeg
    import torch

    return torch.from_numpy(simplejpeg.decode_jpeg(data, colorspace="RGB")).permute(2, 0, 1)


def image_decoder(mode: str) -> Callable[[bytes], Any] | None:
    return {"raw": None, "pillow": pil_chw, "fast": simplejpeg_chw, "memory": simplejpeg_chw}[mode]


class DecodeSample:
    """A picklable per-sample transform: decode the ``jpg`` field of a dict sample."""

    def __init__(self, decode: Callable[[bytes], Any]):
        self.decode = decode

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, "jpg": self.decode(sample["jpg"])}
