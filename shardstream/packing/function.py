"""Pack from a function, and from sources whose samples are read in workers (HDF5, LMDB, NumPy, shards).

A function maps each input (a file name, a URL, an id, or a source's chunk of samples) to the samples
(dicts) it returns or yields. Inputs run in parallel on the local process pool, a few ahead of the
writer; their samples come back and are written **in input order** by one :class:`ShardWriter`, so the
shards are the same bytes for any number of workers. Values that need encoding (arrays, images, JSON)
are encoded to bytes in the workers. A failing input stops the pack with one line naming it, and no
manifest is published.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ShardstreamError, SourceError, UsageError
from ..manifest import creation_info
from .engine import Execution, die_with_parent, pool_context, progress_bar
from .fields import encode_field
from .options import PackOptions
from .result import PackResult
from .writer import ShardWriter

log = logging.getLogger(__name__)
SampleFn = Callable[[Any], Any]
_PLAIN = (bytes, bytearray, str, int, float, bool)


class SampleSource(Protocol):
    """A source whose samples are read in workers: :meth:`sample_jobs` gives a picklable reader and its
    inputs (chunks of samples), in the order they are written; ``shuffle_seed`` draws the sample order."""

    root: str
    layout: str
    num_samples: int

    def sample_jobs(self, shuffle_seed: int | None) -> tuple[SampleFn, list[Any]]: ...


_FN: SampleFn | None = None
_ENCODE = False


def _install(parent: int, fn: SampleFn, encode: bool) -> None:
    """Pool initializer: the function travels once per worker (inherited when forked, not pickled)."""
    global _FN, _ENCODE
    die_with_parent(parent)
    _FN, _ENCODE = fn, encode


def describe_input(item: Any) -> str:
    """An input, short and on one line, for error messages."""
    text = " ".join(repr(item).split())
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return "".join(ch for ch in text if ch.isprintable()) or type(exc).__name__


def _samples(out: Any, encode: bool) -> list[dict[str, Any]]:
    """What a function gave (a dict, an iterable of dicts, or None) as a list of sample dicts; with
    ``encode`` (tar shards), values other than bytes, text and numbers as the bytes stored for them."""
    if out is None:
        return []
    items = [out] if isinstance(out, Mapping) else list(out)
    samples = []
    for j, sample in enumerate(items):
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"gave a {type(sample).__name__}, not a dict of fields like {{'jpg': data, 'cls': 3}}"
            )
        sample = dict(sample)
        if encode:
            key = str(sample.get("__key__", f"#{j} of this input"))
            for name, value in sample.items():
                if (
                    not name.startswith("__")
                    and not isinstance(value, _PLAIN)
                    and not _numpy_scalar(value)
                ):
                    sample[name] = bytes(encode_field(key, name, value))
        samples.append(sample)
    return samples


def _numpy_scalar(value: Any) -> bool:
    return isinstance(value, np.generic) and not isinstance(value, np.void)


def _call(fn: SampleFn, item: Any, encode: bool) -> tuple[bool, Any]:
    """(True, samples) or (False, (is a source's error, message)): exceptions never cross processes."""
    try:
        return True, _samples(fn(item), encode)
    except SourceError as exc:  # a source's reader: the message names the file already
        return False, (True, one_line(exc))
    except ShardstreamError as exc:
        return False, (False, one_line(exc))
    except (
        Exception
    ) as exc:  # the user's function: any error, reported with the input that raised it
        return False, (False, f"{type(exc).__name__}: {one_line(exc)}")


def _run(item: Any) -> tuple[bool, Any]:
    assert _FN is not None
    return _call(_FN, item, _ENCODE)


def _picklable(fn: SampleFn) -> bool:
    try:
        pickle.dumps(fn)
    except Exception:  # pickle raises several types for closures, lambdas, open handles
        return False
    return True


def map_ordered(
    fn: SampleFn,
    items: Sequence[Any],
    run: Execution,
    encode: bool = False,
    ahead: int | None = None,
) -> Iterator[tuple[int, tuple[bool, Any]]]:
    """``(i, _call(fn, items[i]))`` for every item, in order; ``run.workers`` processes (or, on the Ray
    engine, Ray tasks) run up to ``ahead`` items beyond the one being consumed (default: two per
    worker)."""
    workers, engine = run.workers, run.engine
    if engine == "ray":
        from .ray_engine import map_ray

        yield from map_ray(
            functools.partial(_call, fn, encode=encode),
            items,
            address=run.ray_address,
            ahead=ahead,
            describe=lambda i: describe_input(items[i]),
        )
        return
    if engine != "local":
        raise UsageError(f"unknown engine {engine!r}; use local or ray")
    if workers <= 1 or len(items) <= 1:
        for i, item in enumerate(items):
            yield i, _call(fn, item, encode)
        return
    context = pool_context()
    pool: Executor
    if context.get_start_method() != "fork" and not _picklable(fn):
        log.warning(
            "fn %s cannot be sent to worker processes (this process runs threads, so workers are spawned, "
            "not forked): running it in %d threads instead; define it at module level for processes",
            getattr(fn, "__qualname__", fn),
            workers,
        )
        pool = ThreadPoolExecutor(min(workers, len(items)))
        submit = functools.partial(pool.submit, _call, fn, encode=encode)
    else:
        pool = ProcessPoolExecutor(
            min(workers, len(items)),
            mp_context=context,
            initializer=_install,
            initargs=(os.getpid(), fn, encode),
        )
        submit = functools.partial(pool.submit, _run)
    ahead = max(ahead or 2 * workers, 1)
    with pool:
        pending: deque[Future[tuple[bool, Any]]] = deque()
        try:
            for i in range(len(items)):
                while len(pending) <= ahead and i + len(pending) < len(items):
                    pending.append(submit(items[i + len(pending)]))
                try:
                    result = pending.popleft().result()
                except BrokenProcessPool:
                    raise ShardstreamError(
                        f"a worker process died while making the samples of input {i} "
                        f"({describe_input(items[i])}): out of memory, or killed; pack again with fewer "
                        "--workers"
                    ) from None
                yield i, result
        finally:
            for future in pending:
                future.cancel()


@dataclass(frozen=True)
class Inputs:
    """What :func:`write_samples` maps and writes: ``fn`` over ``items``; ``what(i)`` names input ``i`` in an
    error (``what(-1)``: all of them); ``info``: the manifest's creation info; ``total``: the samples to
    expect (the progress bar's end), and ``classes`` for the manifest."""

    fn: SampleFn
    items: Sequence[Any]
    what: Callable[[int], str]
    info: dict[str, Any]
    total: int | None = None
    classes: list[str] | None = None


def write_samples(inputs: Inputs, dest: str, options: PackOptions, started: float) -> PackResult:
    """Map ``inputs.fn`` over ``inputs.items`` in parallel and write the samples in order; publish the
    manifest last. The result's time counts from ``started``."""
    run, what = options.execution(), inputs.what
    writer = ShardWriter(
        dest,
        options.format or "tar",
        options.shard_size,
        options.samples_per_shard,
        options.compression,
        options.storage_options,
        overwrite=options.overwrite,
        append=options.append,
        classes=inputs.classes,
        fsync=options.fsync,
        index=options.index,
        image_sizes=options.image_sizes,
    )
    encode = writer.shard_format != "arrow"
    try:
        with progress_bar(run.progress, inputs.total, unit=" samples") as bar:
            for i, (ok, out) in map_ordered(inputs.fn, inputs.items, run, encode):
                if not ok:
                    ours, message = out
                    raise (
                        SourceError(message)
                        if ours
                        else ShardstreamError(
                            f"{what(i)} failed: {message}; fix it or leave it out (no dataset was published)"
                        )
                    )
                for sample in out:
                    try:
                        writer.write(sample)
                    except ShardstreamError as exc:
                        raise type(exc)(f"{what(i)}: {one_line(exc)}") from exc
                bar.update(len(out))
        if writer.count == 0:
            raise SourceError(f"{what(-1)} gave no samples; nothing to pack")
        manifest = writer.finish()
    except BaseException:
        writer.abort()
        raise
    manifest.created = inputs.info
    manifest = writer.claim.publish(manifest)
    return PackResult(writer.store.url, manifest, time.perf_counter() - started)


def pack_inputs(
    inputs: Iterable[Any], dest: str | os.PathLike[str], options: PackOptions
) -> PackResult:
    """``pack(inputs, dest, fn=...)``: ``fn(input)`` returns or yields sample dicts (``__key__``
    optional: the sample's number otherwise); they are written in input order."""
    started = time.perf_counter()
    fn = options.fn
    if isinstance(inputs, (str, bytes, os.PathLike)) or not isinstance(inputs, Iterable):
        raise ShardstreamError(
            f"with fn=, the source is a list of inputs for fn, not {describe_input(inputs)}; "
            "pass e.g. a list of file names"
        )
    items = list(inputs)
    if not callable(fn):
        raise ShardstreamError(f"fn must be a function of one input, not a {type(fn).__name__}")
    if not items:
        raise SourceError("pack(fn=) was given no inputs; nothing to pack")
    name = getattr(fn, "__qualname__", type(fn).__name__)

    def what(i: int) -> str:
        return f"fn {name} on input {i} ({describe_input(items[i])})" if i >= 0 else f"fn {name}"

    info = creation_info(source=f"{name} over {len(items)} inputs", layout="function")
    return write_samples(Inputs(fn, items, what, info), os.fspath(dest), options, started)


def pack_sample_source(
    src: SampleSource, dest: str | os.PathLike[str], options: PackOptions
) -> PackResult:
    """Pack a source read in workers (HDF5, LMDB, NumPy, existing shards), already opened, into ``dest``."""
    started = time.perf_counter()
    reader, jobs = src.sample_jobs(int(options.seed) if options.shuffle else None)

    def what(i: int) -> str:
        return f"{src.layout} source {src.root}"

    info = creation_info(
        source=os.path.abspath(src.root) if "://" not in src.root else src.root, layout=src.layout
    )
    inputs = Inputs(reader, jobs, what, info, src.num_samples, getattr(src, "classes", None))
    return write_samples(inputs, os.fspath(dest), options, started)
