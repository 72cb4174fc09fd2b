"""Folder files into one uncompressed tar shard through a reused buffer: the fast path of
:func:`.folder.write_shard`.

Each member's header, the file's bytes (read straight into the buffer: one ``open``, ``read`` and
``close`` per file, no ``bytes`` object per file) and its padding are laid out in one buffer, which is
hashed and written whenever it fills. The shard's bytes are exactly those that
:class:`~shardstream.formats.tar.TarShardWriter` writes for the same samples. A file that one read does
not give as planned (remote, larger than the buffer, changed, unreadable) goes through ``read``, which
reads it or raises the error that names it. With ``writeback``, what is written is handed to the
kernel's writeback as it goes (``sync_file_range``, Linux), so the ``fsync`` before the shard's rename
finds little left to wait for.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..formats import checksums as checksums_format
from ..formats.checksums import checksum
from ..formats.tar import END_OF_ARCHIVE, ZERO_BLOCK, member_header, plain_header
from ..formats.tar_index import IndexBuilder
from ..manifest.image_sizes import ShardSizes
from ..sources import FileSample
from ..sources.remote import is_remote

# small enough to stay in a core's cache between the read, the hash and the write
BUFFER_BYTES = 1 << 20
WRITEBACK_BYTES = 8 << 20  # start the disk writes of every this many bytes
_PLAIN_SIZE = 8**11 - 1  # the largest size a ustar header holds

_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of the range, do not wait
_DIR_FD = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")


def writeback_starter() -> Callable[[int, int, int], Any] | None:
    """``start(fd, offset, nbytes)``: start writing that range of a file to disk, without waiting; None where
    the system has no ``sync_file_range``. Only a hint: a failure changes nothing the later fsync does."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return lambda fd, offset, nbytes: call(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


class _Folders:
    """Open folders, by path: a file is opened relative to its folder (one path step for the kernel, not
    every step of the path each time). At most ``limit`` stay open."""

    def __init__(self, limit: int = 256):
        self.fds: dict[str, int] = {}
        self.limit = limit

    def read_into(self, path: str, target: memoryview) -> int:
        """Bytes read from the start of the file ``path`` into ``target`` in one read; -1 when that fails."""
        try:
            if _DIR_FD:
                cut = path.rfind("/")
                folder, name = (path[:cut] or "/", path[cut + 1 :]) if cut >= 0 else (".", path)
                dir_fd = self.fds.get(folder)
                if dir_fd is None:
                    if len(self.fds) >= self.limit:
                        self.close()
                    dir_fd = self.fds[folder] = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
            else:
                fd = os.open(path, os.O_RDONLY)
        except OSError:
            return -1
        try:
            return os.readv(fd, [target])
        except OSError:
            return -1
        finally:
            os.close(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def write_files(  # noqa: C901, PLR0915 - the pack's inner loop, one frame for its speed (Benchmarks)
    fd: int,
    samples: Sequence[FileSample],
    read: Callable[[str, int], bytes],
    writeback: bool = False,
    index: IndexBuilder | None = None,
    sizes: ShardSizes | None = None,
) -> tuple[int, str, Counter[str]]:
    """Write ``samples`` as a tar shard to the open file ``fd``: (bytes written, their sha256 hex, members
    per field). Members are ``KEY.EXT`` per file and ``KEY.cls`` for a label, in field order, as
    :func:`.folder.write_shard` lays them out; ``read(path, size)`` reads a file this function does not.
    With ``index``, each sample goes into it too (its sha256 and each member's checksum computed while it
    is in the buffer); with ``sizes``, each image's width and height are read from its header while it is
    in the buffer."""
    view = memoryview(bytearray(BUFFER_BYTES))
    digest = hashlib.sha256()
    counts: Counter[str] = Counter()
    pos = written = started = 0
    start_writeback = writeback_starter() if writeback else None
    folders = _Folders()
    summing = index is not None and checksums_format.WRITE_ON_PACK  # (always, but when measured)

    def flush() -> None:
        nonlocal pos, written, started
        piece = view[:pos]
        digest.update(piece)
        while piece:
            piece = piece[os.write(fd, piece) :]
        written += pos
        pos = 0
        if start_writeback is not None and written - started >= WRITEBACK_BYTES:
            start_writeback(fd, started, written - started)
            started = written

    def put(data: bytes) -> None:  # bytes not read straight into the buffer
        nonlocal pos, written
        n = len(data)
        if pos + n > BUFFER_BYTES:
            flush()
            if n > BUFFER_BYTES:
                digest.update(data)
                piece = memoryview(data)
                while piece:
                    piece = piece[os.write(fd, piece) :]
                written += n
                return
        view[pos : pos + n] = data
        pos += n

    try:
        for sample in samples:
            members: list[tuple[str, str | None, int]] = sample.files
            label = None
            if sample.label is not None:
                label = str(sample.label).encode()
                member = ("cls", None, len(label))
                if len(members) == 1:  # an ImageFolder's file: sorted by hand
                    members = (
                        [members[0], member] if members[0][0] <= "cls" else [member, members[0]]
                    )
                else:
                    members = sorted([*members, member], key=lambda m: m[0])
            sample_hash = hashlib.sha256() if index is not None else None
            laid_out: list[tuple[str, int, int]] = []
            sums: list[int] = []  # each member's checksum, for the index
            for ext, path, size in members:
                counts[ext] += 1
                name = f"{sample.key}.{ext}"
                raw = name.encode("utf-8", "surrogateescape")
                header = (
                    plain_header(raw, size)
                    if len(raw) <= 100 and size <= _PLAIN_SIZE
                    else member_header(name, size)
                )
                pad = -size % 512
                laid_out.append((name, len(header), size))
                # straight into the buffer, asking one byte more
                if path is not None and not is_remote(path):
                    if pos + len(header) + size + 1 + pad > BUFFER_BYTES:
                        flush()
                    start = pos + len(header)
                    if start + size + 1 + pad <= BUFFER_BYTES:
                        view[pos:start] = header
                        if folders.read_into(path, view[start : start + size + 1]) == size:
                            view[start + size : start + size + pad] = ZERO_BLOCK[:pad]
                            if sample_hash is not None:
                                sample_hash.update(view[pos : start + size + pad])
                            if summing:
                                sums.append(checksum(view[start : start + size]))
                            if sizes is not None:
                                sizes.record(ext, view[start : start + size])
                            pos = start + size + pad
                            continue
                data = label if path is None else read(path, size)
                if sizes is not None:
                    sizes.record(ext, data)  # type: ignore[arg-type]
                if summing:
                    sums.append(checksum(data))  # type: ignore[arg-type]
                for piece in (header, data, ZERO_BLOCK[:pad]):
                    put(piece)  # type: ignore[arg-type]
                    if sample_hash is not None:
                        sample_hash.update(piece)  # type: ignore[arg-type]
            if sizes is not None:
                sizes.end_sample()
            if index is not None:
                index.add_hashed(
                    sample_hash.digest(),  # type: ignore[union-attr]
                    laid_out,
                    sums if summing else None,
                )
    finally:
        folders.close()
    put(END_OF_ARCHIVE)
    flush()
    return written, digest.hexdigest(), counts
