"""Tar shards: our writer and reader against each other, against Python's tarfile, and against damage."""

from __future__ import annotations

import gzip
import hashlib
import io
import signal
import tarfile

import pytest
import zstandard

from shardstream.errors import CorruptShardError
from shardstream.formats import count_samples, iter_shard_samples, shard_format_of
from shardstream.formats import tar as T
from shardstream.formats.compression import decompress

LONG_DIR = "/".join(["directory"] * 12)  # 119 bytes: needs the ustar prefix field
NAMES = [
    pytest.param("a.txt", id="short"),
    pytest.param("k" * 96 + ".txt", id="exactly-100"),
    pytest.param("k" * 97 + ".txt", id="101-no-slash-pax"),
    pytest.param(f"{LONG_DIR}/sample.jpg", id="prefix-split"),
    pytest.param("p" * 155 + "/" + "n" * 96 + ".txt", id="prefix-155-name-100"),
    pytest.param("p" * 156 + "/" + "n" * 10 + ".txt", id="prefix-too-long-pax"),
    pytest.param("d/" + "n" * 101 + ".txt", id="basename-over-100-pax"),
    pytest.param("données/été 1.txt", id="unicode-short"),
    pytest.param("日本語/" * 20 + "猫.jpg", id="unicode-long"),
    pytest.param("é" * 60 + ".txt", id="unicode-120-bytes-no-slash"),
    pytest.param("dir.with.dots/a.seg.png", id="dots"),
    pytest.param("x" * 400 + "/" + "y" * 300 + ".bin", id="very-long"),
]
SIZES = [0, 1, 511, 512, 513, 5000]


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def write_shard(samples, compression=None) -> tuple[bytes, int, str, T.TarShardWriter]:
    buf = io.BytesIO()
    w = T.TarShardWriter(buf, compression)
    for key, fields in samples:
        w.add(key, fields)
    nbytes, digest = w.close()
    return buf.getvalue(), nbytes, digest, w


def raw_member_shard(members) -> bytes:
    """A tar built from (name, data) members, for shapes the sample writer does not make."""
    out = b""
    for name, data in members:
        out += T.member_header(name, len(data)) + data + bytes(-len(data) % 512)
    return out + T.END_OF_ARCHIVE


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", NAMES)
def test_member_header_and_size_match_the_writer(name, size):
    key, ext = T.split_name(name)
    data = payload(size)
    shard, nbytes, _, w = write_shard([(key, [(ext, data)])])
    assert nbytes == len(shard) == T.member_size(name, size) + len(T.END_OF_ARCHIVE)
    assert w.tar_bytes == len(shard)
    header = T.member_header(name, size)
    assert len(header) % 512 == 0
    assert shard.startswith(header + data)
    assert T.sample_size(key, [(ext, size)]) == T.member_size(name, size)


# the names whose header is one plain ustar block, without the prefix field
FITTING_NAMES = [p for p in NAMES if len(p.values[0].encode()) <= 100]


@pytest.mark.parametrize("size", [*SIZES, 8**11 - 1])
@pytest.mark.parametrize("name", FITTING_NAMES)
def test_plain_header_is_the_member_header_of_names_that_fit(name, size):
    assert T.plain_header(name.encode(), size) == T.member_header(name, size)


@pytest.mark.parametrize("size", [0, 700])
@pytest.mark.parametrize("name", NAMES)
def test_tarfile_reads_every_name(name, size):
    data = payload(size, seed=3)
    shard = raw_member_shard([(name, data)])
    with tarfile.open(fileobj=io.BytesIO(shard)) as tf:
        members = tf.getmembers()
        assert [m.name for m in members] == [name]
        assert members[0].isreg()
        assert members[0].size == size
        assert tf.extractfile(members[0]).read() == data
    assert [(n, s) for n, _, s in T.iter_members(shard)] == [(name, size)]


def test_short_names_use_a_single_ustar_block_long_ones_pax():
    assert len(T.member_header("a" * 100, 5)) == 512
    assert len(T.member_header(f"{LONG_DIR}/x.jpg", 5)) == 512  # prefix split, no PAX
    pax = T.member_header("a" * 101, 5)
    assert len(pax) > 512
    assert pax[156:157] == b"x"  # a PAX extended header first
    assert pax[-512:][156:157] == b"0"  # then the regular file header


