"""Token shards (``shard-000000.tokens``): flat token ids with their documents' offsets.

A shard is one file that numpy alone reads, with no shardstream::

    header  = 4 little-endian uint64: magic b"SSTOKEN1", itemsize (2 or 4), tokens n, documents d
    offsets = d + 1 little-endian int64 at byte 32: document i is tokens[offsets[i]:offsets[i + 1]]
              (offsets[0] == 0, offsets[d] == n)
    tokens  = n little-endian uint16 (itemsize 2) or uint32 (itemsize 4) at byte 32 + 8 * (d + 1)

    import numpy as np
    magic, itemsize, n, d = np.fromfile(path, "<u8", count=4)
    offsets = np.memmap(path, "<i8", mode="r", offset=32, shape=(d + 1,))
    tokens = np.memmap(path, {2: "<u2", 4: "<u4"}[itemsize], mode="r", offset=32 + 8 * (d + 1), shape=(n,))

Everything is aligned to its item size, so both arrays are zero-copy views of a memory map. A
document's end-of-document token, when the pack added one, is its last token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptShardError

MAGIC = b"SSTOKEN1"
HEADER_BYTES = 32
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_BY_SIZE = {2: "uint16", 4: "uint32"}


def dtype_for(vocab_size: int) -> str:
    """``"uint16"`` when every id below ``vocab_size`` fits in it, else ``"uint32"``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_bytes(tokens: np.ndarray, offsets: np.ndarray, dtype: str) -> list[Any]:
    """The pieces of a token shard's file, to be written one after another (no concatenated copy)."""
    tokens = np.ascontiguousarray(tokens, DTYPES[dtype])
    offsets = np.ascontiguousarray(offsets, "<i8")
    header = np.array(
        [int.from_bytes(MAGIC, "little"), tokens.itemsize, len(tokens), len(offsets) - 1], "<u8"
    )
    return [header.tobytes(), memoryview(offsets).cast("B"), memoryview(tokens).cast("B")]


def expected_size(tokens: int, documents: int, dtype: str) -> int:
    """A shard's size in bytes."""
    return HEADER_BYTES + 8 * (documents + 1) + tokens * DTYPES[dtype].itemsize


def tokens_in(nbytes: int | np.ndarray, documents: int | np.ndarray, dtype: str) -> Any:
    """Tokens in shards of ``nbytes`` bytes holding ``documents`` documents (negative or fractional:
    no such shard)."""
    return (nbytes - HEADER_BYTES - 8 * (documents + 1)) / DTYPES[dtype].itemsize


class TokenShard:
    """A token shard's ``tokens`` and document ``offsets``: views of ``data`` (a memory map or bytes)."""

    def __init__(
        self, data: Any, name: str, dtype: str | None = None, documents: int | None = None
    ):
        self.name = name
        view = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else data
        if len(view) < HEADER_BYTES:
            raise CorruptShardError(
                f"{name}: {len(view)} bytes, too short for a token shard; re-pack it"
            )
        magic, itemsize, n, d = (int(x) for x in np.frombuffer(view, "<u8", count=4))
        if magic.to_bytes(8, "little") != MAGIC or itemsize not in _BY_SIZE:
            raise CorruptShardError(
                f"{name}: not a shardstream token shard (bad header); re-pack it"
            )
        self.dtype = _BY_SIZE[itemsize]
        if (
            (dtype is not None and dtype != self.dtype)
            or (documents is not None and documents != d)
            or len(view) != expected_size(n, d, self.dtype)
        ):
            raise CorruptShardError(
                f"{name}: its header ({n} {self.dtype} tokens, {d} documents, "
                f"{len(view)} bytes) disagrees with the manifest or the file size; the shard "
                "or the manifest was replaced, run 'shardstream verify'"
            )
        self.data = data  # keeps the map alive
        self.offsets = np.frombuffer(view, "<i8", count=d + 1, offset=HEADER_BYTES)
        self.tokens = np.frombuffer(
            view, DTYPES[self.dtype], count=n, offset=HEADER_BYTES + 8 * (d + 1)
        )

    def check(self) -> None:
        """Raise unless the offsets run from 0 to the token count without going back."""
        o = self.offsets
        if o[0] != 0 or o[-1] != len(self.tokens) or (len(o) > 1 and bool((np.diff(o) < 0).any())):
            raise CorruptShardError(
                f"{self.name}: its document offsets do not run from 0 to "
                f"{len(self.tokens)} in order; re-pack it"
            )
