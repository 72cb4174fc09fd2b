"""``ShardMap``: the map-style sibling of ``ShardDataset``: ``len``, ``m[i]`` in manifest order, ``get(key)``.

Sample ``i`` is the ``i``-th of the dataset's shards in manifest order, samples in shard order: the
``i``-th sample an unshuffled ``ShardDataset`` epoch yields, decoded and transformed the same way.
Any ``torch.utils.data.Sampler`` can then choose the order (``WeightedRandomSampler`` for class
balance, ``DistributedSampler``, curricula). Local shards are read in place through memory maps;
remote ones one sample at a time by ranged reads checked against the sample index's sha256, or
whole into the host's cache once reads of a shard are dense (see :mod:`.sparse`); Parquet files by
row group. What a process opens stays in it: the map pickles without it, and a process that finds
itself forked opens its own. Threads may share a map (a thread pool fetching samples, a thread-based
loader): what a process has open is made once, and changes under locks.
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..errors import ShardstreamError, TransformError, UsageError, sample_name
from ..manifest.sample_set import SampleSet
from ..sizes import parse_size
from ..storage import ShardFetcher
from ..storage.settings import DEFAULT, StorageSettings
from .samples.decode import Decoder, DecodeSpec, FieldSpec, written_types
from .shard_pass import Stored, StoredDataset, open_stored
from .shards.media_ranges import PARTIAL_MEDIA, MediaRanges
from .shards.readers import OpenShards
from .shards.sparse import SparseReads
from .tokens import TokenDataset


@dataclass
class _Opened:
    """What one process has open of a map: its shards, its ranged reads, the keys found so far."""

    pid: int
    shards: OpenShards
    sparse: SparseReads
    keys: dict[str, int] = field(default_factory=dict)  # key -> index, shard by shard in order
    scanned: int = 0  # shards whose keys are in ``keys``
    scanning: threading.Lock = field(default_factory=threading.Lock)  # over keys and scanned


_OPENING = threading.Lock()  # one _Opened per process, however many threads read a map at once


def _new_lock_after_fork() -> None:
    global _OPENING
    _OPENING = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_after_fork)


def open_map_dataset(
    url: str | os.PathLike[str], storage: StorageSettings, version: int | None = None
) -> Stored:
    """The stored dataset a map reads: its latest version, or ``version``."""
    return open_stored(url, storage, version)


class ShardMap(StoredDataset, Dataset):
    """Random access to a shardstream dataset: ``len(m)``, ``m[i]``, ``m.get(key)``.

    Args:
        url: a dataset folder or its ``_manifest.json`` (any fsspec URL).
        decode: as for :class:`~shardstream.dataset.ShardDataset` (default ``"torch"``).
        fields: the fields to read (default: all), as for ``ShardDataset``.
        transform: a function of each sample dict, as for ``ShardDataset``.
        seq_len: token datasets only: ``m[i]`` is window ``i`` of ``seq_len + 1`` tokens
            (``input_ids``, ``labels``, ``position_ids``), as ``TokenDataset`` reads it.
        verify_checksums: check each local shard's sha256 against the manifest once per host
            before reading it (remote bytes are always checked).
        storage: remote-storage settings as one ``StorageSettings``.
        storage_options: fsspec options (``StorageSettings.options``).
        cache_dir: the host's shard cache (``StorageSettings.cache_dir``).
        cache_limit: bytes the host's shard cache may hold (``StorageSettings.cache_limit``).
        retries: attempts after a transient error, for each request (``StorageSettings.retries``).
        timeout: seconds one request may take (``StorageSettings.timeout``). These are
            ``ShardDataset``'s storage keywords but ``prefetch``: a map reads nothing ahead.
        version: the dataset's version to read (default: the latest), as for ``ShardDataset``.
        partial_media: a video or audio field of a remote shard decoded by a media clip
            (``VideoClip``, ``AudioClip``) and of at least this many bytes (an int or a size like
            ``"8MiB"``, which is the default) is read by the 1 MiB blocks the clip needs, each
            checked against its digest recorded at pack time, instead of whole; None: always whole.
    """

    def __init__(  # noqa: PLR0913 - keyword settings with defaults, as ShardDataset's
        self,
        url: str | os.PathLike[str],
        *,
        decode: DecodeSpec = "torch",
        fields: FieldSpec = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        seq_len: int | None = None,
        storage: StorageSettings | None = None,
        storage_options: dict[str, Any] | None = DEFAULT,
        cache_dir: str | os.PathLike[str] | None = DEFAULT,
        cache_limit: int | str | None = DEFAULT,
        retries: int = DEFAULT,
        timeout: float | None = DEFAULT,
        verify_checksums: bool = False,
        version: int | None = None,
        partial_media: int | str | None = PARTIAL_MEDIA,
    ):
        storage = StorageSettings.combine(
            storage,
            options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            retries=retries,
            timeout=timeout,
        )
        self.tokens: TokenDataset | None = None
        if seq_len is not None:
            self.tokens = TokenDataset(
                url,
                seq_len,
                shuffle=False,
                rank=0,
                world_size=1,
                storage=storage,
                verify_checksums=verify_checksums,
                version=version,
            )
            self._stored, self.samples = self.tokens.stored, self.tokens.sample_set
        else:
            self._stored = open_map_dataset(url, storage, version)
            self.samples = self.stored.samples
            if self.manifest.shard_format == "tokens":
                raise UsageError(
                    f"{self.store.url} is a token dataset: give seq_len= to read its windows"
                )
        self.decoder = Decoder(decode, fields, written_types(self.manifest))
        self.decoder.check_fields(
            [f["name"] for f in self.manifest.fields if "name" in f], self.store.url
        )
        self.transform = transform
        self.verify_checksums = bool(verify_checksums)
        self.partial_media = (
            None if partial_media is None else parse_size(partial_media, "partial_media")
        )
        self._opened: _Opened | None = None

    @property
    def sample_set(self) -> SampleSet:
        """The samples ``m[i]`` reads (:func:`~shardstream.manifest.sample_set.samples_of`): a split's
        selected ones, a token dataset's windows, each merged shard's labels relabelled."""
        return self.samples

    def __len__(self) -> int:
        return self.samples.total

    def __repr__(self) -> str:
        return f"ShardMap({self.store.url!r}, {len(self):,} samples)"

    def __getstate__(self) -> dict[str, Any]:
        # open shards, maps and connections stay in this process
        return {**self.__dict__, "_opened": None}

    # -- reading -----------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Any:
        if self.tokens is not None:
            return self.__getitems__([index])[0]
        shard, offset = self.locate(index)  # one sample: no arrays to make
        opened = self._open()
        opened.shards.forget_failures()  # a shard that failed is tried again by the next read
        row = offset
        if self.samples.selected:
            row = int(self.samples.stored_rows(np.array([shard]), np.array([offset]))[0])
        return self._finish(opened.sparse.read([(shard, row)])[0], shard, row)

    def __getitems__(self, indexes: list[int]) -> list[Any]:
        """The samples at ``indexes`` (a DataLoader's batch of a sampler's indexes: located in one step,
        each shard's read in one call, remote ones fetched together)."""
        ids, offsets = self._locate_arrays(indexes)
        if not len(ids):
            return []
        if self.tokens is not None:
            rows = self.tokens.windows(self.tokens.open_shards(), ids, offsets)
            return [{k: v[j] for k, v in rows.items()} for j in range(len(ids))]
        opened = self._open()
        opened.shards.forget_failures()  # a shard that failed is tried again by the next read
        rows = self.samples.stored_rows(ids, offsets).tolist()
        located = list(zip(ids.tolist(), rows))
        stored = opened.sparse.read(located)
        if self.transform is None and self.decoder.keeps_bytes and not self.samples.relabels:
            return stored  # raw bytes as stored: nothing to do to a sample
        return [self._finish(s, shard, row) for s, (shard, row) in zip(stored, located)]

    def locate_many(self, indexes: list[int]) -> list[tuple[int, int]]:
        """:meth:`locate` of each index (at once: a sampler's batch)."""
        shards, offsets = self._locate_arrays(indexes)
        return list(zip(shards.tolist(), offsets.tolist()))

    def _locate_arrays(self, indexes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate_many` as two arrays, shards and offsets (a vectorised step)."""
        if all(type(i) is int for i in indexes):  # a sampler's (no bool: its type is not int)
            try:
                found = np.array(indexes, dtype=np.int64)
            except OverflowError:
                found = None
        else:
            try:
                found = np.asarray([_index(i) for i in indexes], dtype=np.int64)
            except (TypeError, OverflowError):
                found = None
        if found is None:  # says which index is wrong, and how
            pairs = [self.locate(i) for i in indexes]
            return np.array([s for s, _ in pairs], np.int64), np.array(
                [o for _, o in pairs], np.int64
            )
        n = len(self)
        bad = np.flatnonzero((found < -n) | (found >= n))
        if len(bad):
            self.locate(indexes[int(bad[0])])  # raises IndexError naming it
        return self.samples.locate_many(found)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, sample of the dataset within the shard) of sample ``index`` (negative counts from the
        end); ``IndexError`` outside, ``TypeError`` for what is no integer (``True`` included)."""
        try:
            return self.samples.locate(_index(index))
        except IndexError:
            raise IndexError(
                f"sample {index} is out of range: {self.store.url} has {len(self):,} samples"
            ) from None

    def get(self, key: str) -> Any:
        """The sample whose ``__key__`` is ``key`` (the first, if several); ``KeyError`` if none."""
        return self[self.index_of(key)]

    def index_of(self, key: str) -> int:
        """The index of the sample whose ``__key__`` is ``key``; shards are scanned in order, once per
        process, only as far as the key (their keys come from sample indexes or headers, not samples)."""
        opened = self._open()
        # one thread at a time: a shard counts as scanned once its keys are all in
        with opened.scanning:
            found = opened.keys.get(key)
            while found is None and opened.scanned < self.manifest.num_shards:
                shard = opened.scanned
                first = self.samples.first(shard)
                for j, k in enumerate(self.keys_of(shard)):
                    opened.keys.setdefault(k, first + j)
                opened.scanned += 1
                found = opened.keys.get(key)
        if found is None:
            raise KeyError(f"no sample with key {key!r} in {self.store.url}")
        return found

    def keys_of(self, shard: int) -> list[str]:
        """The keys of shard ``shard``'s samples in the dataset (a split's selected ones), in order."""
        stored = self._stored_keys(shard)
        if not self.samples.selected:
            return list(stored)
        return [stored[row] for row in self.samples.stored_rows_of(shard).tolist()]

    def _stored_keys(self, shard: int) -> list[str]:
        """The keys of every sample shard ``shard`` stores."""
        m = self.manifest
        if self.tokens is not None:
            raise UsageError(f"{self.store.url} is a token dataset: its windows have no keys")
        if m.shard_format in ("arrow", "parquet"):
            if not any(f.get("name") == "__key__" for f in m.fields):
                raise KeyError(
                    f"{self.store.url} has no __key__ column; look its samples up by index"
                )
            return self._open().shards.get_whole(shard).column("__key__")
        opened = self._open()
        index = opened.sparse.index(shard) if not self.store.local else None
        if index is not None and not opened.shards.is_open(shard):
            return index.samples(self.store.url_of(m.paths[shard]))[0]
        return list(opened.shards.get_whole(shard).keys)

    def keys(self) -> Iterator[str]:
        """Every sample's key, in order (``shardstream ls --keys``)."""
        for shard in range(self.manifest.num_shards):
            yield from self.keys_of(shard)

    def _open(self) -> _Opened:
        """This process's open shards (made again in a process forked from the one that made them)."""
        opened = self._opened
        if opened is None or opened.pid != os.getpid():
            with _OPENING:  # threads that find none at once share the one made first
                opened = self._opened
                if opened is None or opened.pid != os.getpid():
                    fetcher = ShardFetcher(
                        self.store,
                        self.manifest,
                        self.disk_cache,
                        verify_local=self.verify_checksums,
                    )
                    shards = OpenShards(self.store, self.manifest, fetcher=fetcher)
                    sparse = SparseReads(shards)
                    if self.partial_media is not None and self.manifest.media is not None:
                        sparse.media = MediaRanges(
                            self.store,
                            self.manifest,
                            lambda name: self.decoder.clip_for(name) is not None,
                            self.partial_media,
                            sparse.count,
                        )
                    opened = self._opened = _Opened(os.getpid(), shards, sparse)
        return opened

    def _finish(self, stored: dict[str, Any], shard: int, offset: int) -> Any:
        """A stored sample decoded and transformed, as ``ShardDataset`` does; errors name the sample."""
        key = stored.get("__key__")  # (what a transform does to the sample leaves its name)
        if self.samples.relabels:  # a merge's labels, mapped to its class list
            stored = self.samples.labeled(dict(stored), shard, self._where(key, shard, offset))
        if self.decoder.keeps_bytes:  # raw bytes: the decoder would hand every field back as it is
            sample = stored
        else:
            try:
                sample = self.decoder(stored)
            except UsageError:
                raise
            except ShardstreamError as exc:
                url = self.store.url_of(self.manifest.paths[shard])
                raise type(exc)(f"{url}: {sample_name(offset, key)}: {exc}") from exc
        if self.transform is None:
            return sample
        try:
            return self.transform(sample)
        except Exception as exc:
            raise TransformError(
                f"the transform raised {type(exc).__name__} on {self._where(key, shard, offset)}: "
                f"{exc}; fix the transform (or catch the error in it)"
            ) from exc

    def _where(self, key: str | None, shard: int, offset: int) -> str:
        """Sample ``offset`` of ``shard`` (key ``key``) named for a message: made only when one is."""
        url = self.store.url_of(self.manifest.paths[shard])
        return f"{sample_name(offset, key)} of {url}"


def _index(index: Any) -> int:
    """``index`` as a sample index: an integer, never a bool (``m[True]`` would read sample 1)."""
    if isinstance(index, (bool, np.bool_)):
        raise TypeError(
            f"sample indexes are integers, not {type(index).__name__} ({index!r}); "
            "give m[int], or select samples with a sampler"
        )
    return operator.index(index)


__all__ = ["ShardMap"]