def test_headers_are_deterministic_ustar():
    header = T.member_header("k.txt", 10)
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
    assert info.name == "k.txt"
    assert info.mode == 0o644
    assert info.uid == info.gid == 0
    assert info.mtime == 0
    assert header[257:263] == b"ustar\0"


def test_huge_member_size_goes_into_pax():
    size = 8**11  # one more than the 11 octal digits hold
    header = T.member_header("big.bin", size)
    assert b"size=8589934592\n" in header
    assert T.member_size("big.bin", size) == len(header) + size
    # The reader takes the PAX size: the shard claims 8 GiB and is reported truncated.
    with pytest.raises(CorruptShardError, match="needs 8589934592 bytes"):
        list(T.iter_members(header + bytes(512), "big-shard"))


SAMPLES = [
    ("000", [("cls", b"3"), ("jpg", payload(1000)), ("json", b'{"a": 1}')]),
    ("001", [("cls", b"4"), ("jpg", b""), ("json", b"{}")]),
    (f"{LONG_DIR}/002", [("seg.png", payload(600, 1)), ("txt", "été".encode())]),
    ("日本/猫 3", [("txt", payload(511, 2))]),
    ("a" * 200, [("bin", payload(513, 4))]),
]


def test_iter_members_gives_offsets_of_the_data():
    shard, *_ = write_shard(SAMPLES)
    expected = [(f"{k}.{e}", d) for k, fields in SAMPLES for e, d in fields]
    members = list(T.iter_members(shard, "s"))
    assert [m[0] for m in members] == [name for name, _ in expected]
    for (_, offset, size), (_, data) in zip(members, expected):
        assert size == len(data)
        assert shard[offset : offset + size] == data
        assert offset % 512 == 0


def test_iter_samples_groups_members_by_key():
    shard, *_ = write_shard(SAMPLES)
    got = [
        (k, {e: shard[o : o + n] for e, (o, n) in fields.items()})
        for k, fields in T.iter_samples(shard)
    ]
    assert got == [(k, dict(fields)) for k, fields in SAMPLES]


def test_iter_samples_accepts_memoryview_and_bytearray():
    shard, *_ = write_shard(SAMPLES)
    assert [k for k, _ in T.iter_samples(memoryview(shard))] == [k for k, _ in SAMPLES]
    assert [k for k, _ in T.iter_samples(bytearray(shard))] == [k for k, _ in SAMPLES]


def test_writer_accepts_memoryview_and_bytearray_fields():
    shard, *_ = write_shard([("k", [("a", bytearray(b"xy")), ("b", memoryview(b"abcdef")[1:4])])])
    assert list(iter_shard_samples("tar", shard)) == [{"__key__": "k", "a": b"xy", "b": b"bcd"}]


def test_empty_shard_is_just_the_end_marker():
    shard, nbytes, digest, w = write_shard([])
    assert shard == T.END_OF_ARCHIVE
    assert w.samples == 0
    assert list(T.iter_samples(shard)) == []
    with tarfile.open(fileobj=io.BytesIO(shard)) as tf:
        assert tf.getmembers() == []


def test_close_reports_size_and_sha256_of_what_was_written():
    for compression in (None, "zstd", "gzip"):
        shard, nbytes, digest, w = write_shard(SAMPLES, compression)
        assert nbytes == len(shard)
        assert digest == hashlib.sha256(shard).hexdigest()
        assert w.samples == len(SAMPLES)


def test_same_samples_give_the_same_bytes():
    for compression in (None, "zstd", "gzip"):
        assert write_shard(SAMPLES, compression)[0] == write_shard(SAMPLES, compression)[0]


def test_python_tarfile_reads_our_shards_member_by_member():
    shard, *_ = write_shard(SAMPLES)
    expected = [(f"{k}.{e}", d) for k, fields in SAMPLES for e, d in fields]
    with tarfile.open(fileobj=io.BytesIO(shard), mode="r:") as tf:
        got = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    assert got == expected


@pytest.mark.parametrize(("compression", "fmt"), [("zstd", "tar.zst"), ("gzip", "tar.gz")])
def test_compressed_round_trip(compression, fmt):
    plain, *_ = write_shard(SAMPLES)
    packed, *_ = write_shard(SAMPLES, compression)
    assert packed != plain
    assert len(packed) < len(plain)
    if compression == "zstd":
        assert packed[:4] == b"\x28\xb5\x2f\xfd"
        assert zstandard.ZstdDecompressor().decompressobj().decompress(packed) == plain
    else:
        assert gzip.decompress(packed) == plain
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tf:
            assert [m.name for m in tf.getmembers()][:2] == ["000.cls", "000.jpg"]
    assert decompress(packed, compression, "s") == plain
    samples = list(iter_shard_samples(fmt, packed, "s"))
    assert samples == [{"__key__": k, **dict(fields)} for k, fields in SAMPLES]
    assert count_samples(fmt, packed, "s") == len(SAMPLES)


