"""The indexed shard reader: one shard opened once, its samples found by offset.

A tar shard's headers are parsed once into an index of (key, field offsets); a sample
is then a few slices of the shard's buffer (a memory map for local files), with no
``tarfile`` and no copy until the caller asks for bytes. Arrow shards use the IPC
file's record-batch directory; Parquet files are read row group by row group (remote ones larger than
:data:`RANGED_PARQUET_BYTES` by ranged reads of their footer and row groups, each checked against
the shard's row-group index). Readers are cached per process, as many as the shuffle
window reads at once; their bytes come from :mod:`shardstream.storage.fetch` (a local map,
or a checked download).
"""

from __future__ import annotations

import hashlib
import mmap
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ...errors import CorruptShardError
from ...formats import TAR_COMPRESSION
from ...formats import checksums as checksums_format
from ...formats import parquet as parquet_format
from ...formats import tar as tar_format
from ...formats.arrow_checksums import damaged_rows, parse_checksums
from ...formats.checksums import checksum, mismatch
from ...formats.compression import decompress
from ...formats.index_batches import BatchEntries
from ...formats.tar_index import SampleIndex
from ...manifest import Manifest
from ...manifest.side_names import index_name
from ...storage import DiskCache, Prefetcher, ShardFetcher, Store
from .checked_index import check_index_once
from .integrity import unchecked
from .mapped import FileIdentity, MappedBytes, file_identity, release_stale_maps  # noqa: F401 - their names here
from .ranged import PartialShard, RangedReads
from .tar_indexes import SampleIndexes, read_stored_indexes


