"""Folder sources into tar shards: an exact plan, then one job per shard.

The plan computes each sample's tar size from file sizes alone, so shard boundaries
(and therefore the bytes of every shard) do not depend on how many workers write them.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceError
from ..formats import tar as tar_format
from ..formats.tar_index import IndexBuilder
from ..manifest.files import sync_file, write_durably
from ..manifest.image_sizes import ShardSizes
from ..manifest.side_names import index_name
from ..sources import FileSample
from ..sources.remote import is_remote, read_remote
from ..storage import Store, describe_os_error
from .destination import DestinationLost, check_claim
from .fields import field_problem, key_problem
from .rules import shard_is_full
from .tar_files import write_files


@dataclass
class ShardResult:
    """What one written shard adds to the manifest."""

    index: int
    path: str
    samples: int
    nbytes: int
    sha256: str
    tar_bytes: int = 0
    field_counts: Counter[str] = field(default_factory=Counter)
    index_sha256: str = ""  # of the shard's sample index, when one was written
    image_sizes: ShardSizes | None = None  # each image's width and height, when recorded


def sample_fields(sample: FileSample) -> list[tuple[str, int]]:
    """(field, size) of every member the sample becomes, in member order."""
    fields = [(ext, size) for ext, _, size in sample.files]
    if sample.label is not None:
        fields.append(("cls", len(str(sample.label))))
        fields.sort()
    return fields


def sample_bytes(sample: FileSample) -> int:
    """``tar_format.sample_size`` of the sample's members, by arithmetic where a member is plain ustar."""
    key, total = sample.key, 0
    members = (
        sample.files
        if sample.label is None
        else [*sample.files, ("cls", "", len(str(sample.label)))]
    )
    for ext, _, size in members:
        if size <= _PLAIN_SIZE and len(key) + len(ext) < 100 and key.isascii() and ext.isascii():
            # one header block, padded data
            total += tar_format.BLOCK + size + (-size % tar_format.BLOCK)
        else:
            total += tar_format.member_size(f"{key}.{ext}", size)
    return total


_PLAIN_SIZE = 8**11 - 1  # the largest size a ustar header holds


def plan_shards(
    samples: list[FileSample], shard_size: int, per_shard: int | None
) -> list[list[FileSample]]:
    """Split ``samples`` (in order) into shards by the writer's shard-size rule."""
    shards: list[list[FileSample]] = []
    current: list[FileSample] = []
    current_bytes = 0
    for sample in samples:
        size = sample_bytes(sample)
        if shard_is_full(current_bytes, len(current), size, shard_size, per_shard):
            shards.append(current)
            current, current_bytes = [], 0
        current.append(sample)
        current_bytes += size
    if current:
        shards.append(current)
    return shards


def read_file(path: str, size: int, storage_options: dict[str, Any] | None = None) -> bytes:
    """The bytes of ``path`` (a local file, or a URL that ``storage_options`` reach), which must still be
    ``size`` bytes long (the plan depends on it)."""
    if is_remote(path):
        return read_remote(path, size, storage_options)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, size + 1)  # one call: a short read of a regular file means its end
            while len(data) < size:
                more = os.read(fd, size + 1 - len(data))
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {describe_os_error(exc)}") from exc
    if len(data) != size:
        raise SourceError(
            f"{path} changed while packing (it was {size} bytes, now {'more' if len(data) > size else len(data)}); "
            "let it settle and pack again"
        )
    return data


def check_sample_names(samples: list[FileSample], fmt: str) -> None:
    """Refuse, before anything is written, a file whose name cannot be a member name of ``fmt`` shards."""
    # all at once: what key_problem's common case asks of each key
    keys = "/".join([s.key for s in samples])
    if (
        fmt.startswith("tar")
        and keys.isprintable()
        and keys[:1] not in ("", "/")
        and keys[-1] != "/"
        and not any(c in keys for c in (".", "\\", "//"))
        and all(
            field_problem(ext) is None for ext in {ext for s in samples for ext, _, _ in s.files}
        )
    ):
        return
    for sample in samples:
        problem = key_problem(sample.key, fmt)
        if problem is not None:
            raise SourceError(
                f"cannot pack {sample.files[0][1]!r}: its sample key {sample.key!r} {problem}; "
                "rename the file"
            )
        if fmt.startswith("tar"):
            for ext, path, _ in sample.files:
                problem = field_problem(ext)
                if problem is not None:
                    raise SourceError(
                        f"cannot pack {path!r}: its field name {ext!r} {problem}; rename the file"
                    )


