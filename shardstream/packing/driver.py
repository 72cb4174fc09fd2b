"""``pack``: turn a folder tree or a table into a sharded dataset, in parallel, deterministically."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ShardstreamError
from ..manifest import Manifest, creation_info
from ..sizes import count, format_size
from ..sources import FolderSource, TableSource, open_source, sample_permutation
from ..sources.remote import is_remote
from ..storage import Store
from .destination import Claim, check_written, prepare_destination
from .engine import Execution, default_workers, progress_bar, run_jobs
from .folder import ShardJob, ShardResult, check_sample_names, plan_shards, read_file, write_shard
from .rules import DEFAULT_SHARD_SIZE, ShardSpec, check_shard_limits, resolve_format, warn_small_shards
from .writer import ShardWriter


@dataclass
class PackResult:
    """What a pack produced, and how fast."""

    url: str
    manifest: Manifest
    seconds: float
    skipped_hidden: int = 0
    source_bytes: int | None = None  # a folder's file bytes: what the progress bar counts

    @property
    def fingerprint(self) -> str:
        """sha256 of the dataset's contents (shards, counts, fields, classes), not of its creation info:
        equal for two packs of the same source, whose manifests differ in their creation time."""
        return self.manifest.fingerprint

    @property
    def samples(self) -> int:
        return self.manifest.num_samples

    @property
    def shards(self) -> int:
        return self.manifest.num_shards

    @property
    def nbytes(self) -> int:
        return self.manifest.total_bytes

    def summary(self) -> str:
        if self.manifest.shard_format == "tokens":  # documents and tokens, not samples
            from .tokens import summary

            return summary(self.url, self.manifest, self.seconds)
        rate = self.nbytes / self.seconds / 1e6 if self.seconds > 0 else float("inf")
        files = "" if self.source_bytes is None else f" (from {format_size(self.source_bytes)} of files)"
        line = (
            f"packed {count(self.samples, 'sample')} into {count(self.shards, self.manifest.shard_format + ' shard')}, "
            f"{format_size(self.nbytes)}{files} in {self.seconds:.2f} s ({rate:.1f} MB/s) -> {self.url}"
        )
        layout = (self.manifest.created or {}).get("layout")
        classes = self.manifest.classes
        if layout:
            line += f"; layout {layout}" + ("" if classes is None else f", {count(len(classes), 'class', 'classes')}")
        if self.skipped_hidden:
            line += f" (skipped {self.skipped_hidden} hidden files and folders)"
        return line


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """No cyclic garbage collection inside the block: listing and planning a folder make a few hundred
    thousand objects and no cycles, and the collector's passes over them took a tenth of the listing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check_not_inside(source: str, store: Store) -> None:
    if is_remote(source):
        if store.url == source.rstrip("/") or store.url.startswith(source.rstrip("/") + "/"):
            raise ShardstreamError(f"destination {store.url} is inside the source {source}; choose one outside it")
        return
    if not store.local:
        return
    src, dst = os.path.realpath(source), os.path.realpath(store.root)
    if dst == src or dst.startswith(src.rstrip(os.sep) + os.sep):
        raise ShardstreamError(f"destination {store.root} is inside the source {source}; choose a folder outside it")


