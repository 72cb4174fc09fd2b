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


SAMPLES = [
    (f"{i:04d}", [("cls", str(i).encode()), ("jpg", bytes([i]) * (100 + 700 * i))])
    for i in range(5)
]


def test_each_span_is_the_sample_as_tar_reads_it():
    tar, raw = _shard(SAMPLES)
    index = parse_index(raw, "s.tar", len(SAMPLES), len(tar))
    assert len(index) == 5 and int(index.offsets[-1]) == len(tar) - len(T.END_OF_ARCHIVE)
    for i, (key, fields) in enumerate(SAMPLES):
        start, end = index.span(i)
        span = tar[start:end]
        index.check(i, span, "s.tar")
        with tarfile.open(
            fileobj=io.BytesIO(span + T.END_OF_ARCHIVE)
        ) as t:  # a real client reads the span alone
            got = {m.name: t.extractfile(m).read() for m in t.getmembers()}
        assert got == {f"{key}.{ext}": data for ext, data in fields}


def test_a_changed_sample_fails_its_check():
    tar, raw = _shard(SAMPLES)
    index = parse_index(raw, "s.tar", 5, len(tar))
    start, end = index.span(2)
    damaged = bytearray(tar[start:end])
    damaged[-600] ^= 1
    with pytest.raises(
        CorruptShardError, match=r"s\.tar: sample at position 2 in the shard: its bytes differ"
    ):
        index.check(2, bytes(damaged), "s.tar")
    with pytest.raises(CorruptShardError, match=r"sample 'k3' \(position 3 in the shard\)"):
        index.check(3, tar[start:end], "s.tar", "k3")  # another sample's bytes
    assert (
        index.sample_name(2) == f"sample {index.samples('s.tar')[0][2]!r} (position 2 in the shard)"
    )


def _encode(offsets, digests, first, data_offsets, sizes, names) -> bytes:
    blob = b"".join(n.encode() + b"\0" for n in names)
    u8 = lambda v: np.asarray(v, dtype="<u8").tobytes()  # noqa: E731
    return (
        MAGIC
        + struct.pack("<QQQ", len(offsets) - 1, len(sizes), len(blob))
        + u8(offsets)
        + digests
        + u8(first)
        + u8(data_offsets)
        + u8(sizes)
        + blob
    )


def _parts(raw, tar):
    ix = parse_index(raw, "s.tar", 5, len(tar))
    return dict(
        offsets=ix.offsets.tolist(),
        digests=ix.digests,
        first=ix.first.tolist(),
        data_offsets=ix.data_offsets.tolist(),
        sizes=ix.sizes.tolist(),
        names=list(ix.names),
    )


def _with(p, **changes):
    return _encode(**{**p, **changes})


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda raw, p: b"XXXXXXXX" + raw[8:], "not a shardstream sample index"),
        (lambda raw, p: raw[:5], "not a shardstream sample index"),
        (lambda raw, p: raw[:-1], "not the size its counts give"),
        (lambda raw, p: raw + b"\0", "not the size its counts give"),
        (lambda raw, p: _with(p, offsets=[512] + p["offsets"][1:]), "not increasing"),
        (
            lambda raw, p: _with(
                p, offsets=p["offsets"][:2] + [p["offsets"][1]] + p["offsets"][3:]
            ),
            "not increasing",
        ),
        (
            lambda raw, p: _with(
                p, offsets=p["offsets"][:2] + [p["offsets"][2] + 1] + p["offsets"][3:]
            ),
            "not increasing",
        ),
        (
            lambda raw, p: _with(p, offsets=p["offsets"][:-1] + [p["offsets"][-1] + 512]),
            "not increasing",
        ),
        (
            lambda raw, p: _with(p, offsets=p["offsets"][:2] + [2**64 - 512] + p["offsets"][3:]),
            "not increasing",
        ),
        (lambda raw, p: _with(p, first=[0, 2, 2, 6, 8, 10]), "member numbers"),
        (lambda raw, p: _with(p, first=[1] + p["first"][1:]), "member numbers"),
        (lambda raw, p: _with(p, data_offsets=[0] + p["data_offsets"][1:]), "outside its sample"),
        (
            lambda raw, p: _with(p, sizes=p["sizes"][:1] + [10**6] + p["sizes"][2:]),
            "outside its sample",
        ),
        (
            lambda raw, p: _with(p, sizes=p["sizes"][:1] + [2**64 - 1] + p["sizes"][2:]),
            "outside its sample",
        ),
        (lambda raw, p: _with(p, names=p["names"][:-1] + ["a\0b"]), "names 11 members, not 10"),
    ],
)
def test_hostile_indexes_are_refused(change, says):
    tar, raw = _shard(SAMPLES)
    with pytest.raises(CorruptShardError, match=rf"^s\.tar\.idx: .*{says}.*re-pack"):
        parse_index(change(raw, _parts(raw, tar)), "s.tar.idx", 5, len(tar))