class TarShard:
    """Random access to the samples of one tar shard. ``identity``: the version of the local file
    ``data`` maps (:func:`file_identity`); ``owned``: bytes it holds in memory (decompressed). With a
    version 3 ``index``, every value handed out is checked against its member's checksum first
    (:class:`~shardstream.errors.CorruptSampleError` naming the shard, the sample and the field)."""

    def __init__(
        self,
        data,
        name: str,
        expected_samples: int,
        identity: FileIdentity | None = None,
        index: SampleIndex | None = None,
    ):
        self.name = name
        # the shard's sample index (checked against the manifest) says what its headers would, without parsing them
        # (each sample's key and fields from one parse of its names: :meth:`locate`)
        self.indexed = index.indexed(name) if index is not None else None
        self.batches = BatchEntries(self.indexed) if self.indexed is not None else None
        if self.indexed is not None:
            self.keys, self.fields = self.indexed.columns()
        else:  # with sparse members, the samples are in a copy of the tar followed by their bytes
            found = tar_format.read_samples(data, name)
            self.keys, self.fields, data = found.keys, found.fields, found.data
        self.data = data
        self.identity = identity
        self.owned = len(data) if isinstance(data, (bytes, bytearray)) else 0
        self.view = memoryview(data)
        # each member's checksum and each sample's first member (a version 3 index); None: unchecked
        self.sums: list[int] | None = None
        self.first: list[int] = []
        if index is not None and index.checksums is not None:
            assert self.indexed is not None
            self.sums, self.first = index.checksums.tolist(), self.indexed.first
        if len(self.keys) != expected_samples:
            raise CorruptShardError(
                f"{name}: {len(self.keys)} samples, the manifest says {expected_samples}; "
                "the shard or the manifest was replaced, re-create the manifest or the shard"
            )

    def sample(self, i: int) -> dict[str, Any]:
        view = self.view
        key, fields = self.locate(i)
        sample: dict[str, Any] = {"__key__": key}
        for ext, (offset, size) in fields.items():
            sample[ext] = bytes(view[offset : offset + size])
        if self.sums is not None and checksums_format.CHECK_ON_READ:
            self.check(i % len(self.keys), sample)
        return sample

    row = sample  # one sample read at random: the same

    def read_many(self, rows: list[int]) -> list[dict[str, Any]]:
        """:meth:`sample` of each of ``rows`` (a batch of a sampler's, in its order): their index entries
        gathered in one step, each read once, and every value checked as :meth:`sample` checks it."""
        indexed = self.indexed
        if indexed is None:
            return [self.sample(i) for i in rows]
        if not rows:
            return []
        n = len(indexed)
        if min(rows) < 0 or max(rows) >= n:
            rows = [i + n if -n <= i < 0 else i for i in rows]
            for i in rows:
                if not 0 <= i < n:
                    raise IndexError(f"sample {i} of {n}")
        data = self.data
        if not isinstance(data, (bytes, mmap.mmap)):  # a slice of it would be no bytes object
            data = self.view
        found = self.batches.many(rows)
        check = self.sums is not None and checksums_format.CHECK_ON_READ
        out = []
        for key, fields, numbers in zip(found.keys, found.fields, found.numbers):
            sample: dict[str, Any] = {"__key__": key}
            k = 2
            for ext in fields:
                offset = numbers[k]
                value = sample[ext] = data[offset : offset + numbers[k + 1]]
                if check and checksum(value) != numbers[k + 2]:
                    raise mismatch(self.name, rows[len(out)], key, ext)
                k += 3
            out.append(sample)
        return out

    def locate(self, i: int) -> tuple[str, dict[str, tuple[int, int]]]:
        """The i-th sample's key and its fields' (offset, size) in the shard (its index entry read once)."""
        indexed = self.indexed
        if indexed is None:
            return self.keys[i], self.fields[i]
        n = len(indexed)
        if not 0 <= i < n:
            if not -n <= i < 0:
                raise IndexError(f"sample {i} of {n}")
            i += n
        return indexed.sample(i)

    def views(self, i: int) -> dict[str, Any]:
        """Like :meth:`sample`, with ``memoryview`` slices of the shard instead of copies."""
        view = self.view
        key, fields = self.locate(i)
        sample: dict[str, Any] = {"__key__": key}
        for ext, (offset, size) in fields.items():
            sample[ext] = view[offset : offset + size]
        if self.sums is not None and checksums_format.CHECK_ON_READ:
            self.check(i % len(self.keys), sample)
        return sample

    def check(self, i: int, values: dict[str, Any]) -> None:
        """Raise :class:`~shardstream.errors.CorruptSampleError` unless ``values`` (sample ``i``: its key,
        then its fields in member order, as :meth:`sample` gives them) match their members' checksums."""
        sums, j = self.sums, self.first[i]
        assert sums is not None
        for ext, value in values.items():
            if ext != "__key__":
                if checksum(value) != sums[j]:
                    raise mismatch(self.name, i, self.keys[i], ext)
                j += 1

    def intact(self, i: int, fields: dict[str, tuple[int, int]]) -> bool:
        """Whether sample ``i``'s ``fields`` (:meth:`locate`'s, in member order) match their checksums, read
        in place (True without checksums)."""
        sums = self.sums
        if sums is None:
            return True
        view, j = self.view, self.first[i]
        for offset, size in fields.values():
            if checksum(view[offset : offset + size]) != sums[j]:
                return False
            j += 1
        return True


class CheckedRows:
    """What an Arrow or Parquet shard hands out, checked: rows whose values differ from their checksums
    (:attr:`damaged`: row -> fields) raise :class:`~shardstream.errors.CorruptSampleError` naming the shard,
    the row's key and the fields; the others read."""

    name: str
    damaged: dict[int, list[str]]
    checksums_in = "its record batch's metadata"  # where the checksums are, for messages

    def key(self, i: int) -> Any:
        raise NotImplementedError

    def error(self, i: int) -> Exception:
        """The error of damaged row ``i``."""
        fields = self.damaged[i]
        return mismatch(self.name, i, self.key(i), ", ".join(fields), self.checksums_in)

    def check_row(self, i: int) -> None:
        if self.damaged and i in self.damaged:
            raise self.error(i)

    def failures(self, rows: Any) -> list[tuple[int, Exception]]:
        """(position in ``rows``, its error) of each damaged row among ``rows`` (row numbers)."""
        if not self.damaged:
            return []
        return [
            (k, self.error(r)) for k, r in enumerate(np.asarray(rows).tolist()) if r in self.damaged
        ]

    def check_rows(self, rows: Any) -> None:
        found = self.failures(rows)
        if found:
            raise found[0][1]

    def check_field(self, name: str) -> None:
        """Raise for the first damaged row whose field ``name`` differs."""
        for i, fields in sorted(self.damaged.items()):
            if name in fields:
                raise self.error(i)