def pack(  # noqa: PLR0913 - the public pack: one keyword per setting, as the command's options
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    samples_per_shard: int | None = None,
    compression: str | None = None,
    workers: int | None = None,
    layout: str = "auto",
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
    fsync: bool = True,
    shuffle: bool = True,
    seed: int = 0,
    split_by: str | None = None,
    fn: Callable[[Any], Any] | None = None,
    fields: Sequence[str] | None = None,
    field_name: str | None = None,
    decode_value: Callable[[bytes, bytes], Any] | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    source_options: dict[str, Any] | None = None,
    index: bool | None = None,
    _source: FolderSource | None = None,
    **token_options: Any,
) -> PackResult:
    """Pack ``source`` (a folder tree, or table files) into a dataset at ``dest``.

    Folders become tar shards by default (ImageFolder trees get an integer ``cls``
    field and the class names), tables become Arrow shards. The same input always
    gives the same shards, whatever ``workers`` is. The manifest is written last;
    if anything fails, none is written. With ``fsync`` (default) the shards and then the manifest
    are on disk before each appears, so a power loss never leaves a manifest without its shards.
    Sample keys in tar shards must stay inside the folder ``tar -xf`` extracts to (see
    :func:`~shardstream.packing.fields.key_problem`); a file whose key does not is refused.
    With ``shuffle`` (default), samples are written in a random order drawn from ``seed`` (keys are
    unchanged), so no shard holds one class; a table is then shuffled in memory (``shuffle=False``
    streams a table larger than memory, in its own order).
    ``format="tokens"`` tokenizes a text corpus into token shards: ``token_options`` (``tokenizer``,
    ``text_field``, ``eos``, ``eos_id``, ``vocab_size``, ``dtype``, ``per_file``) go to
    :func:`shardstream.packing.tokens.pack_tokens`.
    ``engine="ray"`` runs the shard jobs of a folder pack as Ray tasks (the cluster at ``ray_address``,
    else ``RAY_ADDRESS``, else a local instance), with the same output bytes as ``engine="local"``
    (:mod:`shardstream.packing.ray_engine`); for ``fn=`` and the sources read sample by sample, Ray
    tasks make the samples and this process writes the shards in order.
    ``split_by="cls"`` packs an ImageFolder tree as one dataset per class under ``dest`` plus a label
    index (see :func:`shardstream.packing.split.pack_split`), for class-balanced mixes.
    ``fn`` packs from a function: ``source`` is then a list of inputs and ``fn(input)`` returns or
    yields sample dicts, written in input order (:mod:`shardstream.packing.function`). HDF5, LMDB,
    NumPy, Hugging Face ``save_to_disk`` folders and existing shards are packed too: ``fields`` picks
    HDF5 datasets or ``.npy`` files, ``field_name`` names an LMDB value's field (default ``bin``), and
    ``decode_value(key, value)`` turns an LMDB value into a sample dict.
    ``index``: write each uncompressed tar shard's sample index (``<shard>.idx``), with which readers
    fetch an epoch's first samples by ranged reads; default: when ``dest`` is object storage (pass
    ``True`` to pack locally for an upload).
    """
    common = {"shard_size": shard_size, "samples_per_shard": samples_per_shard, "compression": compression,
              "workers": workers, "overwrite": overwrite, "storage_options": storage_options,
              "progress": progress, "fsync": fsync, "engine": engine, "ray_address": ray_address}
    if fn is not None:  # a function over a list of inputs: see packing.function
        from .function import pack_function

        return PackResult(*pack_function(source, dest, fn, format=format, **common))  # type: ignore[arg-type]
    if split_by is not None:
        from .split import pack_split

        return pack_split(pack, source, dest, split_by=split_by, format=format, shard_size=shard_size,  # type: ignore[return-value]
                          samples_per_shard=samples_per_shard, compression=compression, workers=workers,
                          layout=layout, overwrite=overwrite, storage_options=storage_options, progress=progress,
                          fsync=fsync, shuffle=shuffle, seed=seed, engine=engine, ray_address=ray_address,
                          index=index)
    if format == "tokens" or token_options:  # text or token files to token shards: see packing.tokens
        if format != "tokens":
            raise ShardstreamError(f"{', '.join(sorted(token_options))} apply to format='tokens' only")
        from .tokens import pack_tokens

        return PackResult(*pack_tokens(source, dest, shard_size=shard_size, workers=workers, overwrite=overwrite,
                                       storage_options=storage_options, progress=progress, fsync=fsync,
                                       **token_options))
    started = time.perf_counter()
    source, dest = os.fspath(source), os.fspath(dest)
    source = source[len("file://"):] if source.startswith("file://") else source
    limit, per_shard = check_shard_limits(shard_size, samples_per_shard)
    if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
        raise ShardstreamError(f"workers must be at least 1, not {workers!r}")
    workers = default_workers() if workers is None else int(workers)
    options = {k: v for k, v in (("fields", fields), ("field_name", field_name), ("decode_value", decode_value))
               if v is not None}
    if is_remote(source):  # a folder tree in a bucket: listed here, read by the workers
        options["storage_options"] = storage_options if source_options is None else source_options
    with _no_gc():
        src = open_source(source, layout, **options) if _source is None else _source  # (a split pack's class)
    if hasattr(src, "sample_jobs"):  # HDF5, LMDB, NumPy, tar shards: samples read in workers (packing.function)
        from .function import pack_source

        return PackResult(*pack_source(src, dest, format=format, shuffle=shuffle, seed=seed, **common))
    if isinstance(src, FolderSource) and shuffle:
        src.samples = [src.samples[i] for i in sample_permutation(len(src.samples), seed).tolist()]
    order_seed = int(seed) if shuffle and not getattr(src, "keeps_order", False) else None  # resharded: as is
    shard_format, comp = resolve_format(format or ("arrow" if isinstance(src, TableSource) else "tar"), compression)
    if isinstance(src, FolderSource):
        check_sample_names(src.samples, shard_format)
    store = Store(dest, storage_options)
    _check_not_inside(source, store)
    claim = prepare_destination(store, overwrite, fsync)
    info = creation_info(source=source if is_remote(source) else os.path.abspath(source),
                         layout=getattr(src, "layout", "table"))
    _check_engine(engine, src, shard_format, source)
    spec, run = ShardSpec(shard_format, comp, limit, per_shard, index), Execution(workers, progress, engine, ray_address)
    with claim.guard():
        if isinstance(src, FolderSource) and shard_format != "arrow":
            manifest = _pack_folder_tar(src, claim, spec, run, info)
            warn_small_shards(manifest, limit)
        elif isinstance(src, TableSource) and shard_format == "arrow":
            manifest = _pack_table_arrow(src, claim, spec, run, info, order_seed)
            warn_small_shards(manifest, limit)
        else:  # ShardWriter.finish warns of small shards itself
            manifest = _pack_with_writer(src, claim, spec, progress, info, order_seed)
        claim.publish(manifest)
    skipped = src.skipped_hidden if isinstance(src, FolderSource) else 0
    return PackResult(store.url, manifest, time.perf_counter() - started, skipped,
                      src.total_bytes if isinstance(src, FolderSource) else None)