def test_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="unknown tar compression 'lzma'"):
        T.TarShardWriter(io.BytesIO(), "lzma")


@pytest.mark.parametrize(("compression", "fmt"), [("zstd", "tar.zst"), ("gzip", "tar.gz")])
def test_undecompressable_shard(compression, fmt):
    with pytest.raises(CorruptShardError, match=f"bad-shard.{fmt}: cannot decompress"):
        list(
            iter_shard_samples(fmt, b"this is not compressed data at all" * 10, f"bad-shard.{fmt}")
        )


def test_truncated_gzip_shard():
    packed, *_ = write_shard(SAMPLES, "gzip")
    with pytest.raises(CorruptShardError, match="s.tar.gz: cannot decompress"):
        list(iter_shard_samples("tar.gz", packed[: len(packed) // 2], "s.tar.gz"))


@pytest.mark.parametrize("keep", ["half", "all-but-one-byte"])
def test_truncated_zstd_shard(keep):
    packed, *_ = write_shard(SAMPLES, "zstd")
    cut = len(packed) // 2 if keep == "half" else len(packed) - 1
    with pytest.raises(CorruptShardError, match="s.tar.zst"):
        list(iter_shard_samples("tar.zst", packed[:cut], "s.tar.zst"))


def _member_offsets(shard: bytes) -> list[int]:
    """Byte offset of each member's (first) header."""
    starts, pos = [], 0
    for _, data_offset, size in T.iter_members(shard):
        starts.append(pos)
        pos = data_offset + size + (-size % 512)
    return starts


@pytest.mark.parametrize("where", [0, 1, 100, 124, 150, 156, 257, 345, 511])
def test_flipped_byte_in_a_header_names_shard_and_offset(where):
    shard, *_ = write_shard(SAMPLES)
    header_at = _member_offsets(shard)[2]
    damaged = bytearray(shard)
    damaged[header_at + where] ^= 0x41
    with pytest.raises(CorruptShardError) as info:
        list(T.iter_members(bytes(damaged), "s3://b/shard-000007.tar"))
    text = str(info.value)
    assert "s3://b/shard-000007.tar" in text
    assert f"at byte {header_at}" in text


def test_flipped_byte_in_a_pax_header_names_its_offset():
    shard, *_ = write_shard(SAMPLES)
    pax_at = _member_offsets(shard)[-1]  # the 200-byte key needs a PAX header
    assert shard[pax_at + 156 : pax_at + 157] == b"x"
    damaged = bytearray(shard)
    damaged[pax_at + 3] ^= 0x01
    with pytest.raises(CorruptShardError, match=f"shard-9.tar: bad tar header at byte {pax_at}"):
        list(T.iter_samples(bytes(damaged), "shard-9.tar"))


def _with_checksum(header: bytes) -> bytes:
    fixed = bytearray(header)
    fixed[148:156] = b" " * 8
    fixed[148:156] = b"%06o\0 " % sum(fixed)
    return bytes(fixed)


def test_garbage_size_field_with_a_valid_checksum():
    header = bytearray(T.member_header("k.txt", 3))
    header[124:136] = b"12x4567\0\0\0\0\0"
    first = T.member_header("j.txt", 2) + b"ok" + bytes(510)  # 1024 bytes
    shard = first + _with_checksum(bytes(header)) + bytes(1536)
    with pytest.raises(
        CorruptShardError, match=r"s.tar: bad tar header at byte 1024 \(number field"
    ):
        list(T.iter_members(shard, "s.tar"))


def _pax_shard() -> tuple[bytearray, int]:
    """A shard whose only member needs a PAX path record; (shard, offset of the record's length digits)."""
    shard = bytearray(raw_member_shard([("x" * 150 + ".txt", b"abc")]))
    return shard, 512


def test_malformed_pax_record_is_a_corrupt_shard():
    shard, at = _pax_shard()
    assert shard[at : at + 4] == b"164 "
    shard[at + 1] = ord("x")  # "1x4 path=...": the length is not a number
    with pytest.raises(CorruptShardError, match="s.tar: bad PAX header at byte 0"):
        list(T.iter_members(bytes(shard), "s.tar"))


@pytest.fixture
def alarm():
    """Fail with TimeoutError instead of hanging (the PAX records after a header are not checksummed)."""
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs signal.setitimer")

    def stop(*_):
        raise TimeoutError("the reader did not finish")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_zero_pax_record_length_does_not_hang(alarm):
    shard, at = _pax_shard()
    shard[at : at + 3] = b"000"
    with pytest.raises(CorruptShardError, match="s.tar"):
        list(T.iter_members(bytes(shard), "s.tar"))


def test_check_false_skips_the_checksum():
    shard, *_ = write_shard(SAMPLES)
    damaged = bytearray(shard)
    damaged[0] = ord("Z")  # the first member becomes "Z00.cls"
    assert next(T.iter_members(bytes(damaged), check=False))[0] == "Z00.cls"


def test_truncated_in_the_middle_of_a_members_data():
    shard, *_ = write_shard(SAMPLES)
    _, data_at, size = list(T.iter_members(shard))[1]  # 000.jpg, 1000 bytes
    cut = data_at + size // 2
    with pytest.raises(CorruptShardError) as info:
        list(T.iter_members(shard[:cut], "cut.tar"))
    text = str(info.value)
    assert "cut.tar" in text
    assert f"truncated at byte {cut}" in text
    assert f"member at byte {data_at - 512}" in text


@pytest.mark.parametrize("into", [1, 100, 300, 511])
def test_truncated_in_the_middle_of_a_header(into):
    shard, *_ = write_shard(SAMPLES)
    header_at = _member_offsets(shard)[3]
    with pytest.raises(CorruptShardError) as info:
        list(T.iter_members(shard[: header_at + into], "cut.tar"))
    assert f"cut.tar: truncated tar header at byte {header_at}" in str(info.value)


@pytest.mark.parametrize("where", ["member-boundary", "in-padding"])
def test_truncated_at_a_member_boundary_is_detected(where):
    shard, *_ = write_shard(SAMPLES)
    _, data_at, size = list(T.iter_members(shard))[1]  # 000.jpg, 1000 bytes + 24 bytes of padding
    cut = {"member-boundary": _member_offsets(shard)[3], "in-padding": data_at + size + 3}[where]
    with pytest.raises(CorruptShardError, match="cut.tar"):
        list(T.iter_members(shard[:cut], "cut.tar"))


def test_duplicate_member_in_one_sample():
    shard = raw_member_shard([("k1.txt", b"a"), ("k1.jpg", b"b"), ("k1.txt", b"c")])
    with pytest.raises(CorruptShardError) as info:
        list(T.iter_samples(shard, "dup-shard.tar"))
    text = str(info.value)
    assert "dup-shard.tar" in text
    assert "'k1'" in text and "'k1.txt'" in text


def test_same_key_again_after_another_key_is_a_new_sample():
    shard = raw_member_shard([("k1.txt", b"a"), ("k2.txt", b"b"), ("k1.txt", b"c")])
    assert [k for k, _ in T.iter_samples(shard)] == ["k1", "k2", "k1"]


def test_unkeyed_members_are_skipped_and_reported():
    shard = raw_member_shard(
        [("README", b"r"), ("a.txt", b"1"), (".hidden", b"h"), ("b.txt", b"2")]
    )
    unkeyed: list[str] = []
    assert [k for k, _ in T.iter_samples(shard, unkeyed=unkeyed)] == ["a", "b"]
    assert unkeyed == ["README", ".hidden"]
    assert count_samples("tar", shard) == 2


def test_directories_and_links_are_not_samples():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        d = tarfile.TarInfo("folder")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        data = b"payload"
        f = tarfile.TarInfo("folder/" + "long" * 40 + ".txt")  # GNU long name ('L' record)
        f.size = len(data)
        tf.addfile(f, io.BytesIO(data))
        link = tarfile.TarInfo("folder/link.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = "x"
        tf.addfile(link)
    shard = buf.getvalue()
    members = list(T.iter_members(shard, "gnu.tar"))
    assert [m[0] for m in members] == ["folder/" + "long" * 40 + ".txt"]
    _, offset, size = members[0]
    assert shard[offset : offset + size] == b"payload"


def test_reads_tarfile_pax_shards():
    buf = io.BytesIO()
    names = ["é" * 80 + ".txt", "x/" * 100 + "y.bin", "plain.txt"]
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = i * 300
            tf.addfile(info, io.BytesIO(payload(i * 300)))
    shard = buf.getvalue()
    got = [(n, shard[o : o + s]) for n, o, s in T.iter_members(shard)]
    assert got == [(name, payload(i * 300)) for i, name in enumerate(names)]


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        ("a.txt", ("a", "txt")),
        ("a.seg.png", ("a", "seg.png")),
        ("dir.x/a.txt", ("dir.x/a", "txt")),
        ("dir.x/y.z/a.b.c", ("dir.x/y.z/a", "b.c")),
        ("a/b/c.tar.gz", ("a/b/c", "tar.gz")),
        ("日本/猫.jpg", ("日本/猫", "jpg")),
        ("a b/c d.e f", ("a b/c d", "e f")),
        ("noext", None),
        ("dir.x/noext", None),
        (".hidden", None),
        ("dir/.hidden", None),
        (".hidden.txt", None),
        ("trailing.", None),
        ("", None),
    ],
)
def test_split_name(member, expected):
    assert T.split_name(member) == expected


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.tar", "tar"),
        ("A.TAR", "tar"),
        ("a.tar.zst", "tar.zst"),
        ("a.tar.gz", "tar.gz"),
        ("a.tgz", "tar.gz"),
        ("a.arrow", "arrow"),
        ("a.feather", "arrow"),
        ("a.zip", None),
        ("tar", None),
    ],
)
def test_shard_format_of(name, fmt):
    assert shard_format_of(name) == fmt