class ArrowShard(CheckedRows):
    """Random access to the rows of one Arrow IPC shard; whole batches by ``take``. Every row handed out
    was checked against its record batch's checksums when the shard was read (see :class:`CheckedRows`);
    :attr:`checked`: the shard has checksums."""

    def __init__(self, data, name: str, expected_samples: int):
        from ...formats import arrow as arrow_format

        self.name = name
        self.table, damaged = arrow_format.read_checked(data, name, checksums_format.checking())
        self.checked, self.damaged = damaged is not None, damaged or {}
        if self.table.num_rows != expected_samples:
            raise CorruptShardError(
                f"{name}: {self.table.num_rows} rows, the manifest says {expected_samples}; "
                "the shard or the manifest was replaced"
            )
        # decompressed buffers (at most: those of an uncompressed file are mapped)
        self.owned = self.table.nbytes
        self._columns: dict[str, list[Any]] | None = None

    def sample(self, i: int) -> dict[str, Any]:
        self.check_row(i)
        if self._columns is None:  # one conversion per shard, not per row
            self._columns = self.table.to_pydict()
        return {name: values[i] for name, values in self._columns.items()}

    views = sample

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` alone (a random read: no conversion of the whole shard)."""
        self.check_row(i)
        return self.table.slice(i, 1).to_pylist()[0]

    def rows(self, start: int, count: int) -> Any:
        """Rows ``start`` to ``start + count`` as a table (a zero-copy slice)."""
        if self.damaged:
            self.check_rows(np.arange(start, start + count))
        return self.table.slice(start, count)

    def column(self, name: str) -> list[Any]:
        """One column's values."""
        if self.damaged:
            self.check_field(name)
        return self.table.column(name).to_pylist()

    def take(self, rows):
        if self.damaged:
            self.check_rows(rows)
        return self.table.take(rows)

    def key(self, i: int) -> Any:
        """Row ``i``'s ``__key__``, or None without that column."""
        if "__key__" not in self.table.column_names:
            return None
        return self.table.column("__key__")[i].as_py()


class ParquetShard(CheckedRows):
    """Random access to the rows of one Parquet file, read row group by row group (each read once and
    kept while the shard is open). ``fill(g)``: brings row group ``g``'s bytes before it is read (ranged
    reads of a remote file; ``None`` when the file is here whole). ``checksums``: each row group's value
    checksums from its row-group index (version 2), against which each row group is checked as it is read
    (see :class:`CheckedRows`); None: the file has none."""

    checksums_in = "its row-group index"

    def __init__(
        self,
        file: Any,
        name: str,
        expected_samples: int,
        fill: Callable[[int], None] | None = None,
        checksums: list[dict[str, Any]] | None = None,
    ):
        self.name, self.file, self.fill = name, file, fill
        self.checksums = checksums if checksums_format.checking() else None
        self.damaged: dict[int, list[str]] = {}
        metadata = file.metadata
        if metadata.num_rows != expected_samples:
            raise CorruptShardError(
                f"{name}: {metadata.num_rows} rows, the manifest says {expected_samples}; the file "
                "or the manifest was replaced, run 'shardstream index' again"
            )
        rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        self.first = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self.owned = 0  # decoded row groups held
        self._groups: dict[int, Any] = {}
        self._reading = threading.Lock()  # one row group read at a time (threads sharing a map)
        self._columns: tuple[int, dict[str, list[Any]]] | None = None
        self._whole: Any = None  # every row group, as one table (see table)

    def group(self, g: int) -> Any:
        """Row group ``g`` as a table (read once, by one thread: the others wait for it)."""
        found = self._groups.get(g)
        if found is None:
            with self._reading:
                found = self._groups.get(g)
                if found is None:
                    if self.fill is not None:
                        self.fill(g)
                    found = parquet_format.read_group(self.file, g, self.name)
                    if self.checksums is not None:
                        self._check_group(g, found)
                    self._groups[g] = found
                    self.owned += found.nbytes
        return found

    def _check_group(self, g: int, table: Any) -> None:
        """Note the rows of row group ``g`` (read as ``table``) whose values differ from their checksums."""
        where = f"{self.name} (row group {g})"
        assert self.checksums is not None
        sums, rows = parse_checksums(self.checksums[g], table.num_columns, table.num_rows, where)
        first = int(self.first[g])
        for row, fields in damaged_rows(table, sums, rows).items():
            self.damaged[first + row] = fields

    def failures(self, rows: Any) -> list[tuple[int, Exception]]:
        rows = np.asarray(rows, dtype=np.int64)
        for g in np.unique(np.searchsorted(self.first, rows, side="right") - 1).tolist():
            self.group(int(g))  # read (and checked) first
        return super().failures(rows)

    def where(self, i: int) -> tuple[int, int]:
        """(row group, row within it) of row ``i``."""
        g = int(np.searchsorted(self.first, i, side="right")) - 1
        return g, i - int(self.first[g])

    def sample(self, i: int) -> dict[str, Any]:
        g, at = self.where(i)
        # one conversion per row group, not per row (read once here: another thread may replace it)
        columns = self._columns
        if columns is None or columns[0] != g:
            columns = self._columns = (g, self.group(g).to_pydict())
        self.check_row(i)
        return {name: values[at] for name, values in columns[1].items()}

    views = sample

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` alone (a random read: its row group is read, not converted whole)."""
        g, at = self.where(i)
        found = self.group(g).slice(at, 1).to_pylist()[0]
        self.check_row(i)
        return found

    def key(self, i: int) -> Any:
        """Row ``i``'s ``__key__``, or None without that column (its row group is read)."""
        if "__key__" not in self.file.schema_arrow.names:
            return None
        g, at = self.where(i)
        return self.group(g).column("__key__")[at].as_py()

    @property
    def table(self) -> Any:
        """All the rows (every row group read; put together once)."""
        import pyarrow as pa

        if self._whole is None:
            groups = [self.group(g) for g in range(len(self.first) - 1)]
            self._whole = (
                pa.concat_tables(groups) if groups else self.file.schema_arrow.empty_table()
            )
        return self._whole

    def rows(self, start: int, count: int) -> Any:
        """Rows ``start`` to ``start + count`` as a table (a slice of all of them)."""
        found = self.table.slice(start, count)
        if self.damaged:
            self.check_rows(np.arange(start, start + count))
        return found

    def column(self, name: str) -> list[Any]:
        """One column's values, row group by row group."""
        found = [
            v for g in range(len(self.first) - 1) for v in self.group(g).column(name).to_pylist()
        ]
        if self.damaged:
            self.check_field(name)
        return found

    def take(self, rows: Any) -> Any:
        """The rows ``rows`` (an Arrow or numpy array of row numbers), reading only their row groups."""
        import pyarrow as pa

        rows = np.asarray(rows, dtype=np.int64)
        groups = np.searchsorted(self.first, rows, side="right") - 1
        used = np.unique(groups)
        tables = [self.group(int(g)) for g in used]
        if self.damaged:
            self.check_rows(rows)
        starts = np.concatenate([[0], np.cumsum([len(t) for t in tables])])[:-1]
        local = rows - self.first[groups] + starts[np.searchsorted(used, groups)]
        return pa.concat_tables(tables).take(pa.array(local))