def _check_engine(engine: str, src: Any, shard_format: str, source: str) -> None:
    """Refuse what an engine other than the local one does not pack (before anything is written)."""
    if engine != "local" and not (isinstance(src, FolderSource) and shard_format != "arrow"
                                  or isinstance(src, TableSource) and shard_format == "arrow"):
        raise ShardstreamError(f"engine={engine!r} packs folder trees into tar shards, tables into Arrow shards, "
                               f"fn= inputs and the sources read sample by sample; pack {source} into "
                               f"{shard_format} shards with engine='local'")


def _manifest(shard_format: str, results: list[ShardResult], **kw: Any) -> Manifest:
    return Manifest(
        shard_format=shard_format,
        paths=[r.path for r in results],
        samples=[r.samples for r in results],
        nbytes=[r.nbytes for r in results],
        sha256=[r.sha256 for r in results],
        **({"index_sha256": [r.index_sha256 for r in results]} if any(r.index_sha256 for r in results) else {}),
        **kw,
    )


def _pack_folder_tar(src: FolderSource, claim: Claim, spec: ShardSpec, run: Execution, info: dict[str, Any]
                     ) -> Manifest:
    with _no_gc():
        plan = plan_shards(src.samples, spec.limit, spec.per_shard)
    store, comp, shard_format = claim.store, spec.compression, spec.shard_format
    # Shards go straight to this run's names; local workers check afterwards that the run still holds the folder.
    check = claim.token if store.local else None
    names = [claim.shard_name(i, shard_format) for i in range(len(plan))]
    index = (not store.local if spec.index is None else spec.index) and comp is None
    jobs = [(ShardJob(store.url, store.storage_options, i, names[i], comp, s, check, claim.fsync, src.storage_options,
                      index),) for i, s in enumerate(plan)]
    job_bytes = [sum(size for s in samples for _, _, size in s.files) for samples in plan]

    def done(i: int) -> None:
        bar.update(job_bytes[i])

    with progress_bar(run.progress, src.total_bytes) as bar:
        results = run_jobs(run.engine, write_shard, jobs, run.workers, store.local, done, ray_address=run.ray_address,
                           describe=lambda i: plan[i][0].files[0][1])
    if run.engine != "local":  # written elsewhere: each shard is where it should be, as large as its task said
        check_written(store, names, [r.nbytes for r in results])
    counts: dict[str, int] = {}
    for r in results:
        for name, n in r.field_counts.items():
            counts[name] = counts.get(name, 0) + n
    fields = [{"name": n, "type": "bytes", "samples": c} for n, c in sorted(counts.items())]
    return _manifest(shard_format, results, fields=fields, classes=src.classes, created=info)


