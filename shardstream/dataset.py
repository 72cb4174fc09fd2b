"""``ShardDataset``: an ``IterableDataset`` that executes the plan, decodes and transforms.

Every rank reads exactly ``len(ds)`` samples per epoch (computed from the manifest);
the epoch's order is a function of the seed, the epoch and the manifest alone; the
DataLoader's in-order output equals the rank's planned order for any number of workers;
and a loader's ``state_dict()`` resumes mid-epoch exactly. See :mod:`shardstream.plan`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import plan
from .cache import DiskCache
from .collate import MappedBytes, collate
from .decode import Decoder, DecodeSpec
from .errors import ManifestError, ShardstreamError
from .fetch import ShardFetcher
from .manifest import Manifest, dataset_store, load_manifest
from .prefetch import Prefetcher
from .reader import ArrowShard, ShardCache
from .seeding import seed_batch
from .sizes import parse_size
from .storage import RetryPolicy, Store
from .transport import Ring

log = logging.getLogger("shardstream")

Chunk = tuple[int, np.ndarray, np.ndarray]  # a batch's first position in the epoch's order, its shards and offsets
_MAX_INTERVALS = 4096  # segment intervals the shared control block holds (enough for resizes to 4,096 ranks)


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): explicit values, else ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        found_rank, found_world = dist.get_rank(), dist.get_world_size()
    else:
        found_rank, found_world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    rank = found_rank if rank is None else int(rank)
    world_size = found_world if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ShardstreamError(f"rank {rank} is not in [0, world size {world_size})")
    return rank, world_size


def open_dataset(url_or_urls: str | Sequence[str], storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None) -> tuple[Store, Manifest]:
    """The store and manifest of a dataset; WebDataset tars without a manifest are scanned."""
    urls = [url_or_urls] if isinstance(url_or_urls, (str, os.PathLike)) else list(url_or_urls)
    urls = [os.fspath(u) for u in urls]
    if len(urls) == 1 and not urls[0].endswith((".tar", ".tar.gz", ".tgz", ".tar.zst")) and "{" not in urls[0]:
        store = dataset_store(urls[0], storage_options, retry)
        return store, load_manifest(store)
    from .index import scan

    log.warning("scanning %d tar source(s) without a manifest; 'shardstream index' writes one so the next "
                "start is instant", len(urls))
    result = scan(urls, storage_options=storage_options)
    return Store(result.url, storage_options, retry), result.manifest


class _Control:
    """What every worker must agree on at the start of each pass, in shared memory.

    Workers of a persistent DataLoader keep their copy of the dataset, so epoch, rank
    and resume position travel through this small shared tensor instead.
    Layout: epoch, rank, world size, segment world size, consumed, interval count, intervals...
    """

    def __init__(self) -> None:
        self.block = torch.zeros(6 + 2 * _MAX_INTERVALS, dtype=torch.int64).share_memory_()

    def set(self, epoch: int, rank: int, world_size: int, segment: plan.Intervals, segment_world: int,
            consumed: int) -> None:
        if len(segment) > _MAX_INTERVALS:
            raise ShardstreamError(f"a resume state with {len(segment)} intervals is more than this reader holds")
        b = self.block
        b[:6] = torch.tensor([epoch, rank, world_size, segment_world, consumed, len(segment)])
        if segment:
            b[6 : 6 + 2 * len(segment)] = torch.tensor(np.asarray(segment, dtype=np.int64).reshape(-1))

    def get(self) -> tuple[int, int, int, list[tuple[int, int]], int, int]:
        values = self.block[:6].tolist()
        epoch, rank, world_size, segment_world, consumed, n = values
        flat = self.block[6 : 6 + 2 * n].tolist()
        segment = [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]
        return epoch, rank, world_size, segment, segment_world, consumed


class ShardDataset(IterableDataset):
    """Stream a shardstream dataset (or WebDataset tars) to DDP ranks and DataLoader workers.

    Args:
        url_or_urls: a dataset folder or its ``_manifest.json`` (any fsspec URL), or
            WebDataset tars without a manifest (a brace pattern or a list).
        shuffle: permute shards per epoch and samples within ``shuffle_window``.
        seed: with the epoch, fixes the order; the same on every rank.
        shuffle_window: samples per shuffle window (default: about four shards).
        decode: ``"torch"``, ``"numpy"``, ``"pil"``, ``None`` (bytes), a callable on the
            sample, or a per-field mapping; see :class:`shardstream.decode.Decoder`.
        transform: a callable applied to each decoded sample dict.
        drop_last: drop the epoch's tail instead of padding so that ranks get equal counts.
        batch_size: yield collated batches of this size (set by :meth:`loader`).
        rank, world_size: override ``torch.distributed`` / ``RANK`` / ``WORLD_SIZE``.
        on_error: ``"raise"`` or ``"skip"`` (count, log, and repeat the last good
            sample so every rank still yields the same number of samples).
        storage_options: passed to fsspec (``endpoint_url``, ``anon``, ``profile``...).
        cache_dir: where shards downloaded from remote storage are kept, shared by the
            workers and ranks of a host (default: ``shardstream-<uid>/cache`` in the
            system's temporary folder); see :class:`shardstream.cache.DiskCache`.
        cache_limit: bytes (or ``"50GB"``) the cache may hold; least recently used
            shards not being read are evicted (default: half the free space there).
        prefetch: bytes (or ``"512MB"``) of upcoming shards each worker downloads ahead
            of use; ``0`` downloads each shard when it is first needed.
        retries: attempts after a transient storage error (resets, timeouts, 5xx,
            throttling, a damaged download) before giving up with an error.
        timeout: seconds one storage request may take before it is retried (large
            downloads get more, at 1 MB/s); ``None`` for no limit.
    """

    def __init__(
        self,
        url_or_urls: str | Sequence[str],
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_window: int | None = None,
        decode: DecodeSpec = "torch",
        transform: Callable[[dict[str, Any]], Any] | None = None,
        drop_last: bool = False,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        prefetch: int | str = "512MB",
        retries: int = 5,
        timeout: float | None = 60.0,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.store, self.manifest = open_dataset(url_or_urls, storage_options, RetryPolicy(retries, timeout))
        self.prefetch = parse_size(prefetch, "prefetch") if isinstance(prefetch, str) else int(prefetch)
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be 0 or more bytes, not {prefetch!r}")
        self.disk_cache = None if self.store.local else DiskCache(
            cache_dir, parse_size(cache_limit, "cache_limit") if isinstance(cache_limit, str) else cache_limit)
        self.counts = self.manifest.samples
        if self.manifest.num_samples == 0:
            raise ManifestError(f"{self.store.url} holds no samples")
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.window = shuffle_window or plan.default_window(self.counts)
        self.decoder = Decoder(decode)
        self.transform = transform
        self.batch_size = batch_size
        self.batches_per_chunk = 1  # >1: workers collate several batches at once (the loader splits them)
        self._released: torch.Tensor | None = None  # set by the loader: batches travel through a Ring
        self._loader: Any = None  # a weak reference to the loader this dataset feeds
        self.ring_slots = 4
        self.collate_fn = collate_fn or collate
        self.on_error = on_error
        self.seed_workers = True  # workers reseed random/numpy/torch per batch (see shardstream.seeding)
        self.shm_guard: tuple[int, float, int, int] | None = None  # set by the loader (see shardstream.guards)
        if self.manifest.shard_format == "arrow":
            import pyarrow.compute  # noqa: F401 - take() loads it lazily, inside the first batch otherwise
        self._columnar = (self.manifest.shard_format == "arrow" and transform is None and collate_fn is None
                          and (decode is None or not _has_binary_fields(self.manifest)))
        # raw bytes straight from the shard's memory into the batch: no decoder, no copies between
        self._raw = decode is None and transform is None
        # ...and for local uncompressed tars, not even that: only where the bytes are
        self._mapped = self._raw and self.store.local and self.manifest.shard_format == "tar"
        self._explicit_rank = (rank, world_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.epoch = 0
        self.generation = 0  # bumped whenever the epoch or resume position is set (main process)
        self.skipped = 0  # samples replaced under on_error="skip", in this process
        self._control = _Control()
        self._reset(0)

    # -- epoch and resume state (main process) ----------------------------------------
    def _reset(self, epoch: int) -> None:
        self.rank, self.world_size = resolve_rank(*self._explicit_rank)
        self.epoch = epoch
        self.generation += 1
        self._control.set(epoch, self.rank, self.world_size, [(0, self.manifest.num_samples)], self.world_size, 0)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a resumed position in that same epoch is kept)."""
        current_epoch, _, _, segment, segment_world, consumed = self._control.get()
        fresh = segment == [(0, self.manifest.num_samples)] and consumed == 0
        if epoch != current_epoch or fresh:
            self._reset(epoch)
        else:  # keep the resume position; refresh rank in case the process group appeared since
            self.rank, self.world_size = resolve_rank(*self._explicit_rank)
            self._control.set(epoch, self.rank, self.world_size, segment, segment_world, consumed)
            self.generation += 1

    def __len__(self) -> int:
        """Samples this rank reads in a full epoch."""
        return plan.per_rank(self.manifest.num_samples, self.world_size, self.drop_last)

    def remaining(self) -> int:
        """Samples this rank still reads in the current epoch."""
        _, rank, world, segment, segment_world, consumed = self._control.get()
        start, stop = plan.rank_range(segment, segment_world, rank, self.drop_last)
        return stop - start - consumed

    def state(self) -> dict[str, Any]:
        """The current epoch's position (the loader adds what it has consumed since)."""
        epoch, rank, world, segment, segment_world, consumed = self._control.get()
        return {"version": 1, "epoch": epoch, "seed": self.seed, "num_samples": self.manifest.num_samples,
                "drop_last": self.drop_last, "segment": [list(iv) for iv in segment],
                "world_size": segment_world, "consumed": consumed}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the world size may differ from the one that saved it."""
        if state.get("version") != 1:
            raise ShardstreamError(f"unknown resume state version {state.get('version')!r}")
        if state["num_samples"] != self.manifest.num_samples or state["seed"] != self.seed:
            raise ShardstreamError(
                f"the resume state is for {state['num_samples']} samples with seed {state['seed']}, this "
                f"dataset has {self.manifest.num_samples} with seed {self.seed}; resume with the same data and seed"
            )
        if bool(state["drop_last"]) != self.drop_last:
            raise ShardstreamError("the resume state was saved with a different drop_last")
        self.rank, self.world_size = resolve_rank(*self._explicit_rank)
        segment = [tuple(iv) for iv in state["segment"]]
        saved_world, consumed = int(state["world_size"]), int(state["consumed"])
        if saved_world != self.world_size:
            segment, saved_world, consumed = (
                plan.remaining(segment, saved_world, consumed, self.drop_last), self.world_size, 0)
        self.epoch = int(state["epoch"])
        self.generation += 1
        self._control.set(self.epoch, self.rank, self.world_size, segment, saved_world, consumed)

    # -- reading (worker processes, or the main one) -------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self.decoder.copied_later = self._copied_later()  # batch_size may have been set since
        info = get_worker_info()
        num_workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
        epoch, rank, _, segment, segment_world, consumed = self._control.get()
        span = plan.rank_range(segment, segment_world, rank, self.drop_last)
        order = plan.EpochOrder.create(self.counts, self.seed, epoch, self.shuffle, self.window)
        order = order.restrict(*plan.span_bounds(segment, span))  # keep only this rank's shards
        chunk = (self.batch_size or 1) * self.batches_per_chunk
        cache = self._cache()
        cache.forget_failures()
        ring = self._ring(info)
        self._last_good = None

        def stand_in() -> Any:
            """The first sample of the rank's order that loads (for a failure before any success)."""
            for start in range(span[0], span[1], 64):
                idx = np.arange(start, min(start + 64, span[1]))
                for shard, offset in zip(*order.samples(plan.segment_positions(segment, idx))):
                    try:
                        return self._decode(cache, int(shard), int(offset))
                    except Exception:  # noqa: S112 - looking for any sample that loads
                        continue
            raise ShardstreamError(f"no sample of this rank's part of {self.store.url} loads; verify the dataset")

        def planned() -> Iterator[Chunk]:
            for lo, hi in plan.worker_chunks(span, chunk, num_workers, worker_id, consumed):
                positions = plan.segment_positions(segment, np.arange(lo, hi))
                yield (int(positions[0]), *order.samples(positions))

        chunks: Iterable[Chunk] = planned()
        prefetcher = None
        if not self.store.local:  # fetch the next shards of this worker's plan while it reads these
            prefetcher = Prefetcher(cache.load, lambda i: int(self.manifest.nbytes[i]), self.prefetch)
            cache.take = prefetcher.take
            chunks = _looking_ahead(chunks, -(-2 * self.window // (chunk * num_workers)) + 1, prefetcher, cache)
        try:
            user_code = (self.transform is not None or self.collate_fn is not collate
                         or self.decoder.runs_user_code)  # only they can draw random numbers
            reseed = info is not None and self.seed_workers and user_code  # augmentations per batch, reproducibly
            self._unchecked = info is not None and self.shm_guard is not None
            yield from self._batches(chunks, cache, ring, stand_in, epoch if reseed else None)
        finally:
            if prefetcher is not None:
                prefetcher.close()
                cache.take = None

    def _batches(self, chunks: Iterable[Chunk], cache: ShardCache, ring: Ring | None,
                 stand_in: Callable[[], Any], seed_epoch: int | None) -> Iterator[Any]:
        for position, shards, offsets in chunks:
            if seed_epoch is not None:
                seed_batch(self.seed, seed_epoch, position)
            if self._columnar and self.batch_size is not None:
                yield self._checked(self._load_columns(cache, shards, offsets))
                continue
            if self._mapped and self.batch_size is not None and self.collate_fn is collate:
                mapped = self._load_mapped(cache, shards, offsets)
                if mapped is not None:
                    yield mapped
                    continue
            samples = self._load(cache, shards, offsets, stand_in)
            if self.batch_size is None:
                yield samples[0]
            elif ring is not None:
                with ring.batch() as ship:
                    shipment = ship(self._checked(self.collate_fn(samples)))
                yield shipment
            else:
                yield self._checked(self.collate_fn(samples))

    def _checked(self, batch: Any) -> Any:
        """A worker's first batch of a pass, checked against the shared memory it and the others need."""
        if self._unchecked:
            from .guards import batch_nbytes, check_shm

            self._unchecked = False
            workers, per_worker, extra, free = self.shm_guard
            check_shm(batch_nbytes(batch), workers, per_worker, extra_batches=extra, free=free,
                      basis="measured on the first batch")
        return batch

    def _ring(self, info: Any) -> Ring | None:
        """This worker's arenas for sending batches (see :mod:`shardstream.transport`), if the loader set them up."""
        released = getattr(self, "_released", None)
        if info is None or released is None or self.collate_fn is not collate:
            return None
        ring = getattr(self, "_ring_state", None)
        if ring is None or ring.worker != info.id:
            ring = self._ring_state = Ring(released, info.id, self.ring_slots)
        return ring

    def _cache(self) -> ShardCache:
        cache = getattr(self, "_shards", None)
        if cache is None:
            cache = self._shards = ShardCache(self.store, self.manifest,
                                              fetcher=ShardFetcher(self.store, self.manifest, self.disk_cache))
        return cache

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_shards", None)  # open shards (memory maps) stay in the process that opened them
        state.pop("_last_good", None)
        state.pop("_ring_state", None)  # each worker process has its own arenas
        state["_loader"] = None
        return state

    def _copied_later(self) -> bool:
        """Whether decoded values are seen by nobody before collate copies them into a batch."""
        return self.batch_size is not None and self.transform is None and self.collate_fn is collate

    def _decode(self, cache: ShardCache, shard: int, offset: int) -> Any:
        if self._raw and self.batch_size is not None:
            return cache.get(shard).views(offset)  # collated (copied once) before anyone else sees it
        sample = self.decoder(cache.get(shard).sample(offset))
        return self.transform(sample) if self.transform is not None else sample

    def _load(self, cache: ShardCache, shards: np.ndarray, offsets: np.ndarray,
              stand_in: Callable[[], Any]) -> list[Any]:
        out: list[Any] = []
        for shard, offset in zip(shards.tolist(), offsets.tolist()):
            try:
                sample = self._decode(cache, shard, offset)
            except Exception as exc:
                where = self.store.url_of(self.manifest.paths[shard])
                key = _key_of(cache, shard, offset)
                message = f"{where}: sample {offset}{f' ({key!r})' if key else ''}: {exc}"
                if self.on_error == "raise":
                    if isinstance(exc, ShardstreamError):
                        raise type(exc)(message) from exc
                    raise ShardstreamError(message) from exc
                self.skipped += 1
                log.warning("skipped %s", message)
                if self._last_good is None:
                    self._last_good = stand_in()
                out.append(self._last_good)  # equal length: repeat the last good sample
                continue
            out.append(sample)
            self._last_good = sample
        return out

    def _load_mapped(self, cache: ShardCache, shards: np.ndarray, offsets: np.ndarray) -> dict[str, Any] | None:
        """Raw bytes of a local tar batch as locations in the shard files (see MappedBytes);
        None if this batch cannot be put so (a field some samples lack, a shard that fails)."""
        try:
            readers = [cache.get(int(s)) for s in shards]
        except ShardstreamError:
            return None  # the general path reports or skips it
        located = [r.locate(o) for r, o in zip(readers, offsets.tolist())]
        keys = [key for key, _ in located]
        entries = [fields for _, fields in located]
        names = entries[0].keys()
        if any(e.keys() != names for e in entries):
            return None
        used, local = np.unique(shards, return_inverse=True)
        paths = [self.store.path(self.manifest.paths[int(s)]) for s in used]
        batch: dict[str, Any] = {"__key__": keys}
        for name in names:
            spans = np.array([e[name] for e in entries], dtype=np.int64).reshape(-1, 2)
            batch[name] = MappedBytes(paths, local.astype(np.int32), spans[:, 0], spans[:, 1])
        return batch

    def _load_columns(self, cache: ShardCache, shards: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:
        """Arrow batch mode: rows gathered with ``take`` per shard, columns to tensors, no per-row Python."""
        import pyarrow as pa

        if (shards == shards[0]).all() and (np.diff(offsets) == 1).all():  # unshuffled: a zero-copy slice
            table = cache.get(int(shards[0])).table.slice(int(offsets[0]), len(offsets))
            return {name: column_to_batch(table.column(name)) for name in table.column_names}
        group = np.argsort(shards, kind="stable")  # rows grouped by shard, plan order kept within each
        pieces = []
        for shard in np.unique(shards):
            rows = offsets[group][shards[group] == shard]
            pieces.append(cache.get(int(shard)).take(pa.array(rows)))  # errors name the shard
        table = pa.concat_tables(pieces).take(pa.array(np.argsort(group, kind="stable")))
        return {name: column_to_batch(table.column(name)) for name in table.column_names}

    # -- loaders ----------------------------------------------------------------------
    def loader(self, batch_size: int, num_workers: int | None = None, **dataloader_kwargs: Any):
        """A DataLoader whose in-order output is this rank's planned order, with ``state_dict()``."""
        from .loader import ShardLoader

        return ShardLoader(self, batch_size, num_workers, **dataloader_kwargs)


def _looking_ahead(chunks: Iterable[Chunk], depth: int, prefetcher: Prefetcher, cache: ShardCache
                   ) -> Iterator[Chunk]:
    """The chunks, while the shards of the next ``depth`` are prefetched and the others closed."""
    it = iter(chunks)
    ahead: deque[Chunk] = deque()
    for item in it:
        ahead.append(item)
        if len(ahead) >= max(depth, 2):
            break
    while ahead:
        needed = np.concatenate([shards for _, shards, _ in ahead])
        first, index = np.unique(needed, return_index=True)
        in_order = first[np.argsort(index)].tolist()  # shards by first use
        prefetcher.want(in_order)
        prefetcher.keep_only(in_order)
        cache.retain(set(in_order))
        yield ahead.popleft()
        following = next(it, None)
        if following is not None:
            ahead.append(following)


def _has_binary_fields(manifest: Manifest) -> bool:
    return any(f.get("type") in ("binary", "large_binary") for f in manifest.fields)


def column_to_batch(column) -> Any:
    """An Arrow column as a tensor when it is numeric (lists of equal length become 2-D), else a list."""
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if column.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                   or pa.types.is_boolean(kind)):
        return torch.from_numpy(np.array(column.to_numpy(zero_copy_only=False)))  # own, writable memory
    if (column.null_count == 0 and (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind))
            and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False) if len(column) else np.zeros(0)
        if len(lengths) and (lengths == lengths[0]).all():
            values = column.flatten().to_numpy(zero_copy_only=False)
            return torch.from_numpy(np.array(values).reshape(len(column), int(lengths[0])))  # own, writable
    return column.to_pylist()


def _key_of(cache: ShardCache, shard: int, offset: int) -> str | None:
    try:
        reader = cache._open.get(shard)
        if reader is not None and not isinstance(reader, ArrowShard):
            return reader.keys[offset]
    except (IndexError, AttributeError):
        pass
    return None


__all__ = ["ShardDataset", "open_dataset", "resolve_rank"]
