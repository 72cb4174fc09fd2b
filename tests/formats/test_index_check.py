"""``check_index``: a tar against its sample index. It accepts exactly what the header parse reads as the
index says, whoever wrote the tar, and raises for everything else."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile

import pytest

from shardstream.errors import CorruptShardError
from shardstream.formats import tar as tar_format
from shardstream.formats.index_check import _plain_match, check_index
from shardstream.formats.tar_index import IndexBuilder, SampleIndex, parse_index


def tar_of(names: list[str], fmt: int = tarfile.PAX_FORMAT, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name in names:
            data = rng.randbytes(rng.randrange(0, 1500))
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def index_of(data: bytes) -> SampleIndex:
    """The index a packer would write for ``data`` (from the header parse of the intact tar)."""
    builder = IndexBuilder()
    found = list(tar_format.iter_members(data, "t"))
    start = pos = 0  # where the sample, and the next member's headers, start
    members: list[tuple[str, int, int]] = []
    for n, (name, offset, size) in enumerate(found):
        members.append((name, offset - pos, size))
        pos = offset + size + (-size % 512)
        key = tar_format.split_name(name)[0]
        if n + 1 == len(found) or tar_format.split_name(found[n + 1][0])[0] != key:
            builder.add_hashed(hashlib.sha256(data[start:pos]).digest(), members)
            start, members = pos, []
    raw = builder.to_bytes()
    return parse_index(raw, "t.idx", len(builder.digests), len(data))


NAMES = [f"{i:04d}.{ext}" for i in range(20) for ext in ("cls", "jpg")]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tarfiles_tars_with_short_names_pass_the_vectorised_check(fmt):
    data = tar_of(NAMES, fmt)
    index = index_of(data)
    assert _plain_match(data, index)
    check_index(data, index, "t")


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_pass_by_the_header_parse(fmt):
    names = [f"{'p' * 90}/{'k' * 40}{i:03d}.bin" for i in range(6)]
    data = tar_of(names, fmt)
    index = index_of(data)
    assert not _plain_match(data, index)
    check_index(data, index, "t")


def test_an_index_of_another_tar_is_refused():
    index = index_of(tar_of(NAMES, seed=1))
    other = tar_of(NAMES, seed=2)  # same names, other sizes
    with pytest.raises(CorruptShardError, match="t: "):
        check_index(other, index, "t")


def test_every_header_byte_changed_is_caught_or_harmless():
    """A byte changed anywhere in the headers and the end-of-archive marker: either ``check_index`` raises,
    or the header parse of the changed tar reads exactly the index's samples (a byte the parse ignores);
    and whenever the header parse refuses the tar, so does the check."""
    data = tar_of(NAMES[:12])
    index = index_of(data)
    positions = [o - 512 for o in index.data_offsets.tolist()]
    end = len(data) - 1024
    rng = random.Random(11)
    for _ in range(400):
        block = rng.choice([*positions, end, end + 512])
        at = block + rng.randrange(512)
        changed = bytearray(data)
        changed[at] = (changed[at] + rng.randrange(1, 256)) % 256
        changed = bytes(changed)
        try:
            parsed = tar_format.index_samples(changed, "t")
        except CorruptShardError:
            parsed = None
        try:
            check_index(changed, index, "t")
        except CorruptShardError:
            continue
        assert parsed == index.samples("t"), f"byte {at} changed, the check let it through"
