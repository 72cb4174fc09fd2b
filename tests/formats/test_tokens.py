"""Token shards: the documented numpy-only recipe reads what shardstream writes; damage is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardstream.errors import CorruptShardError
from shardstream.formats import tokens as token_format
from shardstream.formats.tokens import TokenShard


def write(path, tokens, offsets, dtype):
    with open(path, "wb") as f:
        for piece in token_format.shard_bytes(np.asarray(tokens), np.asarray(offsets), dtype):
            f.write(piece)
    return str(path)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_numpy_alone_reads_a_shard_as_the_docstring_says(tmp_path, dtype):
    step, top = (3, 1 << 16) if dtype == "uint16" else (70_001, 1 << 32)
    tokens = np.arange(1000, dtype=np.int64) * step % top
    offsets = [0, 10, 10, 400, 1000]  # an empty document too
    path = write(tmp_path / "shard-000000.tokens", tokens, offsets, dtype)
    magic, itemsize, n, d = np.fromfile(path, "<u8", count=4)
    assert magic.tobytes() == b"SSTOKEN1" and (itemsize, n, d) == (
        np.dtype(dtype).itemsize,
        1000,
        4,
    )
    got_offsets = np.memmap(path, "<i8", mode="r", offset=32, shape=(d + 1,))
    got = np.memmap(
        path,
        {2: "<u2", 4: "<u4"}[int(itemsize)],
        mode="r",
        offset=32 + 8 * (int(d) + 1),
        shape=(int(n),),
    )
    assert got_offsets.tolist() == offsets and got.tolist() == tokens.tolist()
    shard = TokenShard(Path(path).read_bytes(), "s", dtype, 4)
    shard.check()
    assert shard.tokens.tolist() == tokens.tolist() and shard.offsets.tolist() == offsets
    assert token_format.expected_size(1000, 4, dtype) == len(Path(path).read_bytes())


def test_damaged_shards_are_refused_with_their_name(tmp_path):
    data = bytearray(Path(write(tmp_path / "a", [1, 2, 3], [0, 3], "uint16")).read_bytes())
    with pytest.raises(CorruptShardError, match="^s1: .*manifest"):
        TokenShard(bytes(data[:-2]), "s1")  # truncated: the header says 3 tokens
    with pytest.raises(CorruptShardError, match="^s2: .*manifest"):
        TokenShard(bytes(data), "s2", "uint32")  # the manifest says another dtype
    with pytest.raises(CorruptShardError, match="^s3: not a shardstream token shard"):
        TokenShard(b"X" + bytes(data[1:]), "s3")
    bad = bytes(data[:32]) + np.array([0, 5], "<i8").tobytes() + bytes(data[48:])
    with pytest.raises(CorruptShardError, match="^s4: its document offsets"):
        TokenShard(bad, "s4").check()


def test_dtype_follows_the_vocabulary():
    assert token_format.dtype_for(65536) == "uint16" and token_format.dtype_for(65537) == "uint32"