# remote Parquet files larger than this are read by row group (ranged reads), not downloaded whole
RANGED_PARQUET_BYTES = 64 << 20


def load_sample_index(fetcher: ShardFetcher, manifest: Manifest, shard: int) -> SampleIndex | None:
    """Tar shard ``shard``'s stored sample index (``.shardstream/<shard>.idx``), checked against the manifest's sha256
    (a remote one through the host's cache: once per host); None when it has none or it does not check
    (the tar is read whole instead, which builds one or says what is wrong)."""
    return SampleIndexes(fetcher.store, manifest, fetcher).stored([shard])[shard]


def parquet_row_index(
    fetcher: ShardFetcher, manifest: Manifest, shard: int
) -> parquet_format.RowIndex | None:
    """Parquet shard ``shard``'s row-group index (``.shardstream/<file>.idx``), checked against the manifest's sha256
    and parsed; None when the manifest names none (or it raises: see :func:`ranged_parquet`)."""
    digests = getattr(manifest, "index_sha256", None)
    if not digests or not digests[shard]:
        return None
    (data,) = read_stored_indexes(fetcher, [manifest.paths[shard]], [digests[shard]])
    if data is None:
        raise CorruptShardError(
            f"{fetcher.store.url_of(manifest.paths[shard])}: its row-group index is missing or is not "
            "the one the manifest names; run 'shardstream index' again"
        )
    name = index_name(manifest.paths[shard])
    rows, size = int(manifest.stored_counts[shard]), int(manifest.nbytes[shard])
    return parquet_format.parse_row_index(data, fetcher.store.url_of(name), rows, size)


