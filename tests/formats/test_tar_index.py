"""The sample index of a tar shard: written with the shard, parsed strictly, each sample checked."""

from __future__ import annotations

import io
import struct
import tarfile

import numpy as np
import pytest

from shardstream.errors import CorruptShardError
from shardstream.formats import tar as T
from shardstream.formats.tar_index import MAGIC, parse_index


def _shard(samples):
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink, index=True)
    for key, fields in samples:
        writer.add(key, fields)
    writer.close()
    return sink.getvalue(), writer.index.to_bytes()


SAMPLES = [(f"{i:04d}", [("cls", str(i).encode()), ("jpg", bytes([i]) * (100 + 700 * i))]) for i in range(5)]


def test_each_span_is_the_sample_as_tar_reads_it():
    tar, raw = _shard(SAMPLES)
    index = parse_index(raw, "s.tar", len(SAMPLES), len(tar))
    assert len(index) == 5 and int(index.offsets[-1]) == len(tar) - len(T.END_OF_ARCHIVE)
    for i, (key, fields) in enumerate(SAMPLES):
        start, end = index.span(i)
        span = tar[start:end]
        index.check(i, span, "s.tar")
        with tarfile.open(fileobj=io.BytesIO(span + T.END_OF_ARCHIVE)) as t:  # a real client reads the span alone
            got = {m.name: t.extractfile(m).read() for m in t.getmembers()}
        assert got == {f"{key}.{ext}": data for ext, data in fields}


def test_a_changed_sample_fails_its_check():
    tar, raw = _shard(SAMPLES)
    index = parse_index(raw, "s.tar", 5, len(tar))
    start, end = index.span(2)
    damaged = bytearray(tar[start:end])
    damaged[-600] ^= 1
    with pytest.raises(CorruptShardError, match=r"s\.tar: sample 2's bytes differ"):
        index.check(2, bytes(damaged), "s.tar")
    with pytest.raises(CorruptShardError, match="sample 3"):
        index.check(3, tar[start:end], "s.tar")  # another sample's bytes


def _rewrite(raw: bytes, offsets) -> bytes:
    n = len(offsets) - 1
    return MAGIC + struct.pack("<Q", n) + np.asarray(offsets, dtype="<u8").tobytes() + raw[-32 * n:]


@pytest.mark.parametrize("change, says", [
    (lambda raw, o: b"XXXXXXXX" + raw[8:], "not a shardstream sample index"),
    (lambda raw, o: raw[:5], "not a shardstream sample index"),
    (lambda raw, o: raw[:-1], "bytes, a sample index"),
    (lambda raw, o: raw + b"\0", "bytes, a sample index"),
    (lambda raw, o: _rewrite(raw, [512] + o[1:]), "not increasing"),
    (lambda raw, o: _rewrite(raw, o[:2] + [o[1]] + o[3:]), "not increasing"),
    (lambda raw, o: _rewrite(raw, o[:2] + [o[2] + 1] + o[3:]), "not increasing"),
    (lambda raw, o: _rewrite(raw, o[:-1] + [o[-1] + 512]), "not increasing"),
    (lambda raw, o: _rewrite(raw, o[:2] + [2**64 - 512] + o[3:]), "not increasing"),
])
def test_hostile_indexes_are_refused(change, says):
    tar, raw = _shard(SAMPLES)
    offsets = parse_index(raw, "s.tar", 5, len(tar)).offsets.tolist()
    with pytest.raises(CorruptShardError, match=rf"^s\.tar\.idx: .*{says}.*re-pack"):
        parse_index(change(raw, offsets), "s.tar.idx", 5, len(tar))


def test_the_sample_count_must_be_the_manifests():
    tar, raw = _shard(SAMPLES)
    with pytest.raises(CorruptShardError, match="indexes 5 samples, the manifest says the shard has 6"):
        parse_index(raw, "s.tar.idx", 6, len(tar))


def test_compressed_shards_have_no_index():
    with pytest.raises(ValueError, match="uncompressed"):
        T.TarShardWriter(io.BytesIO(), "zstd", index=True)


def test_the_shard_bytes_do_not_depend_on_the_index():
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink)
    for key, fields in SAMPLES:
        writer.add(key, fields)
    plain = writer.close()
    sink2 = io.BytesIO()
    indexed = T.TarShardWriter(sink2, index=True)
    for key, fields in SAMPLES:
        indexed.add(key, fields)
    assert indexed.close() == plain and sink2.getvalue() == sink.getvalue()