# -- the numpy fast path of index_samples agrees with the careful parser ---------------------------------------


def _written(samples: list[tuple[str, list[tuple[str, bytes]]]]) -> bytes:
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink)
    for key, fields in samples:
        writer.add(key, fields)
    writer.close()
    return sink.getvalue()


@pytest.mark.parametrize(
    "samples",
    [
        [
            ("a/b/k1", [("jpg", b"x" * 700), ("cls", b"3")]),
            ("a/b/k2", [("jpg", b""), ("txt", b"hi")]),
        ],
        [
            ("d" * 120 + "/k", [("bin", b"1" * 513)]),
            ("ü ñ/k2", [("seg.png", b"p" * 1024)]),
        ],  # ustar prefix, unicode
        [("x" * 300, [("bin", b"1")])],  # needs a PAX header: the careful parser takes it
    ],
)
def test_index_samples_fast_path_equals_the_careful_parser(samples):
    data = _written(samples)
    careful = list(T.iter_samples(data, "s"))
    keys, fields = T.index_samples(data, "s")
    assert keys == [k for k, _ in careful] and fields == [f for _, f in careful]
    assert keys == [k for k, _ in samples]


def test_index_samples_fast_path_is_taken_for_plain_shards_and_still_checks_headers():
    data = bytearray(_written([(f"k{i}", [("bin", bytes([i]) * (100 + i))]) for i in range(20)]))
    assert T._index_plain(bytes(data), "s") is not None
    data[4 * 512 + 5] ^= 0x01  # a name byte of the third header (headers at blocks 0, 2, 4, ...)
    with pytest.raises(CorruptShardError, match="byte"):
        T.index_samples(bytes(data), "s")


