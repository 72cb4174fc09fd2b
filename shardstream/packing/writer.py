"""``ShardWriter``: write samples (dicts) into a sharded dataset, manifest last."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import EncodeError, ShardstreamError, StorageError
from ..formats import tar as tar_format
from ..manifest import Manifest, creation_info
from ..manifest.files import sync_file
from ..manifest.image_sizes import ShardSizes, encode_image_sizes
from ..manifest.media_facts import encode_media_facts
from ..storage import Store, describe_os_error
from .destination import Claim, prepare_destination
from .fields import check_key, check_name, encode_field, merge_types
from .folder import write_index
from .rules import (
    DEFAULT_SHARD_SIZE,
    check_shard_limits,
    resolve_format,
    shard_is_full,
    warn_small_shards,
)

_ARROW_BATCH_BYTES = 8 << 20
_ARROW_BATCH_ROWS = 65536


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
    Keys of tar shards are relative paths that stay inside the folder ``tar -xf`` extracts
    to. With ``fsync`` (default) shards and manifest are on disk before they appear.
    ``index`` (default True): write each tar shard's sample index (``.shardstream/<shard>.idx``): readers
    check every value against its checksum there, open a shard without parsing its headers, and fetch
    single samples of uncompressed tars from object storage by ranged reads.

    Args:
        url: the dataset's folder (a local path or an fsspec URL).
        format: ``"tar"`` or ``"arrow"``.
        shard_size: the most uncompressed bytes in a shard (``"256MB"``, or an int).
        samples_per_shard: the most samples in a shard (default: no limit).
        compression: ``"zstd"`` or ``"gzip"`` for whole tar shards (default: none), ``"zstd"``
            (default) or ``"lz4"`` for the buffers of Arrow shards; ``"none"``: uncompressed.
        storage_options: fsspec options for ``url``.
        overwrite: replace a dataset already at ``url``.
        classes: class names to record in the manifest (``ds.manifest.classes`` when read).
        schema: the Arrow schema of the rows (``format="arrow"``); default: from the first samples.
        fsync: flush shards and manifest to disk before each appears.
        index: write sample indexes (default True; False: the tars alone, read without per-sample
            checksums).
        append: add to the dataset at ``url`` as its next version (not with ``overwrite``).
        image_sizes: record each image field's width and height, read from its header (never
            decoded), in a side file the manifest names (default True; see
            :mod:`shardstream.manifest.image_sizes`), and each video and audio field's facts from its
            container headers (:mod:`shardstream.manifest.media_facts`).
    """

    def __init__(  # noqa: PLR0913 - a public constructor: one keyword per setting, as webdataset's ShardWriter
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
        fsync: bool = True,
        index: bool = True,
        *,
        append: bool = False,
        image_sizes: bool = True,
        _claim: Claim
        | None = None,  # a pack's claim on the destination, taken before (packing.driver)
    ):
        self.shard_format, self.compression = resolve_format(format, compression)
        self.shard_size, self.samples_per_shard = check_shard_limits(shard_size, samples_per_shard)
        self.store = Store(url, storage_options) if _claim is None else _claim.store
        self.fsync = fsync
        self.claim = (
            prepare_destination(self.store, overwrite, fsync, append) if _claim is None else _claim
        )
        self.classes = list(classes) if classes is not None else None
        self.paths: list[str] = []
        self.samples: list[int] = []
        self.nbytes: list[int] = []
        self.sha256: list[str] = []
        self.index = index is not False and self.shard_format == "tar"
        self.index_sha256: list[str] = []
        self.image_sizes: list[ShardSizes] | None = [] if image_sizes else None
        self.field_counts: Counter[str] = Counter()
        self.field_types: dict[
            str, str
        ] = {}  # tar: what each field's values were (see fields.value_type)
        self.count = 0
        self._last_key: str | None = None
        self._cm = None
        self._shard = None
        self._shard_bytes = 0
        # pyarrow.Schema for Arrow shards; inferred from the first rows if None
        self._schema = schema
        self._rows: list[dict[str, Any]] = []
        self._rows_bytes = 0
        self.manifest: Manifest | None = None
        self._closed = False
        self._published = False

    @property
    def token(self) -> str:
        """This writer's run token, in its shards' names."""
        return self.claim.token

    # -- shard lifecycle ------------------------------------------------------------
    def _open_shard(self) -> None:
        name = self.claim.shard_name(len(self.paths), self.shard_format)
        self._cm = self.store.open_write(name)
        sink = self._sink = self._cm.__enter__()
        if self.shard_format == "arrow":
            self._shard = None  # opened with the first batch, once the schema is known
        else:
            self._shard = tar_format.TarShardWriter(sink, self.compression, index=self.index)
        self.paths.append(name)
        if self.image_sizes is not None:
            self.image_sizes.append(ShardSizes())
        self._shard_samples = 0
        self._shard_bytes = 0

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa

        from ..formats import arrow as arrow_format
        from ..formats.hf_features import in_struct, wrap

        names = (
            list(self._schema.names)
            if self._schema is not None
            else list(dict.fromkeys(name for row in self._rows for name in row))
        )
        extra = {name for row in self._rows for name in row} - set(names)
        if extra:
            raise EncodeError(
                f"fields {sorted(extra)} are not in this dataset's Arrow schema ({', '.join(names)}); "
                "give every sample the same fields"
            )
        try:
            columns: dict[str, Any] = {
                name: [row.get(name) for row in self._rows] for name in names
            }
            # a folder's images, in Hugging Face Image structs (formats.hf_features)
            for name in in_struct(self._schema) if self._schema is not None else ():
                columns[name] = wrap(columns[name])
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

    @contextlib.contextmanager
    def _shard_errors(self) -> Iterator[None]:
        """OS errors of the open shard's file (no space, quota, I/O errors: they carry no file name) as the
        one-line :class:`StorageError` naming the shard and the fix that every other writer gives."""
        try:
            yield
        except OSError as exc:
            if exc.filename is not None or not self.paths:
                raise
            raise StorageError(
                f"cannot write {self.store.url_of(self.paths[-1])}: {describe_os_error(exc)}"
            ) from exc

    def _close_shard(self) -> None:
        if self.shard_format == "arrow":
            self._flush_rows()
        nbytes, digest = self._shard.close()
        if self.fsync:
            sync_file(self.store, self._sink, self.paths[-1])
        self._cm.__exit__(None, None, None)
        if self.index:
            self.index_sha256.append(
                write_index(self.store, self.paths[-1], self._shard.index, self.fsync)
            )
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
            raise EncodeError(
                f"sample key {key!r} repeats the previous sample's key; keys must differ"
            )
        fields = {k: v for k, v in sample.items() if not k.startswith("__")}
        if not fields:
            raise EncodeError(
                f"sample {key!r} has no fields; give at least one, e.g. {{'txt': ...}}"
            )
        if self.shard_format == "arrow":
            row = {"__key__": key, **fields}
            size = _row_bytes(row)
        else:
            encoded = [(name, encode_field(key, name, fields[name])) for name in sorted(fields)]
            for name, _ in encoded:
                check_name(name, f"sample {key!r}: field name")
            size = tar_format.sample_size(key, ((n, len(memoryview(d))) for n, d in encoded))
        with self._shard_errors():
            if self._cm is not None and shard_is_full(
                self._shard_bytes,
                self._shard_samples,
                size,
                self.shard_size,
                self.samples_per_shard,
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
                merge_types(self.field_types, fields)
            if self.image_sizes is not None:
                self.image_sizes[-1].add(
                    encoded if self.shard_format != "arrow" else fields.items()
                )
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
            with self._shard_errors():
                self._close_shard()
        if self.shard_format == "arrow":
            from ..formats import arrow as arrow_format

            fields = arrow_format.describe_schema(self._schema) if self._schema is not None else []
            schema = arrow_format.schema_to_text(self._schema) if self._schema is not None else None
        else:
            fields = [
                {"name": n, "type": self.field_types.get(n, "bytes"), "samples": c}
                for n, c in sorted(self.field_counts.items())
            ]
            schema = None
        self.manifest = Manifest(
            shard_format=self.shard_format,
            paths=self.paths,
            stored_counts=self.samples,
            nbytes=self.nbytes,
            sha256=self.sha256,
            fields=fields,
            classes=self.classes,
            arrow_schema=schema,
            created=creation_info(writer="ShardWriter"),
            **({"index_sha256": self.index_sha256} if self.index else {}),
            image_sizes=None if self.image_sizes is None else encode_image_sizes(self.image_sizes),
            media=None
            if self.image_sizes is None
            else encode_media_facts([s.media for s in self.image_sizes]),
        )
        warn_small_shards(self.manifest, self.shard_size)
        self._closed = True
        return self.manifest

    def close(self) -> Manifest:
        """Finish the last shard and publish the manifest (once). Returns the manifest. Raises
        :class:`~shardstream.packing.destination.DestinationLost`, having removed this writer's shards, if
        another writer claimed or published the destination meanwhile."""
        if not self._published:
            try:
                manifest = self.finish()
            except BaseException:
                self.abort()
                raise
            self.manifest = self.claim.publish(manifest)
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