def local_parquet(fetcher: ShardFetcher, manifest: Manifest, shard: int, data: Any) -> ParquetShard:
    """A local Parquet shard (``data``: its memory map) whose bytes are checked as they are read, as a
    remote file's ranged reads are: its footer against the row-group index's sha256 now, each row group
    against its sha256 when first read, and (a version 2 index) each row group's values against their
    checksums, which name a damaged row and field (a row group whose bytes differ is then read, and only
    the rows whose values differ fail). Without a row-group index that checks (none was written, or it
    changed), the whole file against the manifest's sha256, once per host for each version of it; with
    ``verify_checksums``, that too."""
    where, rows = fetcher.store.url_of(manifest.paths[shard]), int(manifest.stored_counts[shard])
    try:
        index = parquet_row_index(fetcher, manifest, shard)
    except Exception:  # the whole file is checked instead
        index = None
    if index is None or fetcher.verify_local:
        data = fetcher.checked_local(shard)
    if index is None:
        return ParquetShard(parquet_format.open_file(data, where), where, rows)
    start, end = index.footer
    with memoryview(data) as whole, whole[start:end] as footer:
        same = (
            parquet_format.footer_span(whole, where) == index.footer
            and hashlib.sha256(footer).hexdigest() == index.footer_sha256
        )
    if not same:
        raise CorruptShardError(
            f"{where}: its Parquet footer (schema, row groups, statistics) differs from the one "
            "'shardstream index' recorded: the file was changed after indexing; run 'shardstream "
            "index' again"
        )

    def fill(g: int) -> None:
        first, last = index.spans[g]
        with memoryview(data) as whole, whole[first:last] as group:
            try:
                parquet_format.check_span(group, index.sha256[g], where, f"row group {g}")
            except CorruptShardError:
                if index.checksums is None:
                    raise  # else its values are checked one by one, and the damaged ones named

    checked = index.checksums is not None  # (then pages need no CRC: the values are checked)
    file = parquet_format.open_file(data, where, page_checksums=not checked)
    reader = ParquetShard(file, where, rows, fill, index.checksums)
    return _with_index_rows(reader, index, where)


def _with_index_rows(
    reader: ParquetShard, index: parquet_format.RowIndex, where: str
) -> ParquetShard:
    if [int(n) for n in np.diff(reader.first)] != index.rows:
        raise CorruptShardError(
            f"{where}: its row groups differ from its row-group index; run 'shardstream index' again"
        )
    return reader


