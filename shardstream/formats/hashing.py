"""A write-through file wrapper that counts and hashes every byte on its way out.

Small writes (tar headers, padding, member data) are gathered and handed to the OS in
one ``writev`` call when the sink is a raw file, so member data is never copied into
an intermediate buffer.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import IO

_GATHER_BYTES = 4 << 20
_GATHER_PIECES = 512  # well under IOV_MAX


class HashingWriter:
    """Counts and sha256-hashes what is written, then passes it on to ``sink``."""

    def __init__(self, sink: IO[bytes]):
        self.sink = sink
        self.hash = hashlib.sha256()
        self.nbytes = 0
        self._fd = sink.fileno() if isinstance(sink, io.FileIO) else None
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, data) -> int:  # any bytes-like
        n = memoryview(data).nbytes
        self.hash.update(data)
        self.nbytes += n
        if type(data) is bytes:  # immutable: safe to hold until the next flush
            self._pending.append(data)
            self._pending_bytes += n
            if self._pending_bytes >= _GATHER_BYTES or len(self._pending) >= _GATHER_PIECES:
                self._drain()
        else:
            self._drain()
            self._write_all(data)
        return n

    def write_pieces(self, pieces: list[bytes]) -> None:
        """Write several immutable pieces (a tar member's header, data and padding) in order."""
        update = self.hash.update
        for piece in pieces:
            update(piece)
            self.nbytes += len(piece)
        self._pending += pieces
        self._pending_bytes += sum(map(len, pieces))
        if self._pending_bytes >= _GATHER_BYTES or len(self._pending) >= _GATHER_PIECES:
            self._drain()

    def _write_all(self, data) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            written = self.sink.write(view)
            view = view[written if written is not None else view.nbytes :]

    def _drain(self) -> None:
        if not self._pending:
            return
        pieces, total = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        if self._fd is not None:
            written = os.writev(self._fd, pieces)
            if written == total:
                return
            self._write_all(b"".join(pieces)[written:])
        else:
            self._write_all(b"".join(pieces))

    def flush(self) -> None:
        self._drain()
        self.sink.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False

    def hexdigest(self) -> str:
        return self.hash.hexdigest()
