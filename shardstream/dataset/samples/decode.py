"""Decoders by field extension: images, video, audio, class labels, text, JSON, numpy and torch files.

The last part of a field's name picks the decoder (``seg.png`` decodes as PNG).
Images become PIL images, numpy HWC uint8 RGB arrays or torch CHW uint8 RGB tensors;
JPEGs go through ``simplejpeg`` when it is installed (the ``fast`` extra), which is
about 1.7x Pillow here. Video and audio fields (``mp4``, ``wav``, ...) become tensors through
:mod:`.media` (PyAV, the ``media`` extra) under ``"torch"`` and arrays under ``"numpy"``; ``"pil"``
keeps their bytes. Fields with other extensions stay ``bytes``.
"""

from __future__ import annotations

import functools
import io
import json
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...errors import CorruptShardError, ShardstreamError, UsageError
from ...formats.media_header import media_kind
from .media import DEFAULT_AUDIO, DEFAULT_VIDEO, MediaClip, clip_fraction

IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif", "tif", "tiff"}
)
MODES = ("pil", "numpy", "torch")

try:  # the optional fast JPEG decoder
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - depends on the installed extras
    _simplejpeg = None

DecodeSpec = str | None | Callable[[dict[str, Any]], dict[str, Any]] | Mapping[str, Any]
FieldSpec = Mapping[str, str] | list[str] | tuple[str, ...] | None


def decoder_libraries(field_names: Iterable[str], mode: str | None) -> dict[str, str]:
    """Which library (and its version) decodes each image, video and audio field under ``mode``
    (``"pil"``, ``"numpy"``, ``"torch"`` or None): what a measured rate depends on; empty for None."""
    from importlib.metadata import PackageNotFoundError, version

    def named(package: str, label: str) -> str:
        try:
            return f"{label} {version(package)}"
        except PackageNotFoundError:
            return f"{label} (not installed)"

    if mode is None:
        return {}
    out = {}
    for name in field_names:
        ext = name.rsplit(".", 1)[-1].lower()
        if media_kind(ext) is not None and mode != "pil":
            out[name] = named("av", "PyAV")
        elif ext in ("jpg", "jpeg") and mode != "pil" and _simplejpeg is not None:
            out[name] = named("simplejpeg", "simplejpeg")
        elif ext in IMAGE_EXTENSIONS:
            out[name] = named("pillow", "Pillow")
    return out