@pytest.mark.parametrize(
    "names, says",
    [
        (["0000.cls", "0001.jpg"], "do not form one sample"),
        (["0000.cls", "0000.cls"], "has a field twice"),
        (["0000.cls", "0000."], "do not form one sample"),
        (["0000.cls", "noext"], "do not form one sample"),
        (["d/.cls", "d/.jpg"], "do not form one sample"),
        (["0000.cls", "0000.c/ls"], "do not form one sample"),
        (["0000.cls", "0000.CLS"], "has a field twice"),
    ],
)
def test_index_members_must_form_samples(names, says):
    tar, raw = _shard(SAMPLES)
    p = _parts(raw, tar)
    index = parse_index(_with(p, names=names + p["names"][2:]), "s.tar.idx", 5, len(tar))
    with pytest.raises(CorruptShardError, match=says):
        index.samples("s.tar.idx")
    with pytest.raises(
        CorruptShardError, match=says
    ):  # a batch's samples together: the same checks
        _many(index.indexed("s.tar.idx"), [4, 0, 1])


def test_the_index_gives_the_samples_the_tar_headers_give():
    samples = [
        ("a/b.c/0001", [("cls", b"1"), ("json", b"{}" * 300), ("jpg", b"x" * 5000)]),
        ("x" * 150, [("txt", b"long name: a PAX header")]),
        *SAMPLES,
    ]
    tar, raw = _shard(samples)
    assert parse_index(raw, "s.tar", len(samples), len(tar)).samples("s.tar") == T.index_samples(
        tar, "s.tar"
    )


def test_the_sample_count_must_be_the_manifests():
    tar, raw = _shard(SAMPLES)
    with pytest.raises(
        CorruptShardError, match="indexes 5 samples, the manifest says the shard has 6"
    ):
        parse_index(raw, "s.tar.idx", 6, len(tar))


def test_a_compressed_shard_gets_an_index_of_its_tar_with_member_checksums():
    from shardstream.formats.checksums import checksum
    from shardstream.formats.compression import decompress

    sink = io.BytesIO()
    writer = T.TarShardWriter(sink, "zstd", index=True)
    for key, fields in SAMPLES:
        writer.add(key, fields)
    writer.close()
    tar = decompress(sink.getvalue(), "zstd", "s.tar.zst")
    index = parse_index(writer.index.to_bytes(), "s.tar.zst", 5, len(tar))
    assert index.compressed and not index.has_digests and index.samples("s") == T.index_samples(tar)
    assert index.checksums.tolist() == [checksum(d) for _, fields in SAMPLES for _, d in fields]
    with pytest.raises(ValueError, match="no per-sample digests"):
        index.check(0, tar, "s.tar.zst")


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


# -- version 2: samples that are no runs of members -------------------------------------------------------------


