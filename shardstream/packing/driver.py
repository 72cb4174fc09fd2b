"""Packing a source: a folder tree or a table into a sharded dataset, in parallel, deterministically.

The source is listed, then packed by the writer its kind and the shard format call for (:data:`PACKERS`):
folder trees into tar shards and tables into Arrow shards by parallel shard jobs (the process pool or
Ray), the other two pairs sample by sample through :class:`ShardWriter`; files of samples (HDF5, LMDB,
NumPy, Hugging Face, shards) are read in workers (:mod:`.function`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ShardstreamError, UsageError
from ..manifest import Manifest, creation_info
from ..manifest.image_sizes import encode_image_sizes
from ..manifest.media_facts import encode_media_facts
from ..sources import FolderSource, TableSource, open_source, sample_permutation
from ..sources.remote import is_remote
from ..storage import Store
from .destination import Claim, check_outside, check_written, prepare_destination
from .engine import Execution, progress_bar, run_jobs
from .folder import ShardJob, ShardResult, check_sample_names, plan_shards, read_file, write_shard
from .options import PackOptions
from .result import PackResult
from .rules import ShardSpec, check_shard_limits, resolve_format, warn_small_shards
from .writer import ShardWriter


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


def pack_source(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    options: PackOptions,
    src: Any = None,
) -> PackResult:
    """Pack a source (a folder tree, table files, or files of samples: HDF5, LMDB, NumPy, Hugging Face,
    shards) into a dataset at ``dest``; ``src``: the source already opened (a split pack's class)."""
    started = time.perf_counter()
    source, dest = os.fspath(source), os.fspath(dest)
    source = source[len("file://") :] if source.startswith("file://") else source
    limit, per_shard = check_shard_limits(options.shard_size, options.samples_per_shard)
    run = options.execution()
    if src is None:
        src = open_listed(source, options)
    kind = source_kind(src)
    store = Store(dest, options.storage_options)
    check_outside(source, store)
    # HDF5, LMDB, NumPy, tar shards: samples read in workers (packing.function)
    if kind == "samples":
        from .function import pack_sample_source

        return pack_sample_source(src, dest, options)
    if kind == "folder" and options.shuffle:
        src.samples = [
            src.samples[i] for i in sample_permutation(len(src.samples), options.seed).tolist()
        ]
    order_seed = (
        int(options.seed) if options.shuffle and not getattr(src, "keeps_order", False) else None
    )
    shard_format, comp = resolve_format(
        options.format or ("arrow" if kind == "table" else "tar"), options.compression
    )
    if kind == "folder":
        check_sample_names(src.samples, shard_format)
    packer = PACKERS[(kind, "arrow" if shard_format == "arrow" else "tar")]
    if run.engine != "local" and packer is _pack_with_writer:  # refused before anything is written
        raise ShardstreamError(
            f"engine={run.engine!r} packs folder trees into tar shards, tables into Arrow shards, "
            f"fn= inputs and the sources read sample by sample; pack {source} into "
            f"{shard_format} shards with engine='local'"
        )
    claim = prepare_destination(store, options.overwrite, options.fsync, options.append)
    info = creation_info(
        source=source if is_remote(source) else os.path.abspath(source),
        layout=getattr(src, "layout", "table"),
    )
    with claim.guard():
        manifest = packer(
            src,
            claim,
            ShardSpec(shard_format, comp, limit, per_shard, options.index, options.image_sizes),
            run,
            info,
            order_seed,
        )
        manifest = claim.publish(manifest)
    skipped = src.skipped_hidden if kind == "folder" else 0
    return PackResult(
        store.url,
        manifest,
        time.perf_counter() - started,
        skipped,
        src.total_bytes if kind == "folder" else None,
    )


def open_listed(source: str, options: PackOptions) -> Any:
    """The source listed: a folder tree or tables (local or in a bucket), or files of samples."""
    settings = options.source_settings()
    if is_remote(source):  # a folder tree in a bucket: listed here, read by the workers
        given = options.source_options
        settings["storage_options"] = options.storage_options if given is None else given
    elif options.source_options is not None:
        raise UsageError(
            f"source_options reach a source in object storage, and {source} is a local path: "
            "leave them out"
        )
    with _no_gc():
        return open_source(source, options.layout, **settings)


def source_kind(src: Any) -> str:
    """``"folder"`` (files grouped by key), ``"table"`` (rows), or ``"samples"`` (read in workers, sample by
    sample: HDF5, LMDB, NumPy, Hugging Face, existing shards)."""
    if isinstance(src, FolderSource):
        return "folder"
    if isinstance(src, TableSource):
        return "table"
    return "samples"


def _manifest(shard_format: str, results: list[ShardResult], **kw: Any) -> Manifest:
    recorded = [r.image_sizes for r in results]
    if recorded and all(s is not None for s in recorded):
        kw["image_sizes"] = encode_image_sizes(recorded)  # type: ignore[arg-type]
        kw["media"] = encode_media_facts([s.media for s in recorded])  # type: ignore[union-attr]
    return Manifest(
        shard_format=shard_format,
        paths=[r.path for r in results],
        stored_counts=[r.samples for r in results],
        nbytes=[r.nbytes for r in results],
        sha256=[r.sha256 for r in results],
        **(
            {"index_sha256": [r.index_sha256 for r in results]}
            if any(r.index_sha256 for r in results)
            else {}
        ),
        **kw,
    )


def _pack_folder_tar(
    src: FolderSource,
    claim: Claim,
    spec: ShardSpec,
    run: Execution,
    info: dict[str, Any],
    order_seed: int | None = None,
) -> Manifest:
    """Folder trees into tar shards: one job per shard, on the pool or on Ray (the order is the listing's,
    shuffled already)."""
    with _no_gc():
        plan = plan_shards(src.samples, spec.limit, spec.per_shard)
    store, comp, shard_format = claim.store, spec.compression, spec.shard_format
    # Shards go straight to this run's names; local workers check afterwards that the run still holds the folder.
    check = claim.token if store.local else None
    names = [claim.shard_name(i, shard_format) for i in range(len(plan))]
    index = spec.index is not False
    jobs = [
        (
            ShardJob(
                store.url,
                store.storage_options,
                i,
                names[i],
                comp,
                s,
                check,
                claim.fsync,
                src.storage_options,
                index,
                spec.image_sizes,
            ),
        )
        for i, s in enumerate(plan)
    ]
    job_bytes = [sum(size for s in samples for _, _, size in s.files) for samples in plan]

    def done(i: int) -> None:
        bar.update(job_bytes[i])

    with progress_bar(run.progress, sum(job_bytes)) as bar:
        results = run_jobs(
            run, write_shard, jobs, store.local, done, lambda i: plan[i][0].files[0][1]
        )
    # written elsewhere: each shard is where it should be, as large as its task said
    if run.engine != "local":
        check_written(store, names, [r.nbytes for r in results])
    counts: dict[str, int] = {}
    for r in results:
        for name, n in r.field_counts.items():
            counts[name] = counts.get(name, 0) + n
    fields = [{"name": n, "type": "bytes", "samples": c} for n, c in sorted(counts.items())]
    manifest = _manifest(shard_format, results, fields=fields, classes=src.classes, created=info)
    warn_small_shards(manifest, spec.limit)
    return manifest


def _pack_table_arrow(
    src: TableSource,
    claim: Claim,
    spec: ShardSpec,
    run: Execution,
    info: dict[str, Any],
    order_seed: int | None = None,
) -> Manifest:
    """Tables into Arrow shards: record batches cut into shards, written by the pool or on Ray."""
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
    manifest = _manifest(
        "arrow",
        results,
        fields=arrow_format.describe_schema(schema),
        arrow_schema=arrow_format.schema_to_text(schema),
        created=info,
        classes=getattr(src, "classes", None),
    )
    warn_small_shards(manifest, spec.limit)
    return manifest


def _pack_with_writer(
    src: FolderSource | TableSource,
    claim: Claim,
    spec: ShardSpec,
    run: Execution,
    info: dict[str, Any],
    order_seed: int | None = None,
) -> Manifest:
    """Sequential packing through :class:`ShardWriter` (on this run's claim): folders to Arrow, tables to tar
    (the writer warns of small shards itself). Returns the manifest, not published."""
    progress = run.progress
    from .table import pack_table_tar

    fmt = "arrow" if spec.shard_format == "arrow" else "tar"
    schema = None
    # every field is known: no inference from a prefix
    if fmt == "arrow" and isinstance(src, FolderSource):
        schema = _folder_schema(src, claim)
    store = claim.store
    writer = ShardWriter(
        store.url,
        fmt,
        spec.limit,
        spec.per_shard,
        spec.compression or "none",
        store.storage_options,
        classes=getattr(src, "classes", None),
        schema=schema,
        fsync=claim.fsync,
        index=spec.index,
        image_sizes=spec.image_sizes,
        _claim=claim,
    )
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


def _folder_schema(src: FolderSource, claim: Claim) -> Any:
    """The Arrow schema of a folder's samples, with the Hugging Face features that let ``load_dataset``
    decode its images and labels (:mod:`..formats.hf_features`); an append whose columns are the
    dataset's keeps the dataset's schema, so that its shards stay alike."""
    from ..formats import arrow as arrow_format
    from ..formats.hf_features import folder_schema, unwrapped_schema

    schema = folder_schema({ext for s in src.samples for ext, _, _ in s.files}, src.classes)
    base = claim.base.arrow_schema if claim.base is not None else None
    if base is not None:
        found = arrow_format.schema_from_text(base)
        if unwrapped_schema(found).equals(unwrapped_schema(schema)):
            return found
    return schema


# (source kind, shard format family) -> how such a pack is written
PACKERS: dict[tuple[str, str], Callable[..., Manifest]] = {
    ("folder", "tar"): _pack_folder_tar,
    ("folder", "arrow"): _pack_with_writer,
    ("table", "arrow"): _pack_table_arrow,
    ("table", "tar"): _pack_with_writer,
}