def _pack_table_arrow(src: TableSource, claim: Claim, spec: ShardSpec, run: Execution, info: dict[str, Any],
                      order_seed: int | None = None) -> Manifest:
    from ..formats import arrow as arrow_format
    from .table import pack_table_arrow

    results: list[ShardResult] = []
    with progress_bar(run.progress, None, unit=" rows") as bar:
        def done(result: ShardResult) -> None:
            results.append(result)
            bar.update(result.samples)

        schema = pack_table_arrow(src, claim, spec, run, done, order_seed)
    if run.engine != "local":
        check_written(claim.store, [r.path for r in results], [r.nbytes for r in results])
    return _manifest(
        "arrow", results, fields=arrow_format.describe_schema(schema),
        arrow_schema=arrow_format.schema_to_text(schema), created=info, classes=getattr(src, "classes", None),
    )


def _pack_with_writer(src: FolderSource | TableSource, claim: Claim, spec: ShardSpec, progress: bool,
                      info: dict[str, Any], order_seed: int | None = None) -> Manifest:
    """Sequential packing through :class:`ShardWriter` (on this run's claim): folders to Arrow, tables to tar.
    Returns the manifest, not published."""
    from .table import pack_table_tar

    fmt = "arrow" if spec.shard_format == "arrow" else "tar"
    schema = None
    if fmt == "arrow" and isinstance(src, FolderSource):  # every field is known: no inference from a prefix
        import pyarrow as pa

        names = sorted({ext for s in src.samples for ext, _, _ in s.files})
        columns = [("__key__", pa.string())] + [(n, pa.binary()) for n in names]
        schema = pa.schema(columns + ([("cls", pa.int64())] if src.classes is not None else []))
    store = claim.store
    writer = ShardWriter(store.url, fmt, spec.limit, spec.per_shard, spec.compression or "none",
                         store.storage_options, classes=getattr(src, "classes", None), schema=schema,
                         fsync=claim.fsync, index=spec.index, _claim=claim)
    try:
        if isinstance(src, TableSource):
            with progress_bar(progress, None, unit=" rows") as bar:
                pack_table_tar(src, writer, bar.update, order_seed)
        else:
            with progress_bar(progress, src.total_bytes) as bar:
                for s in src.samples:
                    sample: dict[str, Any] = {"__key__": s.key}
                    for ext, path, size in s.files:
                        sample[ext] = read_file(path, size, src.storage_options)
                        bar.update(size)
                    if s.label is not None:
                        sample["cls"] = s.label
                    writer.write(sample)
        manifest = writer.finish()
    except BaseException:
        writer.abort()
        raise
    manifest.created = info
    return manifest
