"""Fuzzing the shard formats.

The tar parser against Python's ``tarfile``: valid tars (written by tarfile in three formats and by
our writer), then mutated: negative, huge and base-256 sizes, PAX records, GNU long names, other
member types, byte flips, truncation, zeroed ranges, joined tars. Every case ends in a
:class:`CorruptShardError` naming the shard, or in exactly the regular files tarfile reads (names,
sizes, bytes), after at most one member per 512 bytes; never another exception, never a hang.

Every shard format against damage (flips, truncation, zeroed ranges, appended bytes) on shards
our writers made: a named error, or the original samples (tar.zst, tar.gz), tarfile's reading
(tar: a payload byte is not checked by the parser, that is what sha256 is for), or for Arrow a
table that passes pyarrow's full validation (its buffers carry no checksum).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import signal
import tarfile

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import CorruptShardError, ShardstreamError
from shardstream.formats import arrow as A
from shardstream.formats import iter_shard_samples
from shardstream.formats import tar as T
from shardstream.formats import tar_writer as W

_FUZZ = settings(
    deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


def fuzz(examples: int) -> settings:
    """Reproducible (derandomized, no example database) and bounded runs."""
    return settings(_FUZZ, max_examples=examples)


NAME = "fuzz-shard.tar"


# -- valid tars ------------------------------------------------------------------------------------------------


def _payload(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed * 7) % 251 for i in range(n))


_names = st.one_of(
    st.builds(
        lambda i, ext: f"k{i}.{ext}", st.integers(0, 3), st.sampled_from(["txt", "jpg", "seg.png"])
    ),
    # ustar prefix / PAX
    st.builds(lambda d, i: f"{'d' * d}/sub/k{i}.bin", st.integers(1, 140), st.integers(0, 2)),
    st.builds(lambda n: "é" * n + ".txt", st.integers(1, 80)),  # unicode, long without a slash
    st.sampled_from(["noext", "dir.x/a.b", "README"]),
)
_members = st.lists(
    st.tuples(_names, st.integers(0, 1100), st.sampled_from("fffffdl")), min_size=0, max_size=5
)


@st.composite
def tarfile_tars(draw) -> bytes:
    fmt = draw(st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8") as tf:
        for i, (name, size, kind) in enumerate(draw(_members)):
            info = tarfile.TarInfo(
                name if fmt != tarfile.USTAR_FORMAT or len(name.encode()) <= 100 else f"u{i}.txt"
            )
            if kind == "d":
                info.type = tarfile.DIRTYPE
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, "k0.txt"
            else:
                info.size = size
            tf.addfile(info, io.BytesIO(_payload(size, i)) if kind == "f" else None)
    return buf.getvalue()


@st.composite
def writer_tars(draw) -> bytes:
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink)
    keys = draw(
        st.lists(st.sampled_from(["a", "b/c", "k" * 120, "p" * 160 + "/q", "日本/猫"]), max_size=4)
    )
    for i, key in enumerate(keys):
        sizes = draw(st.lists(st.integers(0, 1100), min_size=1, max_size=3))
        writer.add(
            f"{key}{i}", [(ext, _payload(n, i)) for ext, n in zip(("cls", "jpg", "json"), sizes)]
        )
    writer.close()
    return sink.getvalue()


# -- mutations ---------------------------------------------------------------------------------------------


def _headers(buf: bytes) -> list[int]:
    """Offsets of every header block of a valid tar (extended headers too), as tarfile finds them."""
    with tarfile.open(fileobj=io.BytesIO(buf), mode="r:") as tf:
        return sorted({m.offset for m in tf} | {m.offset_data - 512 for m in tf})


def _fix_checksum(buf: bytearray, at: int) -> None:
    buf[at + 148 : at + 156] = b" " * 8
    buf[at + 148 : at + 156] = b"%06o\0 " % sum(buf[at : at + 512])


def _pax(records: bytes, kind: bytes = b"x") -> bytes:
    header = bytearray(T.member_header("pax", len(records)))
    header[156:157] = kind
    _fix_checksum(header, 0)
    return bytes(header) + records + bytes(-len(records) % 512)


def _record(key: bytes, value: bytes, delta: int = 0) -> bytes:
    """A PAX record, its length off by ``delta``."""
    length, rest = W._pax_record(key.decode(), value).split(b" ", 1)
    return b"%d %s" % (int(length) + delta, rest)


_sizes = st.one_of(
    st.sampled_from(
        [
            b"-0000002000\0",
            b"-0000003000\0",
            b"-1\0",
            b"77777777777\0",
            b"0o0000012\0",
            b" 12 \0",
            b"12 34\0",
            b"\x80" + bytes(10) + b"\x05",
            b"\xff" * 12,
            b"\x81" + bytes(11),
            b"\x80" + (2**80).to_bytes(11, "big"),
            b"0000000001\0\0",
            b"\0\0garbage\0\0",
        ]
    ),
    st.integers(0, 4000).map(lambda n: b"%011o\0" % n),
    st.integers(0, 4000).map(lambda n: b"\x80" + n.to_bytes(11, "big")),
)
_fields = st.one_of(
    st.tuples(st.just(124), _sizes),
    st.tuples(
        st.just(156),
        st.sampled_from(
            [
                b"0",
                b"\0",
                b"1",
                b"2",
                b"5",
                b"7",
                b"x",
                b"g",
                b"X",
                b"L",
                b"K",
                b"S",
                b"V",
                b"M",
                b"D",
                b"\xff",
            ]
        ),
    ),
    st.tuples(st.just(0), st.sampled_from([b"a.txt/\0", b"\0", b"x" * 100, b"dir/\0"])),
    st.tuples(
        st.just(100),
        st.sampled_from([b"-000644\0", b"0000644 ", b"garbage!", b"\x80" * 8, b"   \0    "]),
    ),
    st.tuples(st.just(136), st.sampled_from([b"\xff" * 12, b"1234567890123", b"+0000000001\0"])),
    st.tuples(st.just(257), st.sampled_from([b"ustar  \0", b"\0" * 8, b"ustar\x0000"])),
    st.tuples(st.just(345), st.sampled_from([b"pre", b"\0x", b"p" * 155])),
    st.tuples(st.just(148), st.sampled_from([b"\0" * 8, b"-1\0"])),
)
_values = st.one_of(
    st.integers(0, 3000).map(lambda n: str(n).encode()),
    st.sampled_from([b"-2000", b"-1536", b"-2048", b"", b"1_0", b" 12", b"9" * 30, b"1e3"]),
)
_records = st.lists(
    st.one_of(
        st.builds(_record, st.just(b"size"), _values, st.sampled_from([0, 0, 0, -1, 1, -100])),
        st.builds(
            _record,
            st.just(b"path"),
            st.sampled_from([b"p.txt", b"dir/", b"a/b.jpg", "é.txt".encode(), b""]),
        ),
        st.builds(
            _record,
            st.sampled_from(
                [
                    b"comment",
                    b"GNU.sparse.size",
                    b"GNU.sparse.name",
                    b"mtime",
                    b"hdrcharset",
                    b"linkpath",
                ]
            ),
            st.sampled_from([b"1", b"BINARY", b"x.txt"]),
        ),
        st.sampled_from(
            [
                b"0 path=x\n",
                b"3 a=\n",
                b"5 a=b\n",
                b"99 path=x\n",
                b"x path=y\n",
                b"6 path\n",
                b"\0\0",
            ]
        ),
    ),
    max_size=3,
).map(b"".join)
_inserts = st.one_of(
    st.builds(_pax, _records, st.sampled_from([b"x", b"x", b"g", b"X"])),
    st.builds(
        lambda name, kind: _pax(name, kind),
        st.sampled_from([b"L.txt\0", b"long/" * 30 + b"n.txt\0", b"noterm.txt", b"a/\0", b"\0"]),
        st.sampled_from([b"L", b"K"]),
    ),
)
_damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("zero"), st.integers(0, 10**6), st.integers(1, 1100)),
    st.tuples(st.just("append"), st.sampled_from([0, 1, 2]), st.just(0)),
)


def damage(buf: bytearray, how: tuple[str, int, int], original: bytes = b"") -> bytearray:
    """``buf`` after one of: a flipped byte, truncation, a zeroed range, appended bytes (zeros, junk, a tar)."""
    kind, where, arg = how
    where = where % (len(buf) + 1)
    if kind == "flip" and buf:
        buf[where % len(buf)] ^= arg
    elif kind == "cut":
        del buf[where:]
    elif kind == "zero":
        buf[where : where + arg] = bytes(len(buf[where : where + arg]))
    elif kind == "append":
        buf += [bytes(512), b"junk" * 200, original][arg]
    return buf


@st.composite
def mutated_tars(draw) -> tuple[bytes, bytes]:
    original = draw(st.one_of(tarfile_tars(), writer_tars(), st.just(T.END_OF_ARCHIVE)))
    buf = bytearray(original)
    headers = _headers(original)
    if headers and draw(st.booleans()):
        at = draw(st.sampled_from(headers))
        start, value = draw(_fields)
        buf[at + start : at + start + len(value)] = value
        if draw(st.integers(0, 9)):  # mostly with a right checksum: the parser must not trust it
            _fix_checksum(buf, at)
    if headers and draw(st.booleans()):
        at = draw(st.sampled_from(headers))
        buf[at:at] = draw(_inserts)
    for how in draw(st.lists(_damage, max_size=2)):
        damage(buf, how, original)
    return original, bytes(buf)


# -- the rule -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def watchdog(seconds: float = 10.0):
    """Turn a hang into a failure (a case takes milliseconds; the limit is generous)."""

    def stop(*_) -> None:
        raise TimeoutError(f"a case still runs after {seconds} s: the parser loops")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def tarfile_reads(buf: bytes):
    """The regular files (name, size, data) Python's tarfile reads, or a string saying why it cannot."""
    try:
        with tarfile.open(
            fileobj=io.BytesIO(buf), mode="r:", encoding="utf-8", errors="surrogateescape"
        ) as tf:
            found = []
            for count, member in enumerate(tf, 1):
                if count > len(buf) // 512 + 1:
                    return "tarfile loops"  # negative sizes, before Python 3.12
                if member.isreg():
                    found.append((member.name, member.size, tf.extractfile(member).read()))
            return found
    except Exception as exc:  # tarfile's own errors, and worse ones (OverflowError, RecursionError)
        return f"tarfile: {type(exc).__name__}"