def _tarfile(members) -> bytes:
    """A tar of (name, data or ('link', target)) written by tarfile, in that order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, tuple):
                info.type, info.linkname = tarfile.LNKTYPE, data[1]
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


APART = [("a.jpg", b"A" * 700), ("b.jpg", b"B" * 30), ("a.cls", b"1"), ("b.cls", b"2")]
LINKED = [("a.jpg", b"A" * 700), ("a.cls", b"1"), ("b.jpg", ("link", "a.jpg")), ("b.cls", b"2")]


@pytest.mark.parametrize(
    ("members", "b_jpg"), [(APART, b"B" * 30), (LINKED, b"A" * 700)], ids=["apart", "hard link"]
)
def test_a_tar_of_no_runs_gets_a_version_2_index_that_reads_as_its_headers(members, b_jpg):
    from shardstream.formats.tar import build_index
    from shardstream.formats.tar_index import MAGIC_GROUPED

    tar = _tarfile(members)
    raw = build_index(tar, "s.tar")
    assert raw[:8] == MAGIC_GROUPED
    index = parse_index(raw, "s.tar", 2, len(tar))
    assert index.grouped and index.samples("s.tar") == T.index_samples(tar, "s.tar")
    keys, fields = index.samples("s.tar")
    view = memoryview(tar)
    got = {k: {e: bytes(view[o : o + n]) for e, (o, n) in f.items()} for k, f in zip(keys, fields)}
    assert got == {"a": {"jpg": b"A" * 700, "cls": b"1"}, "b": {"jpg": b_jpg, "cls": b"2"}}
    with pytest.raises(ValueError, match="no sample spans"):
        index.span(0)


def test_a_tar_in_order_still_gets_a_version_1_index():
    from shardstream.formats.tar import build_index

    tar = _tarfile([("a.jpg", b"A"), ("a.cls", b"1"), ("b.jpg", b"B")])
    assert build_index(tar, "s.tar")[:8] == MAGIC


def test_a_version_2_index_with_a_member_outside_the_tar_is_refused():
    from shardstream.formats.tar import build_index

    tar = _tarfile(APART)
    raw = bytearray(build_index(tar, "s.tar"))
    n, m, _ = struct.unpack_from("<QQQ", raw, 8)
    at = 32 + 8 * (n + 1) + 32 * n + 8 * (n + 1)  # the first member's data offset
    raw[at : at + 8] = struct.pack("<Q", len(tar))
    with pytest.raises(CorruptShardError, match="outside the tar's members"):
        parse_index(bytes(raw), "s.tar", 2, len(tar))
    raw = bytearray(build_index(tar, "s.tar"))
    raw[32 : 32 + 8] = struct.pack("<Q", 512)  # a sample offset: version 2 has none but the last
    with pytest.raises(CorruptShardError, match="end of members"):
        parse_index(bytes(raw), "s.tar", 2, len(tar))


def test_member_names_are_decoded_when_read_and_read_as_the_names_written():
    from shardstream.formats.tar_index import MemberNames

    samples = [
        ("caf\u00e9/0001", [("cls", b"1"), ("jpg", b"x")]),
        ("a.b/c", [("txt", b"t")]),
        *SAMPLES,
    ]
    tar, raw = _shard(samples)
    index = parse_index(raw, "s.tar", len(samples), len(tar))
    names = index.names
    assert isinstance(names, MemberNames)
    written = [f"{k}.{ext}" for k, fields in samples for ext, _ in fields]
    assert list(names) == written and len(names) == len(written)
    assert names[-1] == written[-1] and names[1:4] == written[1:4]
    assert names.run(0, 3) == written[:3]
    with pytest.raises(IndexError):
        names[len(written)]


def test_names_that_are_no_utf8_read_as_they_did():
    from shardstream.formats.tar_index import MemberNames

    text = b"\xe9t\xc3.jpg\0k.\xff\0"
    names = MemberNames(text, [i for i, b in enumerate(text) if b == 0])
    expected = [b.decode("utf-8", "surrogateescape") for b in text.split(b"\0")[:-1]]
    assert list(names) == expected and names.run(0, 2) == expected


def test_a_sample_of_the_index_is_its_key_and_fields_from_one_read():
    tar, raw = _shard(SAMPLES)
    index = parse_index(raw, "s.tar", 5, len(tar))
    keys, fields = index.samples("s.tar")
    read = index.indexed("s.tar")
    assert [read.sample(i) for i in range(len(read))] == list(zip(keys, fields))


def _many(read, rows):
    from shardstream.formats.index_batches import BatchEntries

    return BatchEntries(read).many(rows)


def _entries(gathered):
    """A batch's entries as :meth:`IndexedSamples.sample` gives each: (key, {field: (offset, size)})."""
    return [
        (key, {f: (numbers[2 + 3 * j], numbers[3 + 3 * j]) for j, f in enumerate(fields)})
        for key, fields, numbers in zip(gathered.keys, gathered.fields, gathered.numbers)
    ]


