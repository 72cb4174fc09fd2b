"""Tars that real tools write, indexed and read back: the samples equal the source files.

Each case writes a small folder of files (KEY.jpg, KEY.cls, KEY.json) with a real writer: GNU tar,
bsdtar (Debian's libarchive-tools; its cases skip when it is not installed), Python's tarfile and
webdataset's TarWriter. The tar is indexed (``index``) and read with ``ShardDataset``; the samples must
have the source's keys, fields and bytes, one sample per key. What no sample can hold (symbolic links,
odd extensions, ``__`` keys) is left out with one warning line per shard.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardstream import ShardDataset
from shardstream.cli import cli
from shardstream.errors import CorruptShardError
from shardstream.formats import tar as T
from shardstream.manifest.index_tars import index
from shardstream.manifest.side_names import index_name
from shardstream.manifest.verify import verify

BSDTAR = shutil.which("bsdtar")
needs_bsdtar = pytest.mark.skipif(
    BSDTAR is None, reason="bsdtar is not installed (apt-get install libarchive-tools)"
)
needs_gnu_tar = pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")


def _bytes(i: int, n: int) -> bytes:
    return bytes((j * 37 + i * 11) % 251 for j in range(n))


def source(root: Path, n: int = 5) -> list[str]:
    """Files ``data/sNNNN.{jpg,cls,json}`` under ``root``; their names, members apart (all the jpg
    first, then the cls, then the json): the order in which the tests write them."""
    (root / "data").mkdir(parents=True)
    names = []
    for ext in ("jpg", "cls", "json"):
        for i in range(n):
            name = f"data/s{i:04d}.{ext}"
            size = {"jpg": 700 + 97 * i, "cls": 1, "json": 30}[ext]
            (root / name).write_bytes(_bytes(i + len(ext), size))
            names.append(name)
    return names


def expected(root: Path, names: list[str]) -> dict[str, dict[str, bytes]]:
    """key -> {extension: bytes} of the files ``names`` under ``root``."""
    out: dict[str, dict[str, bytes]] = {}
    for name in names:
        key, ext = T.split_name(name)  # type: ignore[misc]
        out.setdefault(key, {})[ext] = (root / name).read_bytes()
    return out


def read(folder: Path) -> dict[str, dict[str, bytes]]:
    """key -> {field: bytes} of every sample ShardDataset reads, each key once."""
    samples = list(ShardDataset(str(folder), decode=None))
    keys = [s["__key__"] for s in samples]
    assert len(keys) == len(set(keys)), f"a key in two samples: {keys}"
    return {
        s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")} for s in samples
    }


def _list(root: Path, names: list[str]) -> None:
    (root / "list").write_bytes(b"".join(os.fsencode(n) + b"\n" for n in names))


def gnu_tar(root: Path, out: Path, names: list[str], *options: str) -> Path:
    """GNU tar of ``names`` (files under ``root``), in that order."""
    _list(root, names)
    subprocess.run(
        [
            "tar",
            "-cf",
            str(out),
            "-C",
            str(root),
            "--no-recursion",
            *options,
            "--verbatim-files-from",
            "-T",
            str(root / "list"),
        ],
        check=True,
    )
    return out


def bsd_tar(root: Path, out: Path, names: list[str], *options: str) -> Path:
    _list(root, names)
    subprocess.run(
        [BSDTAR, "-cf", str(out), "-C", str(root), "-n", *options, "-T", str(root / "list")],
        check=True,
    )
    return out


def py_tar(root: Path, out: Path, names: list[str], fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(out, "w", format=fmt) as tf:
        for name in names:
            tf.add(root / name, arcname=name, recursive=False)
    return out


WRITERS = {
    "gnu tar": pytest.param(gnu_tar, marks=needs_gnu_tar),
    "gnu tar, posix format": pytest.param(
        lambda r, o, n: gnu_tar(r, o, n, "--format=posix"), marks=needs_gnu_tar
    ),
    "bsdtar": pytest.param(bsd_tar, marks=needs_bsdtar),
    "tarfile": pytest.param(py_tar),
}


def indexed(tmp_path: Path, write, names: list[str], tar_name: str = "a.tar"):
    """``names`` written by ``write`` into shards/``tar_name``, indexed: (index result, folder)."""
    folder = tmp_path / "shards"
    folder.mkdir(exist_ok=True)
    write(tmp_path / "src", folder / tar_name, names)
    return index([str(folder)]), folder


# -- 1. members of a sample apart ----------------------------------------------------------------------------


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS.keys())
def test_members_apart_make_one_sample_per_key(tmp_path, write):
    names = source(tmp_path / "src")
    result, folder = indexed(tmp_path, write, names)
    assert read(folder) == expected(tmp_path / "src", names)
    assert list(result.manifest.stored_counts) == [5]
    # its sample index has no sample spans (version 2's layout, in version 3 with member checksums)
    raw = (folder / index_name("a.tar")).read_bytes()
    assert raw[:8] == b"SSTARIX3" and raw[32] & 1  # the GROUPED flag
    assert verify(str(folder), workers=1).ok
    (note,) = [n for n in result.notes if "not next to each other" in n]
    assert "a.tar" in note and "5 samples" in note and "tar --sort=name" in note


@needs_gnu_tar
def test_a_folder_tarred_in_directory_order_reads_whole(tmp_path):
    names = source(tmp_path / "src", n=8)
    folder = tmp_path / "shards"
    folder.mkdir()
    subprocess.run(["tar", "-cf", str(folder / "a.tar"), "data"], cwd=tmp_path / "src", check=True)
    index([str(folder)])
    assert read(folder) == expected(tmp_path / "src", names)


def test_a_key_in_two_shards_is_two_samples_with_a_warning(tmp_path):
    names = source(tmp_path / "src", n=2)
    folder = tmp_path / "shards"
    folder.mkdir()
    py_tar(tmp_path / "src", folder / "a.tar", [n for n in names if not n.endswith(".json")])
    py_tar(tmp_path / "src", folder / "b.tar", [n for n in names if n.endswith(".json")])
    result = index([str(folder)])
    assert list(result.manifest.stored_counts) == [2, 2]
    (note,) = [n for n in result.notes if "two shards" in n]
    assert "b.tar" in note and "a.tar" in note


# -- 2. hard links, symbolic links ---------------------------------------------------------------------------


def linked_source(root: Path) -> tuple[list[str], list[str]]:
    """A source whose s0001.jpg is a hard link to s0000.jpg, s0002.txt a symbolic link: (names in tar
    order, names whose bytes a sample holds)."""
    names = source(root, n=3)
    (root / "data/s0001.jpg").unlink()
    os.link(root / "data/s0000.jpg", root / "data/s0001.jpg")
    os.symlink("s0000.cls", root / "data/s0002.txt")
    return [*names, "data/s0002.txt"], names


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS.keys())
def test_hard_links_read_as_their_target_and_symbolic_links_are_left_out(tmp_path, write):
    names, kept = linked_source(tmp_path / "src")
    result, folder = indexed(tmp_path, write, names)
    with tarfile.open(folder / "a.tar") as tf:
        assert [m.name for m in tf if m.islnk()] == ["data/s0001.jpg"]  # the writer made a link
    samples = read(folder)
    assert samples == expected(tmp_path / "src", kept)
    assert samples["data/s0001"]["jpg"] == samples["data/s0000"]["jpg"]
    (note,) = [n for n in result.notes if "symbolic links" in n]
    assert "1 member ('data/s0002.txt') left out" in note


def test_a_hard_link_to_no_member_of_the_tar_is_left_out(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, link in (("k.txt", None), ("k.jpg", "elsewhere/x.jpg"), ("j.txt", "k.txt")):
            info = tarfile.TarInfo(name)
            if link is None:
                info.size = 3
                tf.addfile(info, io.BytesIO(b"abc"))
            else:
                info.type, info.linkname = tarfile.LNKTYPE, link
                tf.addfile(info)
    found = T.read_samples(buf.getvalue(), "s.tar")
    assert found.keys == ["k", "j"] and found.links == ["k.jpg"]
    view = memoryview(buf.getvalue())
    offset, size = found.fields[1]["txt"]
    assert bytes(view[offset : offset + size]) == b"abc"


# -- 3, 4. compression from the bytes, xz and bzip2, mixed folders --------------------------------------------


@pytest.mark.parametrize(
    ("options", "name", "truth"),
    [
        (["-z"], "a.tar", "tar.gz"),  # tar czf a.tar
        (["--zstd"], "a.tar", "tar.zst"),
        ([], "a.tar.gz", "tar"),  # a download a client decompressed
        (["-J"], "a.tar.xz", "tar.xz"),
        (["-j"], "a.tar.bz2", "tar.bz2"),
        (["-J"], "a.tgz", "tar.xz"),
    ],
)
@needs_gnu_tar
def test_compression_is_read_from_the_bytes(tmp_path, options, name, truth):
    if "--zstd" in options and shutil.which("zstd") is None:
        pytest.skip("zstd is not installed")
    names = source(tmp_path / "src")
    result, folder = indexed(
        tmp_path, lambda r, o, n: gnu_tar(r, o, sorted(n), *options), names, name
    )
    assert result.manifest.shard_format == truth
    assert read(folder) == expected(tmp_path / "src", names)
    misleading = [n for n in result.notes if "the name says" in n]
    assert len(misleading) == (0 if name.endswith(truth[3:] or ".tar") else 1)


def test_webdataset_gzip_tar_writer_named_tar(tmp_path):
    wds = pytest.importorskip("webdataset")
    folder = tmp_path / "shards"
    folder.mkdir()
    with wds.TarWriter(str(folder / "a.tar"), compress=True) as sink:
        for i in range(4):
            sink.write({"__key__": f"k{i}", "bin": _bytes(i, 300), "cls": b"%d" % i})
    assert (folder / "a.tar").read_bytes()[:2] == b"\x1f\x8b"
    result = index([str(folder)])
    assert result.manifest.shard_format == "tar.gz"
    assert read(folder) == {f"k{i}": {"bin": _bytes(i, 300), "cls": b"%d" % i} for i in range(4)}


@needs_gnu_tar
def test_a_folder_mixing_compressions(tmp_path):
    names = source(tmp_path / "src", n=8)
    folder = tmp_path / "shards"
    folder.mkdir()
    parts = [names[i::4] for i in range(4)]
    for part, (options, name) in zip(
        parts, [([], "a.tar"), (["-z"], "b.tar.gz"), (["-J"], "c.tar.xz"), (["-j"], "d.tar.bz2")]
    ):
        gnu_tar(tmp_path / "src", folder / name, sorted(part), *options)
    result = index([str(folder)])
    assert result.manifest.shard_format == "tar"
    assert result.manifest.created["compressions"] == "bzip2 1, gzip 1, none 1, xz 1"
    assert sorted(result.manifest.paths) == ["a.tar", "b.tar.gz", "c.tar.xz", "d.tar.bz2"]


@pytest.mark.parametrize("damage", ["cut", "junk after"])
@pytest.mark.parametrize("compress", ["xz", "bzip2"])
def test_damaged_xz_and_bzip2_are_refused(compress, damage):
    import bz2
    import lzma

    from shardstream.formats.compression import decompress

    plain = T.END_OF_ARCHIVE
    packed = (lzma.compress if compress == "xz" else bz2.compress)(plain)
    packed = packed[:-5] if damage == "cut" else packed + b"junk"
    with pytest.raises(CorruptShardError, match="s.tar: cannot decompress"):
        decompress(packed, None, "s.tar")


# -- 5. sparse members ---------------------------------------------------------------------------------------


def sparse_source(root: Path) -> list[str]:
    """A file with holes (data, 64 KiB of hole, data, a hole at the end) among ordinary ones."""
    names = source(root, n=2)
    with open(root / "data/s0000.img", "wb") as f:
        f.write(_bytes(1, 5000))
        f.seek(70_000)
        f.write(_bytes(2, 3000))
        f.truncate(150_000)
    return [*names, "data/s0000.img"]


SPARSE_WRITERS = {
    "gnu tar, old GNU": ("gnu", ["--sparse", "--format=gnu"]),
    "gnu tar, PAX 0.0": ("gnu", ["--sparse", "--format=posix", "--sparse-version=0.0"]),
    "gnu tar, PAX 0.1": ("gnu", ["--sparse", "--format=posix", "--sparse-version=0.1"]),
    "gnu tar, PAX 1.0": ("gnu", ["--sparse", "--format=posix", "--sparse-version=1.0"]),
    "bsdtar": ("bsd", ["--format=pax"]),
}


@pytest.mark.parametrize(("tool", "options"), SPARSE_WRITERS.values(), ids=SPARSE_WRITERS.keys())
def test_sparse_members_read_with_their_holes_as_zeros(tmp_path, tool, options):
    if tool == "bsd" and BSDTAR is None:
        pytest.skip("bsdtar is not installed (apt-get install libarchive-tools)")
    names = sparse_source(tmp_path / "src")
    write = gnu_tar if tool == "gnu" else bsd_tar
    result, folder = indexed(tmp_path, lambda r, o, n: write(r, o, n, *options), names)
    with tarfile.open(folder / "a.tar") as tf:
        sparse = [m.name for m in tf if m.issparse()]
    if not sparse:
        pytest.skip(f"{tool} stored no sparse member here (the file system reports no holes)")
    samples = read(folder)
    assert samples == expected(tmp_path / "src", names)
    assert samples["data/s0000"]["img"][5000:70_000] == bytes(65_000)


def _sparse_tar(tmp_path: Path) -> bytes:
    names = sparse_source(tmp_path / "src")
    out = gnu_tar(
        tmp_path / "src",
        tmp_path / "a.tar",
        names,
        "--sparse",
        "--format=posix",
        "--sparse-version=0.1",
    )
    return out.read_bytes()


@needs_gnu_tar
@pytest.mark.parametrize(
    ("old", "new", "says"),
    [  # same lengths: the PAX records still frame
        (b"=0,8192,69632,", b"=0,8192,00512,", "overlaps"),
        (b"GNU.sparse.size=150000", b"GNU.sparse.size=000100", "ends past"),
        (b"=0,8192,69632,", b"=0,8193,69632,", "bytes for"),
        (b"=0,8192,69632,", b"=0,81x2,69632,", "not a number"),
    ],
)
def test_malformed_sparse_maps_are_refused(tmp_path, old, new, says):
    data = _sparse_tar(tmp_path)
    if old not in data:
        pytest.skip("GNU tar wrote another map than expected")
    at = data.index(old)
    header = data.rfind(b"ustar", 0, at) - 257
    damaged = bytearray(data.replace(old, new))
    block = bytearray(damaged[header : header + 512])
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    damaged[header : header + 512] = block
    with pytest.raises(CorruptShardError, match=f"s.tar: .*({says})"):
        T.read_samples(bytes(damaged), "s.tar")


def _sparse_member(name: str, real: int) -> bytes:
    """A PAX 0.1 sparse member ``name`` of ``real`` bytes whose 3 stored bytes come first."""
    from shardstream.formats.tar_writer import _pax_record

    records = _pax_record("GNU.sparse.size", b"%d" % real) + _pax_record("GNU.sparse.map", b"0,3")
    pax = bytearray(T.member_header("pax", len(records)))
    pax[156:157] = b"x"
    pax[148:156] = b" " * 8
    pax[148:156] = b"%06o\0 " % sum(pax)
    return (
        bytes(pax) + records.ljust(512, b"\0") + T.member_header(name, 3) + b"abc".ljust(512, b"\0")
    )


@pytest.mark.parametrize(
    "members",
    [[("k.bin", 1 << 40)], [("k.bin", 3 << 30), ("j.bin", 3 << 30)]],
    ids=["one of 1 TiB", "two of 3 GiB"],
)
def test_huge_sparse_sizes_are_refused_before_any_is_expanded(members):
    shard = b"".join(_sparse_member(n, real) for n, real in members) + T.END_OF_ARCHIVE
    with pytest.raises(CorruptShardError, match="s.tar: .*more than"):
        T.read_samples(shard, "s.tar")


def test_a_small_sparse_member_reads_with_its_hole():
    shard = _sparse_member("k.bin", 1000) + T.END_OF_ARCHIVE
    found = T.read_samples(shard, "s.tar")
    offset, size = found.fields[0]["bin"]
    assert bytes(memoryview(found.data)[offset : offset + size]) == b"abc" + bytes(997)
    with pytest.raises(CorruptShardError, match="sparse"):
        T.index_samples(shard, "s.tar")  # offsets in the tar itself cannot place it


# -- 6. GNU headers with access and change times -------------------------------------------------------------


@needs_gnu_tar
def test_gnu_incremental_headers_carry_times_not_a_prefix(tmp_path):
    names = source(tmp_path / "src", n=3)
    folder = tmp_path / "shards"
    folder.mkdir()
    subprocess.run(
        [
            "tar",
            "-g",
            str(tmp_path / "snapshot"),
            "--format=gnu",
            "-cf",
            str(folder / "a.tar"),
            "data",
        ],
        cwd=tmp_path / "src",
        check=True,
    )
    data = (folder / "a.tar").read_bytes()
    assert any(data[i + 345 : i + 357].strip(b"\0") for i in range(0, 4096, 512))  # times there
    index([str(folder)])
    assert read(folder) == expected(tmp_path / "src", names)


# -- 7, 8, 9. odd names, '__' keys, AppleDouble files ----------------------------------------------------------


def invoke(*args: object):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


@needs_gnu_tar
def test_odd_names_and_metadata_are_left_out_with_one_warning_each(tmp_path):
    root = tmp_path / "src"
    names = source(root, n=3)
    odd = [b"data/s0000.a\\b", b"data/s0001.\xff", b"data/s0002.x\x1by"]
    for raw in odd:
        with open(os.fsencode(root) + b"/" + raw, "wb") as f:
            f.write(b"odd")
    (root / "__meta__").mkdir()
    (root / "__meta__/info.json").write_text("{}")
    (root / "data/._s0000.jpg").write_bytes(b"apple double")
    listed = [*names, *(os.fsdecode(n) for n in odd), "__meta__/info.json", "data/._s0000.jpg"]
    folder = tmp_path / "shards"
    folder.mkdir()
    gnu_tar(root, folder / "a.tar", listed)
    result = invoke("index", folder, "-q")
    assert result.exit_code == 0, result.output
    warnings = result.stderr.strip().splitlines()
    assert all(w.startswith("warning: ") for w in warnings)
    (odd_line,) = [w for w in warnings if "extension" in w]
    assert r"'data/s0000.a\\b'" in odd_line and r"\udcff" in odd_line and r"\x1b" in odd_line
    assert "\x1b" not in result.stderr
    (meta,) = [w for w in warnings if "'__'" in w]
    assert "'__meta__/info.json'" in meta
    (apple,) = [w for w in warnings if "KEY.EXT" in w]
    assert "._s0000.jpg" in apple and "webdataset" not in apple
    assert read(folder) == expected(root, names)
    info = invoke("info", folder)
    assert info.exit_code == 0 and "__meta__/info.json" in info.stdout


def test_reserved_keys_are_not_samples():
    from tests.cli.hostile import tar_bytes

    found = T.read_samples(
        tar_bytes([("__meta__/x.json", b"{}"), ("__k.txt", b"1"), ("k.txt", b"2")])
    )
    assert found.keys == ["k"] and found.reserved == ["__meta__/x.json", "__k.txt"]


def test_gzip_named_tar_reads_in_memory_too():
    from tests.cli.hostile import tar_bytes

    plain = tar_bytes([("k.txt", b"1")])
    assert T.read_samples(plain).keys == ["k"]
    from shardstream.formats import iter_shard_samples

    assert [s["txt"] for s in iter_shard_samples("tar", gzip.compress(plain))] == [b"1"]


# -- damage to the tars above: a named error, or what tarfile reads ---------------------------------------------


def _members_read(buf: bytes):
    """name -> bytes of every member that holds a file (links resolved, sparse expanded), or None after a
    CorruptShardError naming the shard."""
    from shardstream.formats import tar_headers as H

    try:
        members, out = T._resolve(H.listing(buf, "fuzz.tar"), buf, "fuzz.tar")
    except CorruptShardError as exc:
        assert "fuzz.tar" in str(exc) and "\n" not in str(exc)
        return None
    view = memoryview(out.data)
    return {name: bytes(view[o : o + n]) for name, o, n in members}


def _tarfile_read(buf: bytes):
    try:
        with tarfile.open(fileobj=io.BytesIO(buf), mode="r:") as tf:
            return {
                m.name: tf.extractfile(m).read()  # type: ignore[union-attr]
                for m in tf
                if m.isreg() or m.islnk()
            }
    except Exception:  # tarfile's own errors and worse: nothing to compare with
        return None


@needs_gnu_tar
def test_damaged_sparse_and_linked_tars_give_a_named_error_or_what_tarfile_reads(tmp_path):
    import random

    from tests.formats.test_fuzz import watchdog

    names = sparse_source(tmp_path / "src")
    os.link(tmp_path / "src/data/s0000.jpg", tmp_path / "src/data/s0009.jpg")
    tars = [
        gnu_tar(
            tmp_path / "src", tmp_path / f"{i}.tar", [*names, "data/s0009.jpg"], *options
        ).read_bytes()
        for i, options in enumerate(
            [["--sparse", "--format=posix"], ["--sparse", "--format=posix", "--sparse-version=0.0"]]
        )
    ]
    rng = random.Random("shardstream-real-tars")
    compared = 0
    for case in range(120):
        buf = bytearray(tars[case % 2])
        headers = [i for i in range(0, len(buf) - 512, 512) if buf[i + 257 : i + 262] == b"ustar"]
        at = rng.choice(headers) + rng.randrange(512) if case % 3 else rng.randrange(len(buf))
        buf[at] = rng.randrange(256) if case % 5 else ord(rng.choice("0123456789,"))
        if case % 3:  # mostly with a right checksum: the parser must not trust it
            head = at - at % 512
            buf[head + 148 : head + 156] = b" " * 8
            buf[head + 148 : head + 156] = b"%06o\0 " % sum(buf[head : head + 512])
        with watchdog():
            ours = _members_read(bytes(buf))
        if ours is not None and (theirs := _tarfile_read(bytes(buf))) is not None:
            assert ours == theirs, f"case {case}: byte {at}"
            compared += 1
    assert compared > 20  # much damage reads on (a name byte, a time) or is refused
