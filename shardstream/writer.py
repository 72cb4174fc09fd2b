"""``ShardWriter``: write samples (dicts) into a sharded dataset, manifest last.

Also the pieces the parallel packer shares with it: field encoding, the shard-size
rule and destination preparation.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from .errors import DatasetExistsError, EncodeError, ShardstreamError, StorageError
from .formats import tar as tar_format
from .manifest import MANIFEST_NAME, Manifest, creation_info, shard_name, write_manifest
from .sizes import parse_size
from .storage import Store

DEFAULT_SHARD_SIZE = "256MB"
_SHARD_FILE = re.compile(r"^shard-\d{6}\.(tar|tar\.zst|tar\.gz|arrow)$")
_TEMP_FILE = re.compile(r"^\..*\.[0-9a-f]{8}\.tmp$")
# Present from the moment shardstream starts writing shards into a folder until its manifest
# is published: it marks leftover shards as ours, safe to replace on the next attempt.
IN_PROGRESS = ".shardstream-writing"
_ARROW_BATCH_BYTES = 8 << 20
_ARROW_BATCH_ROWS = 65536


def resolve_format(format: str, compression: str | None) -> tuple[str, str | None]:
    """(shard format, compression) from the user's ``format`` and ``compression``.

    ``compression=None`` means the format's default: none for tar, zstd buffers for Arrow.
    """
    if format not in ("tar", "arrow"):
        raise ShardstreamError(f"unknown format {format!r}; use 'tar' or 'arrow'")
    comp = None if compression in (None, "none") else compression
    if format == "tar":
        if comp not in (None, "zstd", "gzip"):
            raise ShardstreamError(f"tar shards take compression 'zstd', 'gzip' or 'none', not {compression!r}")
        return {None: "tar", "zstd": "tar.zst", "gzip": "tar.gz"}[comp], comp
    if compression is None:
        comp = "zstd"
    if comp not in (None, "zstd", "lz4"):
        raise ShardstreamError(f"arrow shards take compression 'zstd', 'lz4' or 'none', not {compression!r}")
    return "arrow", comp


def check_shard_limits(shard_size: int | str | None, samples_per_shard: int | None) -> tuple[int, int | None]:
    """Validated (bytes, samples) limits of one shard."""
    size = parse_size(shard_size if shard_size is not None else DEFAULT_SHARD_SIZE)
    if samples_per_shard is not None and (isinstance(samples_per_shard, bool) or int(samples_per_shard) <= 0):
        raise ShardstreamError(f"samples per shard must be a positive integer, not {samples_per_shard!r}")
    return size, None if samples_per_shard is None else int(samples_per_shard)


def shard_is_full(shard_bytes: int, shard_samples: int, next_bytes: int, limit: int, per_shard: int | None) -> bool:
    """The one rule for starting a new shard: the next sample would not fit (a shard is never empty)."""
    if shard_samples == 0:
        return False
    if per_shard is not None and shard_samples >= per_shard:
        return True
    return shard_bytes + next_bytes + len(tar_format.END_OF_ARCHIVE) > limit


def claim_destination(store: Store, overwrite: bool) -> None:
    """Refuse a destination that holds a dataset unless ``overwrite``; then retract its manifest.

    The old manifest goes first, so nobody reads a half-replaced dataset.
    """
    if store.local and os.path.exists(store.root) and not os.path.isdir(store.root):
        raise StorageError(f"{store.url} is a file; the destination must be a folder")
    if store.exists(MANIFEST_NAME):
        if not overwrite:
            raise DatasetExistsError(
                f"{store.url} already holds a dataset ({MANIFEST_NAME}); pass --overwrite "
                "(overwrite=True) to replace it, or choose another destination"
            )
        store.remove(MANIFEST_NAME)


def prepare_destination(store: Store, overwrite: bool) -> None:
    """Make ``store`` ready for new shards: claim it, then clear what an interrupted
    shardstream run left there (its shards and temporary files).

    Shard-named files that no shardstream run left behind (WebDataset tars, say) are
    only replaced with ``overwrite``.
    """
    claim_destination(store, overwrite)
    store.makedirs()
    names = store.list_files()
    shards = [n for n in names if _SHARD_FILE.match(n)]
    if shards and not overwrite and IN_PROGRESS not in names:
        raise DatasetExistsError(
            f"{store.url} holds shard files that shardstream did not leave there ({shards[0]}, ...); "
            "pass --overwrite (overwrite=True) to replace them, or choose another destination"
        )
    store.write_bytes(IN_PROGRESS, b"")
    for name in names:
        if _SHARD_FILE.match(name) or _TEMP_FILE.match(name):
            store.remove(name)


def publish(store: Store, manifest: Manifest) -> None:
    """Write the manifest (last, atomically): the shards in ``store`` become a dataset."""
    write_manifest(store, manifest)
    store.remove(IN_PROGRESS)


def _check_name(name: str, what: str) -> None:
    if "\0" in name:
        raise EncodeError(f"{what} {name!r} contains a NUL character, which tar names cannot hold; remove it")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError(f"{what} {name!r} is not valid Unicode (a lone surrogate?); fix the name") from None


def check_key(key: str, fmt: str) -> str:
    """A sample key that WebDataset readers split the same way we do."""
    if not isinstance(key, str) or not key:
        raise EncodeError(f"sample key {key!r} must be a non-empty string")
    _check_name(key, "sample key")
    if fmt.startswith("tar"):
        base = key.rsplit("/", 1)[-1]
        if "." in base or not base:
            raise EncodeError(
                f"sample key {key!r}: the part after the last '/' must be non-empty and contain no '.', "
                "since tar readers take the first '.' as the start of the field name; rename the key"
            )
    return key


def encode_field(key: str, field: str, value: Any) -> bytes | memoryview:
    """The bytes stored for ``field`` of sample ``key`` in a tar shard.

    bytes-likes are stored as they are; ``str`` as UTF-8; numbers as text; dicts and lists
    as JSON (for ``*json`` fields); numpy arrays as ``.npy`` (for ``*npy``); torch tensors
    with ``torch.save`` (for ``*pth``/``*pt``); PIL images encoded by the field's extension.
    """
    try:
        return _encode(key, field, value)
    except EncodeError:
        raise
    except Exception as exc:  # encoders (json, numpy, torch, Pillow) raise many types
        raise EncodeError(f"sample {key!r}, field {field!r}: cannot encode the {type(value).__name__}: {exc}") from exc


def _encode(key: str, field: str, value: Any) -> bytes | memoryview:
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, memoryview):
        return value.cast("B") if value.c_contiguous else value.tobytes()
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, int, float)):
        return str(value).encode()
    ext = field.rsplit(".", 1)[-1].lower()
    if type(value).__module__ == "numpy":  # imported only when given numpy values
        import numpy as np

        if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.void)):
            return str(value.item()).encode()
    if isinstance(value, (dict, list, tuple)) and ext == "json":
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray" and ext == "npy":
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if type(value).__module__.startswith("torch") and ext in ("pth", "pt"):
        import torch

        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    if type(value).__module__.startswith("PIL.") and hasattr(value, "save"):
        kind = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP", "tiff": "TIFF"}.get(ext)
        if kind:
            buf = io.BytesIO()
            value.save(buf, format=kind)
            return buf.getvalue()
    raise EncodeError(
        f"sample {key!r}, field {field!r}: cannot store a {type(value).__name__} under this name; "
        "give bytes or str, a dict/list in a '.json' field, a numpy array in '.npy', a tensor in "
        "'.pth', or a PIL image in '.jpg'/'.png'"
    )


def _row_bytes(row: Mapping[str, Any]) -> int:
    total = 0
    for v in row.values():
        total += len(v) if isinstance(v, (bytes, bytearray, str)) else 8
    return total


class ShardWriter:
    """Write samples into ``url`` as shards plus a manifest, like ``webdataset.ShardWriter``.

    Each sample is a dict: an optional ``__key__`` and one entry per field (the tar
    member's extension, or the Arrow column; give ``schema`` (a ``pyarrow.Schema`` with a
    ``__key__`` string column) when the first samples do not show every field and type).
    A new shard starts when the next sample
    would take the shard past ``shard_size`` bytes (uncompressed) or ``samples_per_shard``
    samples. The manifest is written by :meth:`close` (or leaving the ``with`` block
    without an error), never when the block raises: no half-written dataset is visible.
    """

    def __init__(
        self,
        url: str,
        format: str = "tar",
        shard_size: int | str = DEFAULT_SHARD_SIZE,
        samples_per_shard: int | None = None,
        compression: str | None = None,
        storage_options: dict[str, Any] | None = None,
        overwrite: bool = False,
        classes: list[str] | None = None,
        schema: Any = None,
    ):
        self.shard_format, self.compression = resolve_format(format, compression)
        self.shard_size, self.samples_per_shard = check_shard_limits(shard_size, samples_per_shard)
        self.store = Store(url, storage_options)
        prepare_destination(self.store, overwrite)
        self.classes = list(classes) if classes is not None else None
        self.paths: list[str] = []
        self.samples: list[int] = []
        self.nbytes: list[int] = []
        self.sha256: list[str] = []
        self.field_counts: Counter[str] = Counter()
        self.count = 0
        self._last_key: str | None = None
        self._cm = None
        self._shard = None
        self._shard_bytes = 0
        self._schema = schema  # pyarrow.Schema for Arrow shards; inferred from the first rows if None
        self._rows: list[dict[str, Any]] = []
        self._rows_bytes = 0
        self.manifest: Manifest | None = None
        self._closed = False
        self._published = False

    # -- shard lifecycle ------------------------------------------------------------
    def _open_shard(self) -> None:
        name = shard_name(len(self.paths), self.shard_format)
        self._cm = self.store.open_write(name)
        sink = self._cm.__enter__()
        if self.shard_format == "arrow":
            self._shard = None  # opened with the first batch, once the schema is known
            self._sink = sink
        else:
            self._shard = tar_format.TarShardWriter(sink, self.compression)
        self.paths.append(name)
        self._shard_samples = 0
        self._shard_bytes = 0

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa

        from .formats import arrow as arrow_format
        names = list(self._schema.names) if self._schema is not None else list(
            dict.fromkeys(name for row in self._rows for name in row)
        )
        extra = {name for row in self._rows for name in row} - set(names)
        if extra:
            raise EncodeError(
                f"fields {sorted(extra)} are not in this dataset's Arrow schema ({', '.join(names)}); "
                "give every sample the same fields"
            )
        try:
            columns = {name: [row.get(name) for row in self._rows] for name in names}
            batch = pa.RecordBatch.from_pydict(columns, schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            first, last = self._rows[0].get("__key__"), self._rows[-1].get("__key__")
            raise EncodeError(
                f"samples {first!r}..{last!r} do not fit the Arrow schema {self._schema or 'inferred so far'}: "
                f"{exc}; give every sample the same fields and types"
            ) from exc
        if self._schema is None:
            self._schema = batch.schema
        if self._shard is None:
            self._shard = arrow_format.ArrowShardWriter(self._sink, self._schema, self.compression)
        self._shard.add_batch(batch)
        self._rows, self._rows_bytes = [], 0

    def _close_shard(self) -> None:
        if self.shard_format == "arrow":
            self._flush_rows()
        nbytes, digest = self._shard.close()
        self._cm.__exit__(None, None, None)
        self.samples.append(self._shard_samples)
        self.nbytes.append(nbytes)
        self.sha256.append(digest)
        self._cm = self._shard = None

    # -- public API -----------------------------------------------------------------
    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample."""
        if self._closed:
            raise ShardstreamError("this ShardWriter is closed")
        key = sample.get("__key__")
        key = check_key(f"{self.count:09d}" if key is None else key, self.shard_format)
        if key == self._last_key:
            raise EncodeError(f"sample key {key!r} repeats the previous sample's key; keys must differ")
        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
        if not fields:
            raise EncodeError(f"sample {key!r} has no fields; give at least one, e.g. {{'txt': ...}}")
        if self.shard_format == "arrow":
            row = {"__key__": key, **fields}
            size = _row_bytes(row)
        else:
            encoded = [(name, encode_field(key, name, fields[name])) for name in sorted(fields)]
            for name, _ in encoded:
                if not name or "/" in name:
                    raise EncodeError(f"sample {key!r}: field name {name!r} must be non-empty without '/'")
                _check_name(name, f"sample {key!r}: field name")
            size = tar_format.sample_size(key, ((n, len(memoryview(d))) for n, d in encoded))
        if self._cm is not None and shard_is_full(
            self._shard_bytes, self._shard_samples, size, self.shard_size, self.samples_per_shard
        ):
            self._close_shard()
        if self._cm is None:
            self._open_shard()
        if self.shard_format == "arrow":
            self._rows.append(row)
            self._rows_bytes += size
            if self._rows_bytes >= _ARROW_BATCH_BYTES or len(self._rows) >= _ARROW_BATCH_ROWS:
                self._flush_rows()
        else:
            self._shard.add(key, encoded)
        self.field_counts.update(fields.keys())
        self._shard_bytes += size
        self._shard_samples += 1
        self._last_key = key
        self.count += 1

    def finish(self) -> Manifest:
        """Finish the last shard and return the manifest, without publishing it."""
        if self.manifest is not None:
            return self.manifest
        if self._cm is not None:
            self._close_shard()
        if self.shard_format == "arrow":
            from .formats import arrow as arrow_format

            fields = arrow_format.describe_schema(self._schema) if self._schema is not None else []
            schema = arrow_format.schema_to_text(self._schema) if self._schema is not None else None
        else:
            fields = [{"name": n, "type": "bytes", "samples": c} for n, c in sorted(self.field_counts.items())]
            schema = None
        self.manifest = Manifest(
            shard_format=self.shard_format,
            paths=self.paths,
            samples=self.samples,
            nbytes=self.nbytes,
            sha256=self.sha256,
            fields=fields,
            classes=self.classes,
            arrow_schema=schema,
            created=creation_info(writer="ShardWriter"),
        )
        self._closed = True
        return self.manifest

    def close(self) -> Manifest:
        """Finish the last shard and publish the manifest (once). Returns the manifest."""
        if not self._published:
            try:
                manifest = self.finish()
            except BaseException:
                self.abort()
                raise
            publish(self.store, manifest)
            self._published = True
        assert self.manifest is not None
        return self.manifest

    def abort(self) -> None:
        """Stop without publishing: the open shard's temporary file is removed, no manifest."""
        if self._cm is not None:
            with contextlib.suppress(ShardstreamError):
                self._cm.__exit__(ShardstreamError, ShardstreamError("aborted"), None)
            self._cm = self._shard = None
        self._closed = True

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
