"""Hostile and damaged shards (issue 10, findings 1 and 14): every one ends in a CorruptShardError
naming the shard, never in a loop, other bytes, or a tar of nothing."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from shardstream.errors import CorruptShardError
from shardstream.formats import count_samples, iter_shard_samples
from shardstream.formats import tar as T
from shardstream.formats import tar_writer as W
from shardstream.formats.compression import decompress


def _with_checksum(header: bytes | bytearray) -> bytes:
    fixed = bytearray(header)
    fixed[148:156] = b" " * 8
    fixed[148:156] = b"%06o\0 " % sum(fixed)
    return bytes(fixed)


def _header(name: str, size_field: bytes, kind: bytes = b"0") -> bytes:
    header = bytearray(T.member_header(name, 0))
    header[124:136] = size_field
    header[156:157] = kind
    return _with_checksum(header)


ROOT = Path(__file__).resolve().parents[2]
_READ_WHOLE = """
import sys
from shardstream.formats import count_samples, tar
shard = sys.stdin.buffer.read()
for read in (lambda: tar.index_samples(shard, "loop.tar"), lambda: count_samples("tar", shard, "loop.tar")):
    try:
        print("no error", read())
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


def _read_whole(shard: bytes) -> list[str]:
    """What index_samples and count_samples end with on ``shard``, in a child process bounded in
    memory (1 GiB: a parser that loops fills a list) and in time (120 s, generous)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", _READ_WHOLE],
            input=shard,
            capture_output=True,
            timeout=120,
            preexec_fn=limit,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading the whole shard still runs after 120 s: the parser loops")
    return done.stdout.decode().splitlines()


# -- finding 1: sizes that move the position backwards --------------------------------------------------------

# The 2 KB repro: a.txt (no data), then b.txt whose size "-0000002000" (-1024) points back at a.txt.
NEGATIVE = T.member_header("a.txt", 0) + _header("b.txt", b"-0000002000\0") + T.END_OF_ARCHIVE
# The PAX repro: a.txt, then a PAX header "size=-2048" for b.txt, which points back at a.txt again.
_RECORDS = W._pax_record("size", b"-2048")
PAX_NEGATIVE = (
    T.member_header("a.txt", 0)
    + _header("PaxHeader", b"%011o\0" % len(_RECORDS), b"x")
    + _RECORDS.ljust(512, b"\0")
    + T.member_header("b.txt", 0)
    + T.END_OF_ARCHIVE
)


@pytest.mark.parametrize(
    ("shard", "says"),
    [
        (NEGATIVE, r"bad tar header at byte 512 \(number field size b'-0000002000"),
        (PAX_NEGATIVE, r"bad PAX header at byte 512 \(size b'-2048'\)"),
    ],
)
def test_a_size_that_points_backwards_is_an_error_not_a_loop(shard, says):
    assert len(shard) == (2048 if shard is NEGATIVE else 3072)
    with pytest.raises(CorruptShardError, match=f"loop.tar: {says}"):
        # the old parser yielded a, b, a, b, ...
        list(itertools.islice(T.iter_members(shard, "loop.tar"), 10))
    lines = _read_whole(shard)
    assert len(lines) == 2 and all(
        line.startswith("CorruptShardError loop.tar: bad") for line in lines
    ), lines


def test_tarfile_reads_at_most_two_members_of_the_repro():
    with tarfile.open(fileobj=io.BytesIO(NEGATIVE), mode="r:") as tf:
        names = [m.name for m in itertools.islice(tf, 5)]
    assert names[:2] == ["a.txt", "b.txt"]


@pytest.mark.parametrize(
    "size_field",
    [
        b"\xff" * 12,  # GNU base-256, negative
        b"\x81" + bytes(11),  # a high first byte that is no base-256 marker
        b"0o000000012\0",  # Python's int(text, 8) takes this
        b"+0000000012\0",
        b"00000001_2\0",
        b"12 34\0\0\0\0\0\0\0",
        b"\0garbage\0\0\0",
    ],
)
def test_size_fields_are_octal_digits_or_gnu_base_256_only(size_field):
    shard = _header("k.txt", size_field) + bytes(512) + T.END_OF_ARCHIVE
    with pytest.raises(
        CorruptShardError, match=r"s.tar: bad tar header at byte 0 \((number field|negative)"
    ):
        list(T.iter_members(shard, "s.tar"))


def test_gnu_base_256_sizes_read_like_tarfile():
    data = b"x" * 700
    shard = (
        _header("k.txt", b"\x80" + len(data).to_bytes(11, "big"))
        + data
        + bytes(324)
        + T.END_OF_ARCHIVE
    )
    with tarfile.open(fileobj=io.BytesIO(shard), mode="r:") as tf:
        assert [(m.name, m.size) for m in tf] == [("k.txt", 700)]
    assert [(n, shard[o : o + s]) for n, o, s in T.iter_members(shard, "s.tar")] == [
        ("k.txt", data)
    ]


def test_a_huge_size_is_a_truncated_shard():
    shard = _header("k.txt", b"\x80" + (2**80).to_bytes(11, "big")) + T.END_OF_ARCHIVE
    with pytest.raises(
        CorruptShardError, match=f"s.tar: truncated at byte 1536: member at byte 0 needs {2**80}"
    ):
        list(T.iter_members(shard, "s.tar"))


@pytest.mark.parametrize(
    ("records", "says"),
    [
        (b"0 path=x\n", "does not frame"),
        (b"3 a=\n", "does not frame"),
        (b"99 path=x\n", "does not frame"),
        (b"7 path\n", "not KEY=VALUE"),
        (b"12 size=-20\n", "size"),
        (b"12 size=1_0\n", "size"),
        (b"8 size=\n", "size"),
        (b"33 size=999999999999999999999999\n", "size"),
        (b"11 path=x\n\x001", "does not frame"),
    ],
)
def test_bad_pax_records(records, says):
    shard = _header("PaxHeader", b"%011o\0" % len(records), b"x") + records.ljust(512, b"\0")
    shard += T.member_header("b.txt", 0) + T.END_OF_ARCHIVE
    with pytest.raises(CorruptShardError, match=f"s.tar: bad PAX header at byte 0 .*{says}"):
        list(T.iter_members(shard, "s.tar"))


def test_pax_records_must_end_where_the_header_says():
    records = W._pax_record("path", b"p.txt")
    shard = _header("PaxHeader", b"%011o\0" % len(records), b"x") + (
        records + W._pax_record("path", b"evil.txt")
    )
    # tarfile reads the padding
    shard = shard.ljust(1024, b"\0") + T.member_header("b.txt", 0) + T.END_OF_ARCHIVE
    with pytest.raises(CorruptShardError, match="bytes after the records"):
        list(T.iter_members(shard, "s.tar"))


def _pax(records: bytes, kind: bytes = b"x") -> bytes:
    return _header("PaxHeader", b"%011o\0" % len(records), kind) + records.ljust(
        -(-len(records) // 512) * 512, b"\0"
    )


def _long_name(name: bytes, kind: bytes = b"L") -> bytes:
    return _header("././@LongLink", b"%011o\0" % len(name), kind) + name.ljust(512, b"\0")


FILE = T.member_header("f.txt", 3) + b"abc".ljust(512, b"\0")


@pytest.mark.parametrize(
    ("shard", "says"),
    [
        (
            _pax(W._pax_record("path", b"a.txt")) + _pax(W._pax_record("path", b"b.txt")) + FILE,
            "repeats",
        ),
        (_long_name(b"a.txt\0") + _long_name(b"b.txt\0") + FILE, "repeats"),
        (_long_name(b"a.txt\0") + _pax(W._pax_record("path", b"b.txt")) + FILE, "sets 'path'"),
        (_pax(W._pax_record("GNU.sparse.size", b"10")) + FILE, "GNU.sparse.size"),
        (_pax(W._pax_record("path", b"x.txt"), b"g") + FILE, "sets 'path'"),
        (_pax(W._pax_record("path", b"a.txt")), "followed by no member"),
        (_long_name(b"a.txt\0"), "followed by no member"),
        (_header("sparse.txt", b"%011o\0" % 0, b"S"), "sparse"),
        (_header("folder/", b"%011o\0" % 512, b"5") + bytes(512), "has 512 bytes of data"),
        (_header("old-folder/", b"%011o\0" % 512, b"\0") + bytes(512), "has 512 bytes of data"),
        (
            _long_name(b"a.txt\0") + _header("d/", b"%011o\0" % 0, b"\0"),
            "folder to some readers only",
        ),
        (
            _long_name(b"file.txt\0") + _header("d", b"%011o\0" % 0, b"5"),
            "folder to some readers only",
        ),
        (_pax(W._pax_record("path", b"a.txt/")) + FILE, "folder's name"),
        (_header("f.txt/", b"%011o\0" % 0), "folder's name"),
    ],
)
def test_what_readers_disagree_on_is_refused(shard, says):
    with pytest.raises(CorruptShardError, match=f"s.tar: .*{says}"):
        list(T.iter_members(shard + T.END_OF_ARCHIVE, "s.tar"))


def test_a_global_pax_header_without_path_or_size_is_read_like_git_archive_writes_it():
    shard = _pax(W._pax_record("comment", b"0123abcd"), b"g") + FILE + T.END_OF_ARCHIVE
    assert [(n, shard[o : o + s]) for n, o, s in T.iter_members(shard, "s.tar")] == [
        ("f.txt", b"abc")
    ]


def test_an_old_style_folder_is_not_a_sample():
    shard = _header("folder/", b"%011o\0" % 0, b"\0") + FILE + T.END_OF_ARCHIVE
    assert [n for n, _, _ in T.iter_members(shard, "s.tar")] == ["f.txt"]


# -- finding 14: empty files, damaged compressed shards, what follows the end ----------------------------------


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "empty file, not a tar"),
        (bytes(100), "only 100 bytes"),
        (bytes(512), "only 512 bytes"),
        (b"x" * 100, "truncated tar header at byte 0"),
    ],
)
def test_an_empty_or_too_short_file_is_not_a_tar(data, says):
    for read in (
        lambda: list(T.iter_members(data, "e.tar")),
        lambda: T.index_samples(data, "e.tar"),
        lambda: count_samples("tar", data, "e.tar"),
    ):
        with pytest.raises(CorruptShardError, match=f"e.tar: {says}"):
            read()


def test_an_empty_tar_is_still_a_shard_of_no_samples():
    assert list(T.iter_members(T.END_OF_ARCHIVE)) == [] == list(T.iter_members(bytes(10240)))


def test_empty_compressed_files_are_errors():
    with pytest.raises(CorruptShardError, match="e.tar.gz: empty file, not a tar"):
        count_samples("tar.gz", gzip.compress(b""), "e.tar.gz")
    with pytest.raises(CorruptShardError, match="e.tar.zst: cannot decompress"):
        count_samples("tar.zst", b"", "e.tar.zst")


SAMPLES = [(f"k{i}", [("bin", os.urandom(3000)), ("cls", b"%d" % i)]) for i in range(4)]


def _shard(compression: str | None) -> bytes:
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink, compression)
    for key, fields in SAMPLES:
        writer.add(key, fields)
    writer.close()
    return sink.getvalue()


def test_zstd_frames_carry_a_checksum_and_stay_deterministic():
    packed = _shard("zstd")
    assert zstandard.get_frame_parameters(packed).has_checksum
    assert packed == _shard("zstd")


def _shard_of_size(tar_size: int) -> tuple[bytes, T.TarShardWriter]:
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink, "zstd", tar_size=tar_size)
    for key, fields in SAMPLES:
        writer.add(key, fields)
    writer.close()
    return sink.getvalue(), writer


def test_a_tar_size_known_in_advance_goes_into_the_zstd_frame():
    size = (
        sum(
            T.sample_size(key, [(ext, len(data)) for ext, data in fields])
            for key, fields in SAMPLES
        )
        + 1024
    )
    packed, writer = _shard_of_size(size)
    assert zstandard.get_frame_parameters(packed).content_size == size == writer.tar_bytes
    assert decompress(packed, "zstd", "s.tar.zst") == _shard(None)
    with pytest.raises(zstandard.ZstdError, match="Src size is incorrect"):
        _shard_of_size(size + 1)


def test_a_flipped_byte_that_still_decompresses_is_an_error():
    plain = _shard(None)
    packed = _shard("zstd")
    at = packed.index(SAMPLES[1][1][0][1][1000:1032]) + 16  # random bytes are stored as they are
    damaged = bytearray(packed)
    damaged[at] ^= 0x01
    # frames as 0.2.0 wrote them
    unchecked = bytearray(zstandard.ZstdCompressor(level=3).compress(plain))
    unchecked[unchecked.index(SAMPLES[1][1][0][1][1000:1032]) + 16] ^= 0x01
    # other bytes, silently
    assert zstandard.ZstdDecompressor().decompress(bytes(unchecked)) != plain
    with pytest.raises(CorruptShardError, match="s.tar.zst: cannot decompress .*checksum"):
        list(iter_shard_samples("tar.zst", bytes(damaged), "s.tar.zst"))


def test_zstd_frames_written_without_a_checksum_still_read():
    legacy = zstandard.ZstdCompressor(level=3).compress(_shard(None))
    assert decompress(legacy, "zstd", "old.tar.zst") == _shard(None)


@pytest.mark.parametrize(
    "tail", [b"junk", b"\0" * 7, zstandard.ZstdCompressor().compress(b"x")[:5]]
)
def test_bytes_after_the_zstd_frame_are_an_error(tail):
    with pytest.raises(CorruptShardError, match="s.tar.zst: cannot decompress"):
        decompress(_shard("zstd") + tail, "zstd", "s.tar.zst")


def test_several_zstd_frames_are_one_stream():
    plain = _shard(None)
    frames = b"".join(
        zstandard.ZstdCompressor(write_checksum=True).compress(plain[i : i + 5000])
        for i in range(0, len(plain), 5000)
    )
    assert decompress(frames, "zstd", "s.tar.zst") == plain


@pytest.mark.parametrize("damage", ["crc", "length", "junk after", "cut"])
def test_gzip_trailer_mismatch_and_trailing_junk_are_errors(damage):
    packed = bytearray(_shard("gzip"))
    if damage == "crc":
        packed[-8] ^= 0x01
    elif damage == "length":
        packed[-1] ^= 0x01
    elif damage == "junk after":
        packed += b"junk"
    else:
        del packed[-3:]
    with pytest.raises(CorruptShardError, match="s.tar.gz: cannot decompress"):
        decompress(bytes(packed), "gzip", "s.tar.gz")


def test_a_zeroed_header_is_not_the_end_of_the_shard():
    plain = bytearray(_shard(None))
    members = list(T.iter_members(bytes(plain)))
    header = members[4][1] - 512  # the third sample's first header
    # it and its first data block: two zero blocks, like the end
    plain[header : header + 1024] = bytes(1024)
    with pytest.raises(
        CorruptShardError, match=f"s.tar: data after the end-of-archive marker at byte {header}"
    ):
        T.index_samples(bytes(plain), "s.tar")


def test_two_tars_joined_are_an_error_not_the_first_one():
    with pytest.raises(CorruptShardError, match="data after the end-of-archive marker"):
        count_samples("tar", _shard(None) + _shard(None), "s.tar")