def ranged_parquet(fetcher: ShardFetcher, manifest: Manifest, shard: int) -> ParquetShard | None:
    """A remote Parquet shard read by row group: its checked row-group index and footer now, each row
    group by one ranged GET when first read, checked against its sha256; None without an index."""
    where, size = fetcher.store.url_of(manifest.paths[shard]), int(manifest.nbytes[shard])
    rows = int(manifest.stored_counts[shard])

    def span(start: int, end: int, digest: str) -> bytes:
        (found,) = fetcher.read_spans([shard], [start], [end], [bytes.fromhex(digest)])
        return found

    try:
        index = parquet_row_index(fetcher, manifest, shard)
        if index is None:
            return None
        footer = span(*index.footer, index.footer_sha256)
        metadata = parquet_format.metadata_of(footer, where)
    except Exception:  # the whole file is read instead, checked against the manifest
        return None
    pieces: dict[int, Any] = {index.footer[0]: footer}

    def fill(g: int) -> None:
        start, end = index.spans[g]
        if start not in pieces:
            pieces[start] = span(start, end, index.sha256[g])

    source = parquet_format.SpansFile(size, pieces, where)
    file = parquet_format.open_file(source, where, metadata)
    reader = ParquetShard(file, where, rows, fill, index.checksums)
    return _with_index_rows(reader, index, where)


Shard = TarShard | ArrowShard | ParquetShard  # an open shard of any format

# bytes of decompressed shards a process keeps open beyond those the plan needs
DECOMPRESSED_LIMIT = 1 << 30


def window_span(counts: np.ndarray, window: int) -> int:
    """The most shards that ``window`` consecutive positions of an epoch's order can touch
    (the smallest shards laid end to end, plus one cut at each end)."""
    sizes = np.sort(counts[counts > 0])
    if len(sizes) == 0:
        return 1
    whole = int(np.searchsorted(np.cumsum(sizes), window, side="right"))
    return min(whole + 2, len(sizes))