def we_read(buf: bytes):
    """Our members as (name, size, data), or None after a CorruptShardError naming the shard."""
    try:
        members = list(itertools.islice(T.iter_members(buf, NAME), len(buf) // 512 + 1))
    except CorruptShardError as exc:
        assert NAME in str(exc) and "\n" not in str(exc)
        return None
    assert len(members) <= len(buf) // 512  # each member advanced the position by a block or more
    return [(name, size, buf[offset : offset + size]) for name, offset, size in members]


def check_tar(buf: bytes) -> list | None:
    with watchdog():
        return _check_tar(buf)


def _check_tar(buf: bytes) -> list | None:
    ours = we_read(buf)
    if ours is not None:
        assert ours == tarfile_reads(buf)
    try:  # the numpy fast path reads what the careful parser reads, or leaves it to the careful parser
        plain = T._index_plain(buf, NAME)
    except CorruptShardError:
        assert ours is None
    else:
        assert plain is None or [(n, s, buf[o : o + s]) for n, o, s in zip(*plain)] == ours
    try:
        careful = list(T.iter_samples(buf, NAME))
    except CorruptShardError:
        careful = None  # a damaged tar, or a member twice in one sample
    try:
        keys, fields = T.index_samples(buf, NAME)
    except CorruptShardError:
        assert careful is None
    else:
        assert list(zip(keys, fields)) == careful
    return ours


@fuzz(60)
@given(st.one_of(tarfile_tars(), writer_tars()))
def test_valid_tars_read_as_tarfile_reads_them(buf):
    assert check_tar(buf) == tarfile_reads(buf)


@fuzz(400)
@given(mutated_tars())
def test_mutated_tars_read_as_tarfile_reads_them_or_fail_with_a_named_error(case):
    _, buf = case
    check_tar(buf)


# -- damage to every shard format ---------------------------------------------------------------------------

SAMPLES = [
    (f"s/{i:03d}", [("cls", str(i).encode()), ("bin", _payload(300 + 97 * i, i))])
    for i in range(12)
]


def _tar_shard(compression: str | None) -> bytes:
    sink = io.BytesIO()
    writer = T.TarShardWriter(sink, compression)
    for key, fields in SAMPLES:
        writer.add(key, fields)
    writer.close()
    return sink.getvalue()


SHARDS = {"tar": _tar_shard(None), "tar.zst": _tar_shard("zstd"), "tar.gz": _tar_shard("gzip")}
EXPECTED = [{"__key__": key, **dict(fields)} for key, fields in SAMPLES]


def read_samples(fmt: str, buf: bytes):
    try:
        with watchdog():
            return list(iter_shard_samples(fmt, buf, f"fuzz-shard.{fmt}"))
    except ShardstreamError as exc:
        assert f"fuzz-shard.{fmt}" in str(exc)
        return None


@fuzz(150)
@given(st.sampled_from(["tar", "tar.zst", "tar.gz"]), st.lists(_damage, min_size=1, max_size=3))
def test_damaged_tar_shards_give_a_named_error_or_the_right_samples(fmt, damages):
    buf = bytearray(SHARDS[fmt])
    for how in damages:
        damage(buf, how, SHARDS[fmt])
    got = read_samples(fmt, bytes(buf))
    if got is None or bytes(buf) == SHARDS[fmt]:
        return
    if fmt == "tar":  # the parser cannot see a changed payload byte; it reads what tarfile reads
        assert check_tar(bytes(buf)) is not None
    else:
        assert got == EXPECTED


def _arrow_shard() -> bytes:
    sink = io.BytesIO()
    table = pa.table(
        {
            "id": pa.array(range(40), pa.int64()),
            "text": pa.array([f"row {i} " * (i % 7) for i in range(40)]),
            "blob": pa.array([_payload(i * 5, i) for i in range(40)], pa.binary()),
            "tags": pa.array(
                [[i, i + 1] if i % 3 else None for i in range(40)], pa.list_(pa.int32())
            ),
        }
    )
    writer = A.ArrowShardWriter(sink, table.schema)
    for batch in table.to_batches(max_chunksize=10):
        writer.add_batch(batch)
    writer.close()
    return sink.getvalue()


ARROW = _arrow_shard()


@fuzz(120)
@given(st.lists(_damage, min_size=1, max_size=3))
def test_damaged_arrow_shards_give_a_named_error_or_a_valid_table(damages):
    data = bytearray(ARROW)
    for how in damages:
        damage(data, how, ARROW)
    buf = bytes(data)
    try:
        with watchdog():
            table = A.read_table(buf, "fuzz-shard.arrow")
            rows = list(A.iter_rows(buf, "fuzz-shard.arrow"))
    except CorruptShardError as exc:
        assert "fuzz-shard.arrow" in str(exc)
        return
    # a changed value can pass (the buffers have no checksum); a broken layout cannot
    table.validate(full=True)
    assert rows == table.to_pylist()
