"""The per-value checksum every pack writes and every read checks: xxh3_64 of each value's bytes.

A shard's sha256 (in the manifest) is the trust model's check: of whole shards, once per download or
per host. It costs about as much as reading the bytes (1.1-1.6 GB/s a core), too much for every read.
Every value a reader hands out is checked instead against a fast checksum written at pack time beside
it: each tar member's data (in the shard's sample index) and each Arrow record batch's columns and rows
(in the batch's custom metadata). xxh3_64 was chosen by measurement (``benchmarks/integrity.py
--hashes``, one core of this 2-core machine, best of 7): on a 23 KB value 0.58 us (40 GB/s), CRC32C
(``google-crc32c``) 1.4 us, ``zlib.crc32`` 7.4 us, sha256 20.7 us; on a 2-byte label 148 ns a call,
CRC32C 308 ns, ``zlib.crc32`` 161 ns, sha256 734 ns. A value's checksum is an unsigned 64-bit integer.

:data:`CHECK_ON_READ` and :data:`WRITE_ON_PACK` are **not settings**: they exist so that a benchmark
(``benchmarks/integrity.py``) can measure what the checksums cost, the same code with and without them, in
one run. Nothing in shardstream turns them off. (Without them, reads check nothing and packs write the
indexes and Arrow batches of 0.5.0, without checksums.)
"""

from __future__ import annotations

from typing import Any

import xxhash

from ..errors import CorruptSampleError, sample_name

NAME = "xxh3_64"  # the checksum's name in messages, metadata and `verify`

# Not settings (see the module): the benchmark's switches for measuring what the checksums cost.
CHECK_ON_READ = True
WRITE_ON_PACK = True

checksum = xxhash.xxh3_64_intdigest  # checksum(bytes-like) -> int: a value's checksum


def checking() -> bool:
    """Whether reads check values against their checksums (always, but in a benchmark's "off" runs)."""
    return CHECK_ON_READ


def mismatch(
    shard: str, position: int, key: Any, field: str, where: str = "the shard's sample index"
) -> CorruptSampleError:
    """The error of a value that differs from its checksum: field ``field`` of the sample at ``position``
    (key ``key``) of the shard at ``shard``, whose checksum was recorded in ``where``."""
    return CorruptSampleError(
        f"{shard}: {sample_name(position, key)}: field {field!r} differs from the checksum its pack "
        f"recorded in {where} ({NAME}): the shard was damaged after packing (bit rot, a bad copy, a "
        "half-synced volume); restore it from a good copy or pack it again ('shardstream verify' "
        "lists every damaged shard)",
        shard=shard,
        key=key,
        position=position,
        field=field,
    )


__all__ = ["CHECK_ON_READ", "NAME", "WRITE_ON_PACK", "checking", "checksum", "mismatch"]