@dataclass
class ShardJob:
    """One folder shard to write: ``samples`` as shard ``index``, at ``name`` (which carries its run's token)
    in the destination ``dest``. ``token``: the run's, for the check that it still holds the destination
    (local folders); ``source_options`` reach a source in object storage; ``sample_index``: write the
    shard's sample index too; ``image_sizes``: record each image's width and height from its header."""

    dest: str
    storage_options: dict[str, Any] | None
    index: int
    name: str
    compression: str | None
    samples: list[FileSample]
    token: str | None = None
    fsync: bool = True
    source_options: dict[str, Any] | None = None
    sample_index: bool = False
    image_sizes: bool = False


def write_shard(job: ShardJob) -> ShardResult:
    """Write one tar shard from files (runs in a worker process), as ``job`` says.

    With ``job.token`` (local folders), the worker checks afterwards that its run still holds the destination;
    a worker whose run has lost it (the orphan of a killed run, say) removes what it wrote and stops.
    """
    name, compression, samples, token, fsync = (
        job.name,
        job.compression,
        job.samples,
        job.token,
        job.fsync,
    )
    source_options, sample_index = job.source_options, job.sample_index
    store = Store(job.dest, job.storage_options)
    counts: Counter[str] = Counter()
    sizes = ShardSizes() if job.image_sizes else None
    with store.open_write(name) as sink:
        tar_size = None
        # the frame header records it: readers can size (and bound) the output
        if compression == "zstd":
            tar_size = sum(tar_format.sample_size(s.key, sample_fields(s)) for s in samples)
            tar_size += len(tar_format.END_OF_ARCHIVE)
        writer = tar_format.TarShardWriter(sink, compression, tar_size=tar_size, index=sample_index)
        # the same bytes (and index), through one buffer
        if compression is None and isinstance(sink, io.FileIO):
            nbytes, digest, counts = write_files(
                sink.fileno(),
                samples,
                lambda p, n: read_file(p, n, source_options),
                writeback=fsync and store.local,
                index=writer.index,
                sizes=sizes,
            )
            writer.tar_bytes = nbytes
        else:
            for sample in samples:
                fields: list[tuple[str, bytes]] = [
                    (ext, read_file(path, size, source_options)) for ext, path, size in sample.files
                ]
                if sample.label is not None:
                    fields.append(("cls", str(sample.label).encode()))
                    fields.sort(key=lambda f: f[0])
                writer.add(sample.key, fields)
                if sizes is not None:
                    sizes.add(fields)
                counts.update(ext for ext, _ in fields)
            nbytes, digest = writer.close()
        if fsync:
            sync_file(store, sink, name)
    index_digest = ""
    if writer.index is not None:
        index_digest = write_index(store, name, writer.index, fsync)
    if token is not None:
        try:
            check_claim(store, token)
        except DestinationLost:
            store.remove(name)
            if writer.index is not None:
                store.remove(index_name(name))
            raise
    return ShardResult(
        job.index, name, len(samples), nbytes, digest, writer.tar_bytes, counts, index_digest, sizes
    )


def write_index(store: Store, name: str, index: IndexBuilder, fsync: bool = True) -> str:
    """Write shard ``name``'s sample index into ``.shardstream/`` beside it (``.shardstream/<name>.idx``, atomically, durably with ``fsync``);
    its sha256, for the manifest."""
    data = index.to_bytes()
    write_durably(store, index_name(name), data, fsync)
    return hashlib.sha256(data).hexdigest()