def parse_fields(spec: FieldSpec) -> dict[str, tuple[str, ...]] | None:
    """``fields=`` as output name -> the stored names to take it from, first present wins.

    A mapping renames (``{"image": "jpg;jpeg;png", "label": "cls"}``); a list selects, each entry
    named by its first alternative (``["jpg;png", "cls"]`` gives ``jpg`` and ``cls``), as
    WebDataset's ``rename`` and ``to_tuple`` read ``"jpg;png"``.
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        raise UsageError(
            f"fields={spec!r} must be a list of names or a mapping, not one string; "
            f"write fields=[{spec!r}]"
        )
    items = spec.items() if isinstance(spec, Mapping) else ((None, s) for s in spec)
    out: dict[str, tuple[str, ...]] = {}
    for name, alternatives in items:
        if not isinstance(alternatives, str) or not alternatives.strip(";"):
            raise UsageError(
                f'fields: {alternatives!r} is not a field name (alternatives as "jpg;png")'
            )
        names = tuple(a.strip().lower() for a in alternatives.split(";") if a.strip())
        out[name if name is not None else names[0]] = names
    if not out:
        raise UsageError("fields= names no field; leave it out to keep every field")
    return out


KNOWN = IMAGE_EXTENSIONS | {"cls", "cls2", "index", "id", "txt", "text", "json", "npy", "pth", "pt"}
_TYPED: dict[str, Callable[[bytes], Any]] = {
    "int": int,
    "float": float,
    "str": lambda b: b.decode("utf-8"),
    "bool": lambda b: {b"True": True, b"False": False}[b],
}


def written_types(manifest: Any) -> dict[str, str]:
    """Tar fields packed from numbers or text (a table's int and string columns): read back as such."""
    if manifest.shard_format in ("arrow", "parquet"):
        return {}
    return {
        f["name"]: f["type"]
        for f in manifest.fields
        if isinstance(f, dict) and "name" in f and "type" in f
    }


class DecodeError(ShardstreamError):
    """A field's bytes do not decode as its extension says."""


def default_clip(ext: str) -> MediaClip | None:
    """What ``decode="torch"`` decodes a field of extension ``ext`` with: video fields with
    :data:`~.media.DEFAULT_VIDEO` (16 frames at the video's rate, a random start), audio fields with
    :data:`~.media.DEFAULT_AUDIO` (the whole recording, mono, at its own rate); None for others."""
    kind = media_kind(ext)
    return DEFAULT_VIDEO if kind == "video" else DEFAULT_AUDIO if kind == "audio" else None


@functools.lru_cache(maxsize=1024)
def extension(field: str) -> str:
    """The part of a field name that picks its decoder (worked out once per name, not per sample)."""
    return field.rsplit(".", 1)[-1].lower()


def _image_array(data: bytes, ext: str, writable: bool = True):
    import numpy as np

    if _simplejpeg is not None and ext in ("jpg", "jpeg"):
        try:
            return _simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:
            pass  # an odd JPEG (CMYK, say): Pillow below
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        # asarray is one copy but read-only; only a batch that copies it again may take that
        return np.array(rgb) if writable else np.asarray(rgb)


class PendingJpeg:
    """A JPEG whose decoding waits for its batch, which it is decoded straight into (simplejpeg's
    ``buffer=``): no image buffer of its own, no copy into the batch. ``shape``: (H, W, 3), from
    its header; ``where`` names it in errors."""

    __slots__ = ("data", "shape", "where")
    # this process's time decoding pending JPEGs (counted as decoding by the stage timers)
    decode_ns = 0

    def __init__(self, data: bytes, shape: tuple[int, int, int]):
        self.data, self.shape, self.where = data, shape, "a JPEG"

    @staticmethod
    def of(data: bytes) -> PendingJpeg | None:
        """A pending JPEG, or None when its header does not read (the usual decode then says why)."""
        try:
            height, width = _simplejpeg.decode_jpeg_header(data)[:2]
        except ValueError:
            return None
        return PendingJpeg(data, (height, width, 3))

    def decode_into(self, out: Any) -> None:
        """Decode into ``out``, a C-contiguous H x W x 3 uint8 array (a row of the batch)."""
        started = time.perf_counter_ns()
        try:
            try:
                done = _simplejpeg.decode_jpeg(self.data, colorspace="RGB", buffer=out)
                ok = done.shape == self.shape
            except ValueError:  # an odd JPEG (CMYK, say): Pillow
                done = _image_array(self.data, "pil-only", writable=False)
                ok = done.shape == self.shape
                if ok:
                    out[...] = done
            if not ok:
                raise ValueError(
                    f"it decodes to {done.shape[1]}x{done.shape[0]}, its header says "
                    f"{self.shape[1]}x{self.shape[0]}"
                )
        except Exception as exc:
            raise DecodeError(
                f"{self.where} does not decode ({type(exc).__name__}: {exc}); the shard holds a "
                "damaged image: re-pack it from good files, or read with on_error='skip'"
            ) from exc
        finally:
            PendingJpeg.decode_ns += time.perf_counter_ns() - started

    def decode(self) -> Any:
        """Decoded on its own, as ``decode_image`` would (a C x H x W tensor)."""
        import numpy as np
        import torch

        out = np.empty(self.shape, np.uint8)
        self.decode_into(out)
        return torch.from_numpy(out).permute(2, 0, 1)


def decode_image(data: bytes, ext: str, mode: str, writable: bool = True) -> Any:
    """An image as a PIL image, a numpy HWC uint8 RGB array, or a torch CHW uint8 RGB tensor.

    ``writable=False`` allows a read-only result, for a caller that only copies it (one copy less).
    """
    if mode == "pil":
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    array = _image_array(data, ext, writable)
    if mode == "numpy":
        return array
    import torch

    if not array.flags.writeable:
        # torch warns about read-only memory; the caller only copies it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.from_numpy(array).permute(2, 0, 1)
    return torch.from_numpy(array).permute(2, 0, 1)


def decode_value(
    data: bytes, ext: str, mode: str | None, writable: bool = True, jpegs_into_batch: bool = False
) -> Any:
    """One field's value from its bytes, by extension; ``mode=None`` keeps bytes. ``jpegs_into_batch``: a JPEG
    as a tensor may be a :class:`PendingJpeg`, for a batch to decode straight into its memory."""
    if mode is None:
        return data
    if jpegs_into_batch and mode == "torch" and ext in ("jpg", "jpeg") and _simplejpeg is not None:
        pending = PendingJpeg.of(data)
        if pending is not None:
            return pending
    if ext in IMAGE_EXTENSIONS:
        return decode_image(data, ext, mode, writable)
    if ext in ("cls", "cls2", "index", "id"):
        return int(bytes(data))
    if ext in ("txt", "text"):
        return bytes(data).decode("utf-8")
    if ext == "json":
        return json.loads(bytes(data))
    if ext == "npy":
        import numpy as np

        return np.load(io.BytesIO(data), allow_pickle=False)
    if ext in ("pth", "pt"):
        import torch

        return torch.load(io.BytesIO(data), weights_only=True)
    return data


class Decoder:
    """Decodes a sample dict in place of its bytes values.

    ``spec`` is ``"pil"``, ``"numpy"`` or ``"torch"`` (images as such, other known
    extensions decoded), ``None`` (bytes as stored), a callable taking and returning the
    whole sample, or a mapping from field name to a callable ``bytes -> value`` or a mode;
    fields the mapping does not name use its ``"*"`` entry, else ``"torch"``.
    """

    def __init__(
        self,
        spec: DecodeSpec = "torch",
        fields: FieldSpec = None,
        types: Mapping[str, str] | None = None,
    ):
        # tar fields the manifest says were written as numbers or text, where no extension says so
        self.types = {
            n: t for n, t in (types or {}).items() if t in _TYPED and extension(n) not in KNOWN
        }
        self.select = parse_fields(fields)  # applied after decoding: decoders see the stored names
        # a decode mapping may name a field by its output name: its stored alternatives use that entry
        self._alias = {
            s: out for out, alts in (self.select or {}).items() for s in alts if s != out
        }
        # set when results are only copied into a batch: read-only is fine
        self.collated = False
        self.jpegs_into_batch = False  # set when the default collate makes the batch: JPEGs decoded into it (PendingJpeg)
        self.whole: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        # with a sample's key, where a random media clip starts (begin_pass)
        self.seed = self.epoch = 0
        self.fields: dict[str, Any] = {}
        self.default: str | None = "torch"
        if callable(spec) and not isinstance(spec, Mapping):
            self.whole = spec
        elif isinstance(spec, Mapping):
            self.fields = dict(spec)
            self.default = self.fields.pop("*", "torch")
            for name, how in self.fields.items():
                if not (callable(how) or how is None or how in MODES):
                    raise UsageError(
                        f"decode[{name!r}] must be a callable, None or one of {MODES}, not {how!r}"
                    )
        else:
            self.default = spec
        if not (self.default is None or self.default in MODES):
            raise UsageError(
                f"decode must be one of {MODES}, None, a callable or a mapping, not {spec!r}"
            )
        self._checked = not self.fields

    def check_fields(self, have: list[str], where: str) -> None:
        """Refuse, when the dataset is made, names in ``decode={...}`` and ``fields=`` that its manifest's
        fields ``have`` do not hold (``where`` names the dataset): a typo would otherwise fail at the first
        batch, or fail every sample, which ``on_error="skip"`` would skip. No fields listed: not checked."""
        if not have:
            return
        listed = [name for name in have if not name.startswith("__")]
        unknown = self._unknown_names(have)
        if unknown:
            raise UsageError(
                f"{where}: decode={{...}} names fields {unknown}, which the dataset does not have; "
                f'its fields are {listed} (use "*" for the default)'
            )
        # a decode function may make fields of its own
        if self.select is not None and self.whole is None:
            missing = [
                ";".join(alts) for alts in self.select.values() if not any(a in have for a in alts)
            ]
            if missing:
                raise UsageError(
                    f"{where}: fields= asks for {missing}, which the dataset does not have; its "
                    f"fields are {listed}"
                )

    def _check_names(self, sample: dict[str, Any]) -> None:
        """Mapping entries the first sample has no field for are a typo, refused (every sample fails
        until one has them, so ``on_error="skip"`` finds no sample to stand in and raises too)."""
        unknown = self._unknown_names(sample)
        if unknown:
            have = [name for name in sample if not name.startswith("__")]
            raise UsageError(
                f"decode={{...}} names fields {unknown}, which the samples do not have; "
                f'their fields are {have} (use "*" for the default)'
            )
        self._checked = True

    def _unknown_names(self, have: Any) -> list[str]:
        """The decode mapping's names that are neither among ``have`` nor an output name of ``fields=``."""
        unknown = [name for name in self.fields if name not in have]
        if self.select is not None:
            stored = {name for names in self.select.values() for name in names}
            unknown = [name for name in unknown if name not in self.select or name in stored]
        return unknown

    def clip_for(self, name: str) -> MediaClip | None:
        """The media clip that decodes field ``name`` (as :meth:`_field` picks it), or None: a field a
        clip decodes may come as a seekable file instead of its bytes."""
        if self.whole is not None or name.startswith("__"):
            return None
        how = self.fields.get(name, self.fields.get(self._alias.get(name, name), self.default))
        if isinstance(how, MediaClip):
            return how
        if how in ("torch", "numpy") and name not in self.types:
            return default_clip(extension(name))
        return None

    @property
    def keeps_bytes(self) -> bool:
        """Whether every field stays as stored (``decode=None``)."""
        return (
            self.whole is None
            and self.default is None
            and self.select is None
            and all(how is None for how in self.fields.values())
        )

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The decoded sample. Any failure, in a built-in decoder or in the user's decode functions
        (whose job is parsing bytes that may be damaged), is a :class:`DecodeError`: bad data, which
        ``on_error="skip"`` skips."""
        if self.whole is not None:
            try:
                out = self.whole(sample)
            except Exception as exc:
                raise DecodeError(
                    f"the decode function raised {type(exc).__name__}: {exc}"
                ) from exc
            return out if self.select is None else self._selected(out)
        if not self._checked:
            self._check_names(sample)
        out: dict[str, Any] = {}
        for name, value in sample.items():
            how = self.fields.get(name, self.fields.get(self._alias.get(name, name), self.default))
            if name.startswith("__") or not isinstance(
                value, (bytes, bytearray, memoryview, io.RawIOBase)
            ):
                out[name] = self._not_bytes(name, value, how, sample)
            else:
                out[name] = self._bytes_field(name, value, how, sample)
        return out if self.select is None else self._selected(out)

    def _not_bytes(self, name: str, value: Any, how: Any, sample: dict[str, Any]) -> Any:
        """A value that is not bytes: the user's callable takes it as it is; a Hugging Face ``Image`` or
        ``Audio`` value (``{"bytes", "path"}``) decodes by its path's suffix (a media clip given for
        the field takes its bytes); anything else stays as it is."""
        struct = how is not None and _is_file_struct(value)
        if callable(how) and not (struct and isinstance(how, MediaClip)):
            return _call_field(name, how, value)  # named by the user: theirs, whatever its type
        if not struct:
            return value
        ext = _suffix(value.get("path")) or extension(name)
        if ext in IMAGE_EXTENSIONS:
            return _call_field(name, lambda v: decode_image(v["bytes"], ext, how), value)
        if isinstance(how, MediaClip) or (how in ("torch", "numpy") and media_kind(ext)):
            return self._bytes_field(name, value["bytes"], how, sample, ext)
        return value

    def _bytes_field(
        self, name: str, value: Any, how: Any, sample: dict[str, Any], ext: str | None = None
    ) -> Any:
        """:meth:`_field`, its failures a :class:`DecodeError` naming the field (a UsageError as it is)."""
        try:
            return self._field(name, value, how, sample, ext)
        except (UsageError, CorruptShardError):  # a damaged block of a field read by blocks
            raise
        except Exception as exc:  # decoders raise many types; the caller adds shard and sample
            by = "the decoder given for it raised " if callable(how) else ""
            raise DecodeError(
                f"field {name!r} does not decode ({by}{type(exc).__name__}: {exc})"
            ) from exc

    def begin_pass(self, seed: int, epoch: int) -> None:
        """The seed and epoch that, with each sample's key, fix where random media clips start."""
        self.seed, self.epoch = int(seed), int(epoch)

    def _field(
        self, name: str, value: Any, how: Any, sample: dict[str, Any], ext: str | None = None
    ) -> Any:
        """One bytes field decoded by ``how``: a media clip, a callable, a mode (or None: as stored);
        ``ext``: what picks its decoder, when not the field's name."""
        ext = ext or extension(name)
        clip = how if isinstance(how, MediaClip) else None
        if clip is None and how in ("torch", "numpy") and name not in self.types:
            clip = default_clip(ext)
        if clip is not None:
            fraction = clip_fraction(self.seed, self.epoch, sample.get("__key__"))
            try:
                decoded = clip.decode(value, fraction)
            except ImportError as exc:  # not the data's fault: never skipped
                raise UsageError(
                    f"field {name!r}: {exc}, or decode={{{name!r}: None}} to keep its bytes"
                ) from None
            return decoded.numpy() if how == "numpy" else decoded
        if callable(how):
            return how(value)
        if how is not None and name in self.types:
            return _TYPED[self.types[name]](bytes(value))
        return decode_value(value, ext, how, not self.collated, self.jpegs_into_batch)

    def _selected(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The fields ``fields=`` asks for, under their output names, plus the ``__key__``-style entries.
        A sample with none of a field's alternatives is bad data (a :class:`DecodeError`)."""
        out = {name: value for name, value in sample.items() if name.startswith("__")}
        assert self.select is not None
        for name, alternatives in self.select.items():
            for stored in alternatives:
                if stored in sample:
                    out[name] = sample[stored]
                    break
            else:
                have = [n for n in sample if not n.startswith("__")]
                raise DecodeError(
                    f"no field {';'.join(alternatives)!r} for {name!r} (the sample has {have})"
                )
        return out


def _is_file_struct(value: Any) -> bool:
    """A Hugging Face ``Image``/``Audio`` value as Arrow stores it: ``{"bytes": ..., "path": ...}``."""
    return isinstance(value, dict) and isinstance(
        value.get("bytes"), (bytes, bytearray, memoryview)
    )


def _suffix(path: Any) -> str:
    return (
        path.rsplit("/", 1)[-1].rpartition(".")[2].lower()
        if isinstance(path, str) and "." in path
        else ""
    )


def _call_field(name: str, how: Callable[[Any], Any], value: Any) -> Any:
    try:
        return how(value)
    except Exception as exc:  # the caller adds shard and sample
        raise DecodeError(f"field {name!r} does not decode ({type(exc).__name__}: {exc})") from exc
