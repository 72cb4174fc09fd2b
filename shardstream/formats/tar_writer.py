"""Writing tar shards in the WebDataset convention, without ``tarfile``.

Members are plain POSIX ustar entries with fixed metadata (mode 0644, owner 0, mtime 0), so the same
samples always give the same bytes; a PAX header is added only for a name that ustar cannot hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import IO

from . import checksums as checksums_format
from .checksums import checksum
from .compression import compressing_writer
from .hashing import HashingWriter
from .tar_index import IndexBuilder

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
ZERO_BLOCK = bytes(BLOCK)  # a header block of zeros: the end of an archive
_MAX_OCTAL_SIZE = 8**11 - 1


def padding(n: int) -> int:
    """Bytes of zeros after a member of ``n`` bytes, up to the next block."""
    return -n % BLOCK


_OWNER = b"0000644\0" + b"0000000\0" * 2  # mode, uid, gid
_MTIME = b"00000000000\0"
_AFTER_TYPE = bytes(100) + b"ustar\0" + b"00" + bytes(64) + b"0000000\0" * 2  # linkname..devminor
_PAD = bytes(12)
_FIXED_SUM = sum(_OWNER) + sum(_MTIME) + sum(b" " * 8) + sum(_AFTER_TYPE)


def _ustar_header(name: bytes, prefix: bytes, size: int, typeflag: bytes = b"0") -> bytes:
    # Assembled from constant parts; the checksum is the constant parts' sum plus the variable ones'.
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + typeflag[0] + sum(name) + sum(prefix) + sum(size_field)
    return b"".join(
        (
            name.ljust(100, b"\0"),
            _OWNER,
            size_field,
            _MTIME,
            b"%06o\0 " % checksum,
            typeflag,
            _AFTER_TYPE,
            prefix.ljust(155, b"\0"),
            _PAD,
        )
    )


_PLAIN_TAIL = b"0" + _AFTER_TYPE + bytes(155) + _PAD  # a regular file's header after its checksum
_PLAIN_SUM = _FIXED_SUM + ord("0")


def plain_header(name: bytes, size: int) -> bytes:
    """The ustar header of a regular file whose ``name`` fits the name field (at most 100 bytes) and whose
    ``size`` the size field holds: :func:`member_header`'s bytes for it, in fewer steps."""
    size_field = b"%011o\0" % size
    return b"".join(
        (
            name.ljust(100, b"\0"),
            _OWNER,
            size_field,
            _MTIME,
            b"%06o\0 " % (_PLAIN_SUM + sum(name) + sum(size_field)),
            _PLAIN_TAIL,
        )
    )


def _split_ustar_name(name: bytes) -> tuple[bytes, bytes] | None:
    """(prefix, name) so that ustar can hold ``name``, or None when it cannot."""
    if len(name) <= 100:
        return b"", name
    for i in range(len(name) - 1, -1, -1):
        if name[i : i + 1] == b"/" and i <= 155 and len(name) - i - 1 <= 100 and i > 0:
            return name[:i], name[i + 1 :]
    return None


def _pax_record(key: str, value: bytes) -> bytes:
    body = b" " + key.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length).encode()) + len(body) != length:
        length = len(str(length).encode()) + len(body)
    return str(length).encode() + body


def member_header(name: str, size: int) -> bytes:
    """The header block(s) for a regular file ``name`` of ``size`` bytes."""
    raw = name.encode("utf-8", "surrogateescape")
    split = _split_ustar_name(raw)
    if split is not None and size <= _MAX_OCTAL_SIZE:
        return _ustar_header(split[1], split[0], size)
    records = b""
    if split is None:
        records += _pax_record("path", raw)
    if size > _MAX_OCTAL_SIZE:
        records += _pax_record("size", str(size).encode())
    pax = (
        _ustar_header(b"././@PaxHeader", b"", len(records), b"x")
        + records
        + bytes(padding(len(records)))
    )
    short = split[1] if split is not None else raw[-100:].lstrip(b"/")
    return pax + _ustar_header(short, split[0] if split else b"", min(size, _MAX_OCTAL_SIZE))


def member_size(name: str, size: int) -> int:
    """Bytes that member ``name`` of ``size`` bytes takes in a tar, headers and padding included."""
    if len(name.encode("utf-8", "surrogateescape")) <= 100 and size <= _MAX_OCTAL_SIZE:
        return BLOCK + size + padding(size)
    return len(member_header(name, size)) + size + padding(size)


def sample_size(key: str, fields: Iterable[tuple[str, int]]) -> int:
    """Bytes a sample with (extension, data size) ``fields`` takes in a tar shard."""
    return sum(member_size(f"{key}.{ext}", n) for ext, n in fields)


class TarShardWriter:
    """Writes one tar shard to ``sink``; optional whole-shard ``"zstd"`` or ``"gzip"``.

    ``close()`` returns ``(bytes written, sha256 hex)`` of the stored (compressed) bytes. ``tar_size``,
    the exact size of the tar when known in advance, goes into a zstd frame's header. With ``index`` it
    also builds the shard's sample index (:mod:`.tar_index`: each member's checksum; of a compressed shard,
    offsets in the decompressed tar), then in :attr:`index`.
    """

    def __init__(
        self,
        sink: IO[bytes],
        compression: str | None = None,
        level: int | None = None,
        tar_size: int | None = None,
        index: bool = False,
    ):
        self.index = IndexBuilder(compressed=compression is not None) if index else None
        self._out = HashingWriter(sink)
        self._compressor = compressing_writer(self._out, compression, level, tar_size)
        self._write = self._out.write if self._compressor is None else self._compressor.write
        self.samples = 0
        self.tar_bytes = 0

    def add(self, key: str, fields: Sequence[tuple[str, bytes | bytearray | memoryview]]) -> None:
        """Append one sample: one member ``KEY.EXT`` per (extension, data) pair, in order."""
        pieces: list = []
        members = []
        sums: list[int] | None = None
        if self.index is not None and (checksums_format.WRITE_ON_PACK or self.index.compressed):
            sums = []
        for ext, data in fields:
            n = memoryview(data).nbytes
            name = f"{key}.{ext}"
            header = member_header(name, n)
            pad = padding(n)
            pieces += (header, data, ZERO_BLOCK[:pad]) if pad else (header, data)
            members.append((name, len(header), n))
            if sums is not None:
                sums.append(checksum(data))
            self.tar_bytes += len(header) + n + pad
        if self.index is not None:
            self.index.add(pieces, members, sums)
        if self._compressor is None and all(type(p) is bytes for p in pieces):
            self._out.write_pieces(pieces)  # gathered into one writev, no copies
        else:
            for piece in pieces:
                self._write(piece)
        self.samples += 1

    def close(self) -> tuple[int, str]:
        self._write(END_OF_ARCHIVE)
        self.tar_bytes += len(END_OF_ARCHIVE)
        if self._compressor is not None:
            self._compressor.close()  # ends the frame; leaves the sink open
        self._out.flush()
        return self._out.nbytes, self._out.hexdigest()
