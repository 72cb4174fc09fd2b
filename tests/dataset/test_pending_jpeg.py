"""JPEGs decoded straight into their batch (PendingJpeg): the same pixels and layout as decoding each
and stacking, never visible to user code, and damaged images named in one line."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import shardstream
from shardstream.dataset import ShardDataset
from shardstream.dataset.samples import decode as decode_module
from shardstream.dataset.samples.decode import DecodeError, PendingJpeg, decode_image

pytestmark = pytest.mark.skipif(
    decode_module._simplejpeg is None, reason="simplejpeg is not installed"
)


def _jpeg(seed: int, size=(20, 12), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(
        rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8), "RGB"
    ).convert(mode)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _dataset(tmp_path, images: dict[str, bytes]) -> str:
    src = tmp_path / "src"
    src.mkdir()
    for key, data in images.items():
        (src / f"{key}.jpg").write_bytes(data)
    shardstream.pack(src, tmp_path / "ds", samples_per_shard=5, progress=False)
    return str(tmp_path / "ds")


def _expected(images: dict[str, bytes], keys: list[str]) -> torch.Tensor:
    return torch.stack([decode_image(images[k], "jpg", "torch") for k in keys])


def test_batches_hold_the_pixels_of_decoding_each_image(tmp_path):
    images = {f"{i:03d}": _jpeg(i) for i in range(12)}
    # simplejpeg refuses CMYK: Pillow decodes it into its row
    images["cmyk"] = _jpeg(99, mode="CMYK")
    url = _dataset(tmp_path, images)
    for workers in (0, 2):
        seen = []
        for batch in ShardDataset(url, seed=1).loader(4, workers):
            jpg = batch["jpg"]
            assert jpg.shape[1:] == (3, 12, 20) and jpg.dtype == torch.uint8
            # the layout batches always had
            assert jpg.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(jpg, _expected(images, batch["__key__"]))
            seen += batch["__key__"]
        assert sorted(seen) == sorted(images)


def test_images_of_different_sizes_stay_a_list(tmp_path):
    images = {"a": _jpeg(1, (20, 12)), "b": _jpeg(2, (16, 16))}
    batch = next(iter(ShardDataset(_dataset(tmp_path, images), shuffle=False).loader(2, 0)))
    assert isinstance(batch["jpg"], list)
    assert all(
        torch.equal(t, decode_image(images[k], "jpg", "torch"))
        for k, t in zip(batch["__key__"], batch["jpg"])
    )


def test_user_code_never_sees_a_pending_jpeg(tmp_path):
    url = _dataset(tmp_path, {f"{i}": _jpeg(i) for i in range(4)})
    seen = []
    ds = ShardDataset(url, transform=lambda s: seen.append(type(s["jpg"])) or s)
    next(iter(ds.loader(4, 0)))
    collated = []
    ds = ShardDataset(
        url, collate_fn=lambda samples: collated.extend(type(s["jpg"]) for s in samples) or samples
    )
    next(iter(ds.loader(4, 0)))
    assert set(seen) == set(collated) == {torch.Tensor}


def test_a_damaged_jpeg_is_named_in_one_line(tmp_path):
    good = _jpeg(1)
    cut = len(good) * 4 // 5
    damaged = good[
        :cut
    ]  # truncated: the header reads, neither simplejpeg nor Pillow decodes the rest
    assert PendingJpeg.of(damaged) is not None
    url = _dataset(tmp_path, {"a": good, "b": damaged})
    with pytest.raises(
        DecodeError,
        match=r"field 'jpg' of sample 'b' \(position \d in the shard\) of .*shard-000000-\w+\.tar does not "
        "decode",
    ):
        list(ShardDataset(url, shuffle=False).loader(2, 0))
    # skipping damaged samples decodes each sample on its own, as before: the damaged one is replaced
    batches = list(ShardDataset(url, shuffle=False, on_error="skip").loader(2, 0))
    assert sorted(k for b in batches for k in b["__key__"]) == [
        "a",
        "a",
    ]  # b replaced by the last good