class OpenShards:
    """The shards this process has open (indexed, ready to read), least recently used dropped first.

    Shards come from a :class:`~shardstream.storage.ShardFetcher`, or from ``take`` while a
    :class:`~shardstream.storage.Prefetcher` loads them ahead (it calls :meth:`load`). At most
    ``capacity`` shards stay open (see :meth:`fit_window`), and of the shards held in memory
    (decompressed) at most ``max_owned`` bytes beyond those :meth:`retain` says the plan needs
    next; shards the plan needs are never dropped to make room (that would decompress them again
    per sample). Threads may share one (a :class:`~shardstream.dataset.shard_map.ShardMap` used by
    several): what is open changes under a lock, never while another thread goes through it; a shard
    two threads open at once is kept once.
    """

    def __init__(
        self,
        store: Store,
        manifest: Manifest,
        capacity: int = 16,
        fetcher: ShardFetcher | None = None,
        max_owned: int = DECOMPRESSED_LIMIT,
        index_cache: Callable[[], DiskCache] | None = None,
    ):
        self.store = store
        self.manifest = manifest
        self.capacity = capacity
        self.max_owned = max_owned
        self.fetcher = fetcher or ShardFetcher(store, manifest)
        self.indexes = SampleIndexes(store, manifest, self.fetcher, index_cache)
        self.take: Callable[[int], Shard] | None = None
        self._open: OrderedDict[int, Shard] = OrderedDict()
        self._needed: set[int] = set()  # what the plan reads next (retain): never dropped for room
        self._failed: dict[
            int, BaseException
        ] = {}  # this pass's shards that failed: not fetched again per sample
        self._fitted: int | None = None
        self._lock = threading.RLock()  # over _open, _needed and _failed
        self.ranged: RangedReads | None = None  # a remote dataset's first samples by ranged reads
        self.partial: dict[int, PartialShard] = {}  # this batch's samples fetched so

    def attach(self, prefetcher: Prefetcher[Any], ranged: RangedReads | None = None) -> None:
        """Take shards from ``prefetcher`` (which loads them ahead with :meth:`load`) while a pass reads
        remote shards, and with ``ranged`` a pass's first samples by ranged reads; until :meth:`detach`."""
        self.take = self.timed(prefetcher.take)
        self.ranged = ranged

    def detach(self) -> None:
        """Load shards here again, whole (the pass that attached a prefetcher ended)."""
        self.take = self.ranged = None

    def timed(self, take: Callable[[int], Any]) -> Callable[[int], Any]:
        """``take`` as it is (a reader that counts its waits on the prefetcher wraps it)."""
        return take

    def fit_window(self, window: int) -> None:
        """Keep open as many shards as a shuffle window of ``window`` samples reads at once, and the
        next window's (at least 16): fewer would close and re-index shards sample by sample."""
        if window != self._fitted:
            self.capacity = max(
                16, 2 * window_span(np.asarray(self.manifest.stored_counts), window) + 1
            )
            self._fitted = window

    @property
    def owned(self) -> int:
        """Bytes the open shards hold in memory (decompressed), not in maps of files."""
        with self._lock:
            return sum(reader.owned for reader in self._open.values())

    def prepare(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        """Before a batch: fetch its samples whose shards have not arrived by ranged reads, when
        :attr:`ranged` is set (see :mod:`.ranged`); :meth:`get` hands them out for this batch."""
        self.partial = (
            {}
            if self.ranged is None
            else self.ranged.fetch(ids, offsets, self._open.__contains__, self.get_whole)
        )

    def get(self, shard: int) -> Shard | PartialShard:
        with self._lock:
            found = self._open.get(shard)
            if found is not None:
                self._open.move_to_end(shard)
                return found
        return self.partial.get(shard) or self.get_whole(shard)

    def get_whole(self, shard: int) -> Shard:
        """Shard ``shard`` opened whole (loaded, or taken from the prefetcher)."""
        with self._lock:
            found = self._open.get(shard)
            if found is not None:
                return found
            failure = self._failed.get(shard)
        if failure is not None:
            raise failure.with_traceback(None)
        try:  # not under the lock: other threads read the shards that are open meanwhile
            opened = self.take(shard) if self.take is not None else self._load(shard)
        except Exception as exc:
            with self._lock:
                self._failed[shard] = exc
            raise
        with self._lock:
            opened = self._open.setdefault(shard, opened)  # (another thread's, if it was first)
            self._make_room(shard)
        return opened

    def _make_room(self, keep: int) -> None:
        """Drop the least recently used shards (not ``keep``, none the plan needs) while over the limits
        (under the lock)."""
        extra, owned = len(self._open) - self.capacity, self.owned - self.max_owned
        for shard in list(self._open):
            if extra <= 0 and owned <= 0:
                break
            if shard == keep or shard in self._needed:
                continue
            owned -= self._open.pop(shard).owned
            extra -= 1

    def is_open(self, shard: int) -> bool:
        """Whether ``shard`` is open here (reading it costs no fetch)."""
        return shard in self._open

    def key_of(self, shard: int, offset: int) -> str | None:
        """The key of sample ``offset`` of ``shard`` if that shard is open and has keys (tar names, an Arrow or
        Parquet ``__key__`` column), for messages."""
        reader = self._open.get(shard)
        try:
            if isinstance(reader, TarShard) and 0 <= offset < len(reader.keys):
                return reader.keys[offset]
            if isinstance(reader, (ArrowShard, ParquetShard)) and offset >= 0:
                return reader.key(offset)
        except Exception:  # a key that does not read is left out of the message
            return None
        return None

    def forget_failures(self) -> None:
        """Try the shards that failed again (at the start of a pass)."""
        with self._lock:
            self._failed.clear()
            self._needed = set()

    def retain(self, shards: set[int]) -> None:
        """Close the open shards not in ``shards``, which are what the plan reads next."""
        with self._lock:
            self._needed = set(shards)
            for shard in [s for s in self._open if s not in shards]:
                del self._open[shard]

    def load(self, shard: int) -> Shard:
        """Fetch, check, decompress and index shard ``shard`` (safe to call from any thread)."""
        return self._load(shard)

    def _load(self, shard: int) -> Shard:
        m = self.manifest
        name = self.store.url_of(m.paths[shard])
        if (
            m.shard_format == "parquet"
            and not self.store.is_local(m.paths[shard])
            and m.nbytes[shard] > RANGED_PARQUET_BYTES
            and not self.fetcher.cached(shard)
        ):
            ranged = ranged_parquet(self.fetcher, m, shard)
            if ranged is not None:
                return self._warned(ranged, ranged.checksums is not None)
        path = self.store.path(m.paths[shard]) if self.store.is_local(m.paths[shard]) else None
        before = file_identity(path) if path else None
        data = self.fetcher.fetch(shard)
        identity = file_identity(path) if path else None
        # the map may hold either version: its locations would name no file for sure
        if identity != before:
            raise CorruptShardError(
                f"{name}: the shard file was replaced while it was opened; the dataset is being "
                "re-written: make a new ShardDataset once that is done"
            )
        if len(data) != m.nbytes[shard]:
            raise CorruptShardError(
                f"{name}: {len(data)} bytes, the manifest says {m.nbytes[shard]}; the shard is truncated or "
                "was replaced, run 'shardstream verify'"
            )
        expected = int(m.stored_counts[shard])
        if m.shard_format == "arrow":
            opened = ArrowShard(data, name, expected)
            return self._warned(opened, opened.checked)
        if m.shard_format == "parquet":
            if path is None:  # a download, checked whole against its sha256
                return ParquetShard(parquet_format.open_file(data, name), name, expected)
            opened = local_parquet(self.fetcher, m, shard, data)
            return self._warned(opened, opened.checksums is not None)
        plain = decompress(data, TAR_COMPRESSION[m.shard_format], name)
        compressed = plain is not data
        sizes = (
            {shard: len(plain)} if compressed else None
        )  # a compressed shard's index: of its tar
        index = self.indexes.stored([shard], sizes).get(shard)
        if index is not None and path is not None:
            # never another sample's bytes: a stored index must be the tar's (one built here is)
            digest = m.index_sha256[shard]
            check_index_once(self.fetcher, path, identity, plain, index, name, digest)
        elif index is None:
            index = self.indexes.from_cache(shard, plain, compressed)
        opened = TarShard(plain, name, expected, None if compressed else identity, index)
        return self._warned(opened, opened.sums is not None)

    def _warned(self, opened: Shard, checked: bool) -> Shard:
        """``opened``, once the dataset was warned of (once per process) if it has no per-sample checksums."""
        if not checked and checksums_format.checking():
            kind = {"arrow": "Arrow shards", "parquet": "Parquet files"}
            unchecked(
                self.store.url, f"its {kind.get(self.manifest.shard_format, 'tar shards')} have"
            )
        return opened


Chunk = tuple[
    int, np.ndarray, np.ndarray
]  # a batch's first position in the epoch's order, its shards and offsets


def looking_ahead(
    chunks: Iterable[Chunk], depth: int, prefetcher: Prefetcher | None, shards: OpenShards
) -> Iterator[Chunk]:
    """The chunks, while the shards of the next ``depth`` are prefetched (with a prefetcher) and the
    others closed; both are told again only when that set of shards changes."""
    it = iter(chunks)
    ahead: deque[tuple[Chunk, list[int]]] = deque()
    uses: dict[int, int] = {}  # shard -> chunks ahead that read it
    changed = True

    def push(item: Chunk) -> None:
        nonlocal changed
        used = list(dict.fromkeys(item[1].tolist()))  # (np.unique costs more on small chunks)
        ahead.append((item, used))
        for shard in used:
            changed = changed or shard not in uses
            uses[shard] = uses.get(shard, 0) + 1

    for item in it:
        push(item)
        if len(ahead) >= max(depth, 2):
            break
    while ahead:
        if changed:
            needed = np.concatenate([ids for (_, ids, _), _ in ahead])
            first, index = np.unique(needed, return_index=True)
            in_order = first[np.argsort(index)].tolist()  # shards by first use
            if prefetcher is not None:
                prefetcher.want(in_order)
                prefetcher.keep_only(in_order)
            shards.retain(set(in_order))
            changed = False
        item, used = ahead.popleft()
        for shard in used:
            uses[shard] -= 1
            if not uses[shard]:
                del uses[shard]
                changed = True
        yield item
        following = next(it, None)
        if following is not None:
            push(following)