def test_index_samples_reports_truncation_like_the_careful_parser():
    data = _written([(f"k{i}", [("bin", b"z" * 600)]) for i in range(5)])
    with pytest.raises(CorruptShardError, match="truncated"):
        T.index_samples(data[: 512 * 6], "s")


def _with_header_change(data: bytes, change) -> bytes:
    header = bytearray(data[:512])
    change(header)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + data[512:]


def test_index_samples_fast_path_reads_a_twelve_digit_size_like_tarfile():
    data = _written([("k", [("jpg", b"j" * 100)])])
    odd = _with_header_change(data, lambda h: h.__setitem__(slice(124, 136), b"%012o" % 100))
    careful = list(T.iter_samples(odd, "s"))
    assert T.index_samples(odd, "s") == ([k for k, _ in careful], [f for _, f in careful])
    assert careful[0][1]["jpg"] == (512, 100)


def test_index_samples_fast_path_ignores_an_empty_prefix_with_bytes_after_it():
    data = _written([("a", [("bin", b"1")])])
    # prefix[0] is NUL
    odd = _with_header_change(data, lambda h: h.__setitem__(slice(346, 350), b"junk"))
    assert T.index_samples(odd, "s")[0] == ["a"] == [k for k, _ in T.iter_samples(odd, "s")]