def _sums(gathered):
    return [numbers[4::3] for numbers in gathered.numbers]


def test_a_batch_of_samples_is_each_sample_read_alone():
    samples = [
        ("a/b.c/0001", [("cls", b"1"), ("json", b"{}" * 300), ("jpg", b"x" * 5000)]),
        ("x" * 150, [("txt", b"long name: a PAX header")]),
        *SAMPLES,
    ]
    tar, raw = _shard(samples)
    index = parse_index(raw, "s.tar", len(samples), len(tar))
    read = index.indexed("s.tar")
    rows = [3, 0, 6, 1, 3, 5]
    found = _many(read, rows)
    assert _entries(found) == [read.sample(i) for i in rows]
    first = index.first.tolist()
    sums = index.checksums.tolist()
    assert _sums(found) == [sums[first[i] : first[i + 1]] for i in rows]
    assert _many(read, []).keys == []


def test_a_batch_of_a_shard_of_like_samples_is_each_sample_read_alone():
    # every sample two members: one table for the shard, names compared with the first sample's
    samples = [
        *SAMPLES,
        ("a.b/0005", [("cls", b"5"), ("jpg", b"y" * 900)]),
        ("caf\u00e9/0006", [("cls", b"6"), ("jpg", b"z")]),
        ("0007", [("txt", b"other fields"), ("json", b"{}")]),
        ("0008", [("CLS", b"8"), ("Jpg", b"w")]),
        ("9", [("cls", b"9"), ("jpg", b"v")]),
    ]
    tar, raw = _shard(samples)
    index = parse_index(raw, "s.tar", len(samples), len(tar))
    read = index.indexed("s.tar")
    rows = [0, 8, 5, 6, 7, 0, 3, 9, 1]
    found = _many(read, rows)
    assert _entries(found) == [read.sample(i) for i in rows]
    sums = index.checksums.tolist()
    assert _sums(found) == [sums[2 * i : 2 * i + 2] for i in rows]
    assert found.keys[1] == "0008" and found.fields[1] == ["cls", "jpg"]


def _hand_made(*names):
    """The parsed index of samples of two members named ``names`` (pairs), each of one byte."""
    from shardstream.formats.tar_index import IndexBuilder

    builder = IndexBuilder()
    for pair in names:
        builder.add_hashed(bytes(32), [(n, 512, 1) for n in pair], [7, 8])
    raw = builder.to_bytes()
    return parse_index(raw, "s.tar", len(names), builder.offsets[-1] + 1024).indexed("s.tar")


def test_a_batch_reads_names_that_only_look_like_the_shards_first_as_each_sample_alone():
    read = _hand_made(("k.cls", "k.jpg"), ("x.y.cls", "x.y.jpg"), ("d/e.f/g.cls", "d/e.f/g.jpg"))
    rows = [0, 1, 2]
    assert _entries(_many(read, rows)) == [read.sample(i) for i in rows]
    assert _many(read, [1]).keys == ["x"] and _many(read, [1]).fields == [["y.cls", "y.jpg"]]


@pytest.mark.parametrize(
    "pair",
    [("k2.cls", "k3.jpg"), ("d/.cls", "d/.jpg"), ("k.cls", "k.cls"), ("kk.cls", "k.jpg")],
)
def test_a_batch_with_members_of_no_sample_says_so_as_one_sample_does(pair):
    read = _hand_made(("k.cls", "k.jpg"), pair)
    assert _many(read, [0]).keys == ["k"]
    with pytest.raises(CorruptShardError) as alone:
        read.sample(1)
    with pytest.raises(CorruptShardError) as batch:
        _many(read, [0, 1])
    assert str(batch.value) == str(alone.value) and "s.tar" in str(batch.value)
