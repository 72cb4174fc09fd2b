"""Decoders by field extension: images in three modes, labels, text, JSON, numpy and torch files."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream.dataset.samples import decode as decode_module
from shardstream.dataset.samples.decode import DecodeError, Decoder, decode_value
from shardstream.errors import ShardstreamError

W, H = 6, 4  # image width and height: distinct so that HWC and CHW cannot be confused


def gradient(mode: str = "RGB") -> Image.Image:
    """A small image whose pixels all differ, in ``mode``."""
    ys, xs = np.mgrid[0:H, 0:W]
    rgb = np.stack([xs * 40, ys * 60, (xs + ys) * 20], axis=-1).astype(np.uint8)
    image = Image.fromarray(rgb, "RGB")
    if mode == "RGBA":
        alpha = Image.fromarray(np.full((H, W), 128, np.uint8), "L")
        image = image.copy()
        image.putalpha(alpha)
        return image
    return image.convert(mode)


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def png_bytes(mode: str = "RGB") -> bytes:
    return encode(gradient(mode), "PNG")


def jpeg_bytes(mode: str = "RGB") -> bytes:
    return encode(gradient(mode), "JPEG", quality=95)


def pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


# -- images ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ext,make", [("png", png_bytes), ("jpg", jpeg_bytes), ("jpeg", jpeg_bytes)]
)
def test_pil_mode_gives_a_loaded_pil_image(ext, make):
    image = Decoder("pil")({"__key__": "k", ext: make()})[ext]
    assert isinstance(image, Image.Image)
    assert image.size == (W, H)
    assert image.mode == "RGB"


def test_pil_mode_keeps_the_stored_image_mode():
    assert Decoder("pil")({"png": png_bytes("L")})["png"].mode == "L"
    assert Decoder("pil")({"png": png_bytes("RGBA")})["png"].mode == "RGBA"


@pytest.mark.parametrize("ext,make", [("png", png_bytes), ("jpg", jpeg_bytes)])
def test_numpy_mode_gives_hwc_uint8_rgb(ext, make):
    data = make()
    array = Decoder("numpy")({ext: data})[ext]
    assert isinstance(array, np.ndarray)
    assert array.shape == (H, W, 3)
    assert array.dtype == np.uint8
    if ext == "png":  # lossless: exactly the pixels written
        assert np.array_equal(array, np.asarray(gradient()))


@pytest.mark.parametrize("ext,make", [("png", png_bytes), ("jpg", jpeg_bytes)])
def test_torch_mode_gives_chw_uint8_rgb(ext, make):
    data = make()
    tensor = Decoder("torch")({ext: data})[ext]
    assert isinstance(tensor, torch.Tensor)
    assert tensor.shape == (3, H, W)
    assert tensor.dtype == torch.uint8
    numpy_version = Decoder("numpy")({ext: data})[ext]
    assert torch.equal(
        tensor, torch.from_numpy(np.ascontiguousarray(numpy_version)).permute(2, 0, 1)
    )


def test_torch_is_the_default_mode():
    assert Decoder()({"png": png_bytes()})["png"].shape == (3, H, W)


@pytest.mark.parametrize("mode", ["numpy", "torch"])
@pytest.mark.parametrize(
    "ext,image_mode", [("png", "L"), ("png", "RGBA"), ("png", "P"), ("jpg", "L")]
)
def test_grayscale_palette_and_rgba_images_become_rgb(mode, ext, image_mode):
    image = gradient(image_mode)
    data = encode(image, "JPEG" if ext == "jpg" else "PNG")
    value = Decoder(mode)({ext: data})[ext]
    shape = (H, W, 3) if mode == "numpy" else (3, H, W)
    assert tuple(value.shape) == shape
    if ext == "png":  # lossless: the same as Pillow's own RGB conversion
        expected = np.asarray(image.convert("RGB"))
        got = value if mode == "numpy" else value.permute(1, 2, 0).numpy()
        assert np.array_equal(got, expected)


def test_compound_extension_decodes_by_its_last_part():
    sample = Decoder("numpy")(
        {"__key__": "k", "seg.png": png_bytes("L"), "mask.seg.png": png_bytes()}
    )
    assert sample["seg.png"].shape == (H, W, 3)
    assert sample["mask.seg.png"].shape == (H, W, 3)


def test_extension_match_is_case_insensitive():
    assert Decoder("numpy")({"PNG": png_bytes()})["PNG"].shape == (H, W, 3)


def test_decoded_png_is_writable():
    # JPEGs through simplejpeg come back writable; Pillow's path (PNG, or JPEG without simplejpeg) does not.
    data = png_bytes()
    assert Decoder("numpy")({"png": data})["png"].flags.writeable
    assert decode_module._image_array(data, "png").flags.writeable  # what torch.from_numpy wraps


@pytest.mark.skipif(decode_module._simplejpeg is None, reason="simplejpeg is not installed")
@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_simplejpeg_decode_matches_pillow(mode):
    ys, xs = np.mgrid[0:48, 0:64]
    rgb = np.stack([xs * 4, ys * 5, (xs * ys) % 256], axis=-1).astype(np.uint8)
    data = encode(Image.fromarray(rgb, "RGB"), "JPEG", quality=90)
    value = Decoder(mode)({"jpg": data})["jpg"]
    got = value if mode == "numpy" else value.permute(1, 2, 0).numpy()
    expected = pillow_rgb(data)
    assert got.shape == expected.shape == (48, 64, 3)
    diff = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() <= 8
    assert diff.mean() < 1.0


def test_cmyk_jpeg_becomes_rgb():
    data = encode(gradient("CMYK"), "JPEG")
    assert Decoder("numpy")({"jpg": data})["jpg"].shape == (H, W, 3)


# -- other extensions -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["pil", "numpy", "torch"])
def test_non_image_fields_decode_the_same_in_every_mode(mode):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    npy = io.BytesIO()
    np.save(npy, array)
    pth = io.BytesIO()
    torch.save({"w": torch.arange(5)}, pth)
    sample = {
        "__key__": "k",
        "cls": b"7",
        "cls2": b"-3",
        "txt": "héllo wörld".encode(),
        "json": json.dumps({"a": [1, 2], "b": "ü"}).encode(),
        "npy": npy.getvalue(),
        "pth": pth.getvalue(),
    }
    out = Decoder(mode)(sample)
    assert out["__key__"] == "k"
    assert out["cls"] == 7 and isinstance(out["cls"], int)
    assert out["cls2"] == -3
    assert out["txt"] == "héllo wörld"
    assert out["json"] == {"a": [1, 2], "b": "ü"}
    assert isinstance(out["npy"], np.ndarray) and np.array_equal(out["npy"], array)
    assert out["npy"].dtype == np.float32
    assert torch.equal(out["pth"]["w"], torch.arange(5))


def test_unknown_extensions_stay_bytes():
    sample = {"__key__": "k", "bin": b"\x00\x01", "weird.ext": b"abc", "seg.unknown": b"x"}
    assert Decoder("torch")(sample) == sample


def test_none_keeps_every_field_as_stored():
    sample = {"__key__": "k", "png": png_bytes(), "cls": b"3", "txt": b"hi"}
    assert Decoder(None)(sample) == sample


def test_decode_value_with_no_mode_returns_the_bytes():
    assert decode_value(b"12", "cls", None) == b"12"


def test_values_that_are_not_bytes_pass_through():
    # Arrow rows hold ints and strings already.
    sample = {"__key__": "k", "cls": 4, "txt": "already text", "png": png_bytes()}
    out = Decoder("numpy")(sample)
    assert out["cls"] == 4 and out["txt"] == "already text"
    assert out["png"].shape == (H, W, 3)


def test_memoryview_and_bytearray_values_are_decoded():
    out = Decoder("torch")({"cls": memoryview(b"5"), "txt": bytearray(b"ok")})
    assert out == {"cls": 5, "txt": "ok"}


# -- per-field mappings and whole-sample callables ---------------------------------------


def test_mapping_with_callables_modes_and_default():
    data = png_bytes()
    spec = {
        "txt": lambda b: b.decode().upper(),
        "png": "pil",
        "seg.png": None,
        "*": "numpy",
    }
    sample = {
        "__key__": "k",
        "txt": b"abc",
        "png": data,
        "seg.png": data,
        "jpg": jpeg_bytes(),
        "cls": b"2",
    }
    out = Decoder(spec)(sample)
    assert out["txt"] == "ABC"
    assert isinstance(out["png"], Image.Image)
    assert out["seg.png"] == data  # None: kept as bytes
    assert isinstance(out["jpg"], np.ndarray) and out["jpg"].shape == (H, W, 3)  # "*" entry
    assert out["cls"] == 2
    assert out["__key__"] == "k"


def test_mapping_without_star_defaults_to_torch():
    out = Decoder({"txt": lambda b: len(b)})({"txt": b"four", "png": png_bytes()})
    assert out["txt"] == 4
    assert isinstance(out["png"], torch.Tensor) and out["png"].shape == (3, H, W)


def test_mapping_with_star_none_keeps_unnamed_fields_as_bytes():
    data = png_bytes()
    out = Decoder({"cls": lambda b: int(b) * 10, "*": None})({"cls": b"3", "png": data})
    assert out == {"cls": 30, "png": data}


def test_whole_sample_callable_replaces_decoding():
    seen = []

    def whole(sample):
        seen.append(dict(sample))
        return {"key": sample["__key__"], "n": len(sample["bin"])}

    sample = {"__key__": "k", "bin": b"12345", "png": png_bytes()}
    assert Decoder(whole)(sample) == {"key": "k", "n": 5}
    assert seen == [sample]  # it gets the raw bytes, not decoded values


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,data",
    [
        ("jpg", b"not a jpeg"),
        ("png", b"\x89PNG but broken"),
        ("seg.png", b"garbage"),
        ("cls", b"seven"),
        ("json", b"{not json"),
        ("txt", b"\xff\xfe\xfa"),
        ("npy", b"not numpy"),
        ("pth", b"not torch"),
    ],
)
def test_bad_bytes_raise_decode_error_naming_the_field(field, data):
    with pytest.raises(DecodeError) as info:
        Decoder("torch")({"__key__": "k", "txt2": b"fine", field: data})
    assert repr(field) in str(info.value)
    assert isinstance(info.value, ShardstreamError)


def test_a_failing_field_callable_raises_decode_error_naming_the_field():
    def boom(_):
        raise RuntimeError("custom failure")

    with pytest.raises(DecodeError, match="'label.cls'.*custom failure"):
        Decoder({"label.cls": boom})({"label.cls": b"1"})


@pytest.mark.parametrize(
    "spec",
    ["tensor", "PIL", "", 42, {"png": "bogus"}, {"*": "bogus"}, {"txt": 3}],
)
def test_invalid_spec_raises_value_error(spec):
    with pytest.raises(ValueError):
        Decoder(spec)


def test_mapping_naming_a_field_the_sample_lacks_is_refused_even_when_skipping(tmp_path):
    from shardstream import ShardDataset, ShardWriter

    with pytest.raises(
        ShardstreamError, match=r"names fields \['jpg'\].*fields are \['JPEG', 'cls'\]"
    ):
        Decoder({"jpg": "pil", "*": None})({"__key__": "k", "JPEG": b"x", "cls": b"1"})
    assert Decoder({"cls": "numpy", "*": None})({"cls": b"1", "txt": b"a"}) == {
        "cls": 1,
        "txt": b"a",
    }
    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=2) as w:
        for i in range(4):
            w.write({"__key__": f"{i:03d}", "cls": i})
    # refused when made: the manifest
    with pytest.raises(ShardstreamError, match=r"\['label'\].*\['cls'\]"):
        # lists the fields
        ShardDataset(str(tmp_path / "ds"), decode={"label": int}, on_error="skip")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decode": {"jgp": "torch"}},
        {"fields": ["jgp", "cls"]},
        {"fields": {"image": "jgp;jepg"}},
        {"decode": {"jgp": None}, "fields": ["cls"]},
    ],
)
def test_names_the_manifest_does_not_list_are_refused_when_the_dataset_is_made(tmp_path, kwargs):
    from shardstream import ShardDataset, ShardWriter
    from shardstream.errors import UsageError

    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=2) as w:
        for i in range(4):
            w.write({"__key__": f"{i:03d}", "jpg": png_bytes(), "cls": i})
    with pytest.raises(
        UsageError, match=r"ds: .*jgp.*the dataset does not have; its fields are \['cls', 'jpg'\]"
    ):
        ShardDataset(str(tmp_path / "ds"), on_error="skip", **kwargs)
    assert (
        len(list(ShardDataset(str(tmp_path / "ds"), fields={"image": "jgp;jpg", "label": "cls"})))
        == 4
    )


def test_a_decode_function_may_make_the_fields_it_selects(tmp_path):
    from shardstream import ShardDataset, ShardWriter

    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=2) as w:
        for i in range(4):
            w.write({"__key__": f"{i:03d}", "cls": i})
    ds = ShardDataset(
        str(tmp_path / "ds"), decode=lambda s: {**s, "made": 1}, fields=["made"], shuffle=False
    )
    assert [s["made"] for s in ds] == [1] * 4


def test_hugging_face_image_structs_are_decoded_and_named_functions_called(tmp_path):
    """Arrow rows holding HF Image values ({"bytes", "path"}): decoded by the path's suffix; a decode
    function named for such a field is called with the value (it used to be silently skipped)."""
    import io as _io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    import shardstream as ss

    png = _io.BytesIO()
    Image.new("RGB", (4, 3), (255, 0, 0)).save(png, "PNG")
    table = pa.table(
        {
            "image": [{"bytes": png.getvalue(), "path": f"{i}.png"} for i in range(3)],
            "label": [0, 1, 2],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    ss.pack(tmp_path / "t.parquet", tmp_path / "ds", progress=False, shuffle=False)
    sample = next(iter(ss.ShardDataset(str(tmp_path / "ds"), shuffle=False)))
    assert tuple(sample["image"].shape) == (3, 3, 4) and int(sample["image"][0, 0, 0]) == 255
    seen = []
    mine = ss.ShardDataset(
        str(tmp_path / "ds"), shuffle=False, decode={"image": lambda v: seen.append(v) or "mine"}
    )
    assert next(iter(mine))["image"] == "mine" and seen[0]["path"] == "0.png"
    raw = next(iter(ss.ShardDataset(str(tmp_path / "ds"), shuffle=False, decode=None)))
    assert raw["image"]["path"] == "0.png"  # decode=None keeps the struct


# -- fields=: selection and alternatives for mixed extensions --------------------------------------


def test_fields_alternatives_give_one_field_for_mixed_image_extensions(tmp_path):
    """A folder of .jpg and .png images packs into samples with different fields; ``fields=["jpg;png",
    "cls"]`` (webdataset's syntax) gives every sample the same fields, so batches are tensors, not
    lists padded with None."""
    import shardstream as ss

    root = tmp_path / "images"
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            (root / label / f"{label}{i}.jpg").write_bytes(jpeg_bytes())
            (root / label / f"{label}{i}p.png").write_bytes(png_bytes())
    ss.pack(root, tmp_path / "ds", progress=False)
    plain = next(iter(ss.ShardDataset(str(tmp_path / "ds"), batch_size=12, shuffle=False)))
    assert isinstance(plain["jpg"], list) and None in plain["jpg"]  # the trap this option closes
    ds = ss.ShardDataset(str(tmp_path / "ds"), batch_size=12, fields=["jpg;png", "cls"])
    batch = next(iter(ds))
    assert set(batch) == {"__key__", "jpg", "cls"}
    assert (
        tuple(batch["jpg"].shape) == (12, 3, H, W)
        and sorted(batch["cls"].tolist()) == [0] * 6 + [1] * 6
    )
    renamed = ss.ShardDataset(
        str(tmp_path / "ds"),
        decode={"image": "numpy", "*": "torch"},
        fields={"image": "jpg;png", "label": "cls"},
        shuffle=False,
    )
    sample = next(iter(renamed))
    assert set(sample) == {"__key__", "image", "label"} and sample["image"].shape == (H, W, 3)


def test_fields_names_case_insensitively_and_refuses_bad_specs():
    assert Decoder(None, ["JPG;Png"])({"__key__": "k", "png": b"p", "cls": b"1"}) == {
        "__key__": "k",
        "jpg": b"p",
    }
    for bad in ("jpg;png", [""], [";"], {"image": 3}, []):
        with pytest.raises(ShardstreamError, match="fields"):
            Decoder(None, bad)


def test_a_sample_without_any_alternative_is_a_decode_error_that_skip_skips(tmp_path):
    from shardstream import ShardDataset, ShardWriter

    with pytest.raises(
        DecodeError, match=r"no field 'jpg;png' for 'jpg' \(the sample has \['txt'\]\)"
    ):
        Decoder(None, ["jpg;png"])({"__key__": "k", "txt": b"t"})
    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=3) as w:
        for i in range(6):
            w.write({"__key__": f"{i:03d}", ("png" if i != 4 else "txt"): png_bytes()})
    ds = ShardDataset(str(tmp_path / "ds"), fields=["png"], on_error="skip", shuffle=False)
    assert len(list(ds)) == 6 and ds.skipped == 1
