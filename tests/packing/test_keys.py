"""Sample keys and field names stay inside the folder a shard is extracted to (issue 10, finding 5).

Every pack path forms tar member names ``KEY.EXT``: ShardWriter, folders and tables. A key that
``tar -xf`` or ``tarfile`` would turn into a path outside the target (a leading '/', a '..'
segment), that tar tools rewrite ('.', empty segments), that Windows tools split (a backslash) or
that acts on a terminal (control characters) is refused with one line naming the sample.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream import ShardWriter, pack
from shardstream.errors import EncodeError, SourceError
from shardstream.packing.fields import check_key, key_problem
from tests.sample_datasets import make_files

HOSTILE_KEYS = [
    "../../../tmp/x",
    "/etc/x",
    "a/../../b",
    "..",
    "a/..",
    "//x",
    "a//b",
    "./a",
    "a/./b",
    "dir/",
    "a\\..\\b",
    "C:\\x",
    "a\x1b]0;title\x07",
    "a\x1b[2Jb",
    "a\nb",
    "a\rb",
    "a\x7fb",
    "a\x85b",
    "a\x00b",
]
GOOD_KEYS = [
    "plain",
    "dir/sub/img_0001",
    "v1.2/train/img",
    "..hidden-ish/x",
    "a..b/c",
    "é ü/space key",
    "-dash/_x",
    "deep/" * 20 + "x",
]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "\r" not in text, text
    return text


@pytest.mark.parametrize("key", HOSTILE_KEYS)
@pytest.mark.parametrize("fmt", ["tar", "tar.zst"])
def test_shard_writer_refuses_keys_that_escape_or_are_rewritten(tmp_path, key, fmt):
    compression = "zstd" if fmt == "tar.zst" else None
    with ShardWriter(str(tmp_path / "ds"), compression=compression) as w:
        with pytest.raises(EncodeError) as info:
            w.write({"__key__": key, "txt": "x"})
        w.write({"__key__": "fine", "txt": "y"})
    text = one_line(info.value)
    assert repr(key) in text and "rename the key" in text


@pytest.mark.parametrize("field", ["t\\x", "t\x1bx", "t\nx", "a/b", ""])
def test_shard_writer_refuses_field_names_that_are_paths_or_control_characters(tmp_path, field):
    with (
        ShardWriter(str(tmp_path / "ds")) as w,
        pytest.raises(EncodeError, match="field name") as info,
    ):
        w.write({"__key__": "k", field: b"x"})
    one_line(info.value)


def test_arrow_keys_are_column_values_not_paths(tmp_path):
    """Arrow shards are never extracted to files: their keys stay any text (as before)."""
    with ShardWriter(str(tmp_path / "ds"), format="arrow") as w:
        w.write({"__key__": "../a.b", "txt": "x"})
    assert key_problem("../a.b", "arrow") is None and key_problem("../a.b", "tar") is not None


def test_table_to_tar_refuses_a_hostile_key_column_naming_table_and_row(tmp_path):
    table = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"__key__": ["ok0", "ok1", "../../../tmp/x"], "txt": ["a", "b", "c"]}), table
    )
    dest = tmp_path / "out"
    with pytest.raises(EncodeError) as info:
        pack(str(table), str(dest), format="tar", progress=False)
    text = one_line(info.value)
    assert "row 2" in text and str(tmp_path) in text and "'../../../tmp/x'" in text
    assert not (dest / "_manifest.json").exists()


@pytest.mark.parametrize(
    "name", ["back\\slash.txt", "new\nline.txt", "esc\x1b[2J.txt", "dot/x.a\\b"]
)
def test_folder_with_unextractable_file_names_is_refused_before_writing(tmp_path, name):
    src = make_files(tmp_path / "src", {"fine.txt": b"1", name: b"2"})
    dest = tmp_path / "out"
    with pytest.raises(SourceError) as info:
        pack(str(src), str(dest), progress=False)
    text = one_line(info.value)
    assert "rename the file" in text and repr(str(src / name)) in text
    assert not dest.exists()


def test_folder_to_arrow_keeps_names_that_tar_refuses(tmp_path):
    src = make_files(tmp_path / "src", {"back\\slash.txt": b"2"})
    result = pack(str(src), str(tmp_path / "out"), format="arrow", progress=False)
    assert result.samples == 1


def member_names(shard: Path) -> list[str]:
    with tarfile.open(shard) as tf:
        return tf.getnames()


def _members_inside(target: Path) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(target):
        for fn in files:
            path = Path(dirpath, fn).resolve()
            assert path.is_relative_to(target.resolve()), path
            out.append(path.relative_to(target.resolve()).as_posix())
    return sorted(out)


def test_packed_shards_extract_inside_the_target_with_tarfile_and_tar(tmp_path):
    """Every pack path's shards, extracted by ``tarfile`` (data filter) and ``tar -xf``: every
    member lands inside the target folder, under its own name, and nothing else is written."""
    src = make_files(
        tmp_path / "src",
        {
            "a/b/img001.jpg": b"j",
            "a/b/img001.seg.png": b"p",
            "é ü/x y.txt": b"t",
            "..dots/c.txt": b"c",
            "v1.2/d.bin": b"d",
        },
    )
    datasets = [pack(str(src), str(tmp_path / "folder"), progress=False).url]
    with ShardWriter(str(tmp_path / "writer"), samples_per_shard=3) as w:
        for i, key in enumerate(GOOD_KEYS):
            w.write({"__key__": key, "txt": f"{i}", "seg.png": b"p"})
            # a hostile key between good ones is refused, never written
            with pytest.raises(EncodeError):
                w.write({"__key__": HOSTILE_KEYS[i], "txt": "evil"})
    datasets.append(str(tmp_path / "writer"))
    table = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"__key__": GOOD_KEYS, "txt": [str(i) for i in range(len(GOOD_KEYS))]}), table
    )
    datasets.append(pack(str(table), str(tmp_path / "table"), format="tar", progress=False).url)

    has_tar = shutil.which("tar") is not None
    for ds in datasets:
        shards = sorted(Path(ds).glob("shard-*.tar"))
        names = sorted(m for s in shards for m in member_names(s))
        for how in ("tarfile", "tar") if has_tar else ("tarfile",):
            outer = tmp_path / f"extract-{how}-{Path(ds).name}"
            target = outer / "target"
            target.mkdir(parents=True)
            for shard in shards:
                if how == "tarfile":
                    with tarfile.open(shard) as tf:
                        tf.extractall(target, filter="data")
                else:
                    subprocess.run(
                        ["tar", "-xf", str(shard), "-C", str(target)], check=True, timeout=60
                    )
            assert os.listdir(outer) == ["target"]
            assert _members_inside(target) == names


KEY_ALPHABET = st.sampled_from(list("ab/.\\ é-_") + ["\x00", "\n", "\x1b", "\x7f", "\x85", ":"])


@settings(max_examples=400, deadline=None, derandomize=True)
@given(key=st.text(KEY_ALPHABET, min_size=0, max_size=12))
def test_every_accepted_key_is_a_clean_relative_path(key):
    """Fuzz: a key ``check_key`` accepts for tar names a member that tarfile's data filter accepts
    as it is, that normalises to itself, and that stays inside the target; anything else is an
    EncodeError with one line."""
    try:
        check_key(key, "tar")
    except EncodeError as exc:
        one_line(exc)
        return
    name = f"{key}.txt"
    assert posixpath.normpath(name) == name and not posixpath.isabs(name)
    target = "/extract/target"
    assert posixpath.normpath(posixpath.join(target, name)).startswith(target + "/")
    member = tarfile.TarInfo(name)
    filtered = tarfile.data_filter(member, target)
    assert filtered.name == name
    assert not any(ch in key for ch in "\\\x00\n\x1b\x7f\x85")
