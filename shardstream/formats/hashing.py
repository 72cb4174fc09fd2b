"""A write-through file wrapper that counts and hashes every byte on its way out."""

from __future__ import annotations

import hashlib
from typing import IO


class HashingWriter:
    """Counts and sha256-hashes what is written, then passes it on to ``sink``."""

    def __init__(self, sink: IO[bytes]):
        self.sink = sink
        self.hash = hashlib.sha256()
        self.nbytes = 0

    def write(self, data) -> int:  # bytes-like
        self.hash.update(data)
        n = self.sink.write(data)
        n = len(memoryview(data)) if n is None else n
        self.nbytes += n
        return n

    def flush(self) -> None:
        self.sink.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False

    def hexdigest(self) -> str:
        return self.hash.hexdigest()
