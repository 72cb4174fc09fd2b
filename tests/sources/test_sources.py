"""open_source: what a folder or file is (layout detection), how files become samples, and its errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.feather as pfeather
import pyarrow.parquet as pq
import pytest

from shardstream.errors import SourceError
from shardstream.sources import FolderSource, TableSource, open_source
from tests.oslimits import permission_preexec
from tests.sample_datasets import make_files


def fields_of(src: FolderSource) -> dict[str, dict[str, tuple[str, int]]]:
    """{key: {field: (path, size)}} of a folder source."""
    return {s.key: {ext: (p, n) for ext, p, n in s.files} for s in src.samples}


def small_table(n: int = 5) -> pa.Table:
    return pa.table({"id": list(range(n)), "text": [f"row {i}" for i in range(n)]})


# -- layout detection ---------------------------------------------------------------------------------------


def test_an_explicit_imagefolder_refuses_a_sample_without_an_image(tmp_path):
    """--layout imagefolder with a stray text file among images: an error naming it, not a sample without
    an image (class folders holding only other files, such as texts, stay a valid ImageFolder: see below)."""
    root = make_files(
        tmp_path / "src", {"cat/1.jpg": b"c1", "cat/notes.txt": b"n", "dog/2.png": b"d2"}
    )
    with pytest.raises(
        SourceError,
        match=r"notes\.txt.*no image, video or audio file, unlike the other.*--layout files",
    ):
        open_source(str(root), layout="imagefolder")
    assert open_source(str(root), layout="files").layout == "files"


def test_imagefolder_tree_gives_classes_and_labels(tmp_path):
    root = make_files(
        tmp_path / "src",
        {
            "dog/b.JPG": b"d1",
            "cat/2.png": b"c2",
            "cat/1.jpeg": b"c1",
            "dog/a.webp": b"d2",
            ".DS_Store": b"x",
            "cat/.thumbs": b"y",
        },
    )
    src = open_source(str(root))
    assert isinstance(src, FolderSource)
    assert src.layout == "imagefolder"
    assert src.classes == ["cat", "dog"]
    assert [(s.key, s.label) for s in src.samples] == [
        ("cat/1", 0),
        ("cat/2", 0),
        ("dog/a", 1),
        ("dog/b", 1),
    ]
    assert fields_of(src)["dog/b"] == {
        "jpg": (str(root / "dog" / "b.JPG"), 2)
    }  # lower case, as webdataset
    assert src.skipped_hidden == 2


def test_imagefolder_classes_skip_hidden_class_folders(tmp_path):
    root = make_files(tmp_path / "src", {"a/1.png": b"1", "b/1.png": b"2", ".cache/1.png": b"3"})
    src = open_source(str(root))
    assert src.layout == "imagefolder"
    assert src.classes == ["a", "b"]
    assert [s.key for s in src.samples] == ["a/1", "b/1"]


@pytest.mark.parametrize(
    "extra",
    [
        {"cat/notes.txt": b"not an image"},  # a non-image file
        {"cat/sub/3.jpg": b"too deep"},  # two folders deep
        {"top.jpg": b"at the root"},  # not in a class folder
        {"cat/noext": b"no extension"},
    ],
)
def test_not_imagefolder_unless_every_file_is_an_image_one_folder_deep(tmp_path, extra):
    root = make_files(tmp_path / "src", {"cat/1.jpg": b"1", "dog/2.png": b"2", **extra})
    # an ImageFolder but for a stray file: named, never silently packed without classes (issue 11)
    with pytest.raises(SourceError, match="does not fit the ImageFolder layout"):
        open_source(str(root))
    src = open_source(str(root), "files")
    assert isinstance(src, FolderSource)
    assert src.layout == "files"
    assert src.classes is None
    assert all(s.label is None for s in src.samples)


def test_layout_files_forces_a_plain_tree(tmp_path):
    root = make_files(tmp_path / "src", {"cat/1.jpg": b"1", "dog/2.png": b"2"})
    src = open_source(str(root), layout="files")
    assert src.layout == "files"
    assert src.classes is None
    assert [s.label for s in src.samples] == [None, None]


def test_layout_imagefolder_rejects_a_file_outside_class_folders(tmp_path):
    root = make_files(tmp_path / "src", {"cat/1.jpg": b"1", "cat/deeper/2.jpg": b"2"})
    with pytest.raises(SourceError) as info:
        open_source(str(root), layout="imagefolder")
    assert os.path.join(str(root), "cat/deeper/2.jpg") in str(info.value)


def test_layout_imagefolder_accepts_non_image_files_in_class_folders(tmp_path):
    root = make_files(tmp_path / "src", {"a/1.txt": b"1", "b/2.json": b"{}"})
    src = open_source(str(root), layout="imagefolder")
    assert src.layout == "imagefolder"
    assert src.classes == ["a", "b"]
    assert [(s.key, s.label) for s in src.samples] == [("a/1", 0), ("b/2", 1)]


def test_layout_imagefolder_refuses_an_existing_cls_file(tmp_path):
    root = make_files(tmp_path / "src", {"a/1.jpg": b"1", "a/1.cls": b"7"})
    with pytest.raises(SourceError, match="cls"):
        open_source(str(root), layout="imagefolder")


def test_unknown_layout_is_refused(tmp_path):
    root = make_files(tmp_path / "src", {"a.txt": b"1"})
    with pytest.raises(SourceError, match="nonsense"):
        open_source(str(root), layout="nonsense")


@pytest.mark.parametrize(
    ("suffix", "fmt"),
    [
        (".parquet", "parquet"),
        (".csv", "csv"),
        (".jsonl", "json"),
        (".feather", "ipc"),
        (".arrow", "ipc"),
    ],
)
def test_folder_of_one_table_kind_is_a_table(tmp_path, suffix, fmt):
    root = tmp_path / "src"
    (root / "part").mkdir(parents=True)
    table = small_table()
    paths = [root / f"b{suffix}", root / f"a{suffix}", root / "part" / f"c{suffix}"]
    for path in paths:
        if fmt == "parquet":
            pq.write_table(table, path)
        elif fmt == "csv":
            pcsv.write_csv(table, path)
        elif fmt == "json":
            path.write_text("".join(f'{{"id": {i}, "text": "row {i}"}}\n' for i in range(5)))
        else:
            pfeather.write_feather(table, path)
    src = open_source(str(root))
    assert isinstance(src, TableSource)
    assert src.format == fmt
    assert src.files == [
        str(root / f"a{suffix}"),
        str(root / f"b{suffix}"),
        str(root / "part" / f"c{suffix}"),
    ]
    assert src.dataset().to_table().num_rows == 15


def test_single_table_file_is_a_table(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(small_table(), path)
    src = open_source(str(path))
    assert isinstance(src, TableSource)
    assert (src.format, src.files) == ("parquet", [str(path)])


def test_file_url_prefix_is_a_local_path(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(small_table(), path)
    src = open_source(f"file://{path}")
    assert isinstance(src, TableSource)
    assert src.files == [str(path)]


def test_table_folder_skips_hidden_files(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(small_table(), root / "a.parquet")
    (root / ".DS_Store").write_bytes(b"junk")
    src = open_source(str(root))
    assert isinstance(src, TableSource)
    assert src.files == [str(root / "a.parquet")]


def test_mixed_table_kinds_are_refused(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(small_table(), root / "a.parquet")
    pcsv.write_csv(small_table(), root / "b.csv")
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert str(root) in str(info.value)
    assert ".csv" in str(info.value) and ".parquet" in str(info.value)


def test_layout_table_refuses_a_folder_with_other_files(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(small_table(), root / "a.parquet")
    (root / "readme.txt").write_text("hello")
    with pytest.raises(SourceError) as info:
        open_source(str(root), layout="table")
    assert ".txt" in str(info.value)


def test_table_files_with_other_files_are_a_plain_tree(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(small_table(), root / "a.parquet")
    (root / "a.txt").write_text("caption")
    src = open_source(str(root))
    assert isinstance(src, FolderSource)
    assert src.layout == "files"
    assert sorted(fields_of(src)["a"]) == ["parquet", "txt"]


def test_layout_files_packs_table_files_as_bytes(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(small_table(), root / "a.parquet")
    src = open_source(str(root), layout="files")
    assert isinstance(src, FolderSource)
    assert list(fields_of(src)["a"]) == ["parquet"]


# -- grouping and order -------------------------------------------------------------------------------------


def test_files_group_by_path_without_extension(tmp_path):
    root = make_files(
        tmp_path / "src",
        {
            "a.jpg": b"jpg!",
            "a.json": b"{}",
            "a.seg.png": b"seg",
            "b.txt": b"bee",
            "sub/c.txt": b"sea",
            "sub/c.cls": b"3",
            "sub/deeper/c.txt": b"deep",
        },
    )
    src = open_source(str(root))
    assert src.layout == "files"
    got = fields_of(src)
    assert list(got) == ["a", "b", "sub/c", "sub/deeper/c"]
    assert got["a"] == {
        "jpg": (str(root / "a.jpg"), 4),
        "json": (str(root / "a.json"), 2),
        "seg.png": (str(root / "a.seg.png"), 3),
    }
    assert got["sub/c"] == {
        "cls": (str(root / "sub/c.cls"), 1),
        "txt": (str(root / "sub/c.txt"), 3),
    }
    # each sample's fields are sorted by name
    for s in src.samples:
        assert [ext for ext, _, _ in s.files] == sorted(ext for ext, _, _ in s.files)
    assert src.total_bytes == 4 + 2 + 3 + 3 + 3 + 1 + 4


def test_samples_are_sorted_by_key_whatever_the_creation_order(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    names = ["b.txt", "a10.txt", "a2.txt", "A.txt", "z/0.txt", "a 1.txt", "é.txt", "a.txt"]
    for name in names:  # creation order is not sorted
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    keys = [s.key for s in open_source(str(root)).samples]
    assert keys == sorted(n.rsplit(".", 1)[0] for n in names)
    assert keys == ["A", "a", "a 1", "a10", "a2", "b", "z/0", "é"]


def test_listing_is_deterministic(tmp_path):
    root = make_files(
        tmp_path / "src",
        {f"d{i % 3}/f{i}.{ext}": b"x" * i for i in range(12) for ext in ("a", "b")},
    )
    first = open_source(str(root))
    second = open_source(str(root))
    assert first.samples == second.samples
    assert len(first.samples) == 12


def test_unicode_and_spaces_in_names(tmp_path):
    root = make_files(
        tmp_path / "src", {"dossier été/ça va.txt": b"oui", "日本/データ 1.json": b"[]"}
    )
    got = fields_of(open_source(str(root)))
    assert got == {
        "dossier été/ça va": {"txt": (str(root / "dossier été/ça va.txt"), 3)},
        "日本/データ 1": {"json": (str(root / "日本/データ 1.json"), 2)},
    }


def test_zero_byte_files_are_samples(tmp_path):
    root = make_files(tmp_path / "src", {"empty.txt": b"", "full.txt": b"x"})
    got = fields_of(open_source(str(root)))
    assert got["empty"] == {"txt": (str(root / "empty.txt"), 0)}


def test_dots_in_folder_names_do_not_split_the_key(tmp_path):
    root = make_files(tmp_path / "src", {"v1.2/a.b.c": b"1"})
    assert fields_of(open_source(str(root))) == {"v1.2/a": {"b.c": (str(root / "v1.2/a.b.c"), 1)}}


def test_hidden_files_and_folders_are_skipped_and_counted(tmp_path):
    root = make_files(
        tmp_path / "src",
        {
            "a.txt": b"a",
            ".DS_Store": b"x",
            ".git/config": b"x",
            ".git/objects/1.txt": b"x",
            "sub/.hidden.txt": b"x",
            "sub/b.txt": b"b",
        },
    )
    src = open_source(str(root))
    assert [s.key for s in src.samples] == ["a", "sub/b"]
    assert src.skipped_hidden == 3  # .DS_Store, .git (not its content), sub/.hidden.txt
    assert all(not os.path.basename(p).startswith(".") for s in src.samples for _, p, _ in s.files)


def test_file_without_extension_is_field_bin(tmp_path):
    root = make_files(
        tmp_path / "src", {"README": b"read me", "sub/data": b"\x00\x01", "sub/data.txt": b"t"}
    )
    got = fields_of(open_source(str(root)))
    assert got["README"] == {"bin": (str(root / "README"), 7)}
    assert got["sub/data"] == {
        "bin": (str(root / "sub/data"), 2),
        "txt": (str(root / "sub/data.txt"), 1),
    }


def test_file_without_extension_clashes_with_key_dot_bin(tmp_path):
    root = make_files(tmp_path / "src", {"x": b"1", "x.bin": b"2"})
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    message = str(info.value)
    assert str(root / "x") in message
    assert str(root / "x.bin") in message
    assert "\n" not in message


def test_name_ending_with_a_dot_is_refused(tmp_path):
    root = make_files(tmp_path / "src", {"odd.": b"1", "fine.txt": b"2"})
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert str(root / "odd.") in str(info.value)


# -- symbolic links -----------------------------------------------------------------------------------------


def test_symlinked_file_is_followed(tmp_path):
    outside = make_files(tmp_path / "outside", {"real.txt": b"the real content"})
    root = make_files(tmp_path / "src", {"a.txt": b"a"})
    (root / "link.txt").symlink_to(outside / "real.txt")
    got = fields_of(open_source(str(root)))
    assert got["link"] == {"txt": (str(root / "link.txt"), len(b"the real content"))}


def test_symlinked_folder_is_followed(tmp_path):
    outside = make_files(tmp_path / "outside", {"x.txt": b"xx", "y.txt": b"y"})
    root = make_files(tmp_path / "src", {"a.txt": b"a"})
    (root / "linked").symlink_to(outside, target_is_directory=True)
    got = fields_of(open_source(str(root)))
    assert list(got) == ["a", "linked/x", "linked/y"]
    assert got["linked/x"]["txt"][1] == 2


def test_same_folder_linked_twice_is_not_a_loop(tmp_path):
    outside = make_files(tmp_path / "outside", {"x.txt": b"x"})
    root = make_files(tmp_path / "src", {})
    (root / "l1").symlink_to(outside, target_is_directory=True)
    (root / "l2").symlink_to(outside, target_is_directory=True)
    assert [s.key for s in open_source(str(root)).samples] == ["l1/x", "l2/x"]


def test_broken_symlink_is_named(tmp_path):
    root = make_files(tmp_path / "src", {"a.txt": b"a"})
    (root / "gone.txt").symlink_to(tmp_path / "does-not-exist.txt")
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert str(root / "gone.txt") in str(info.value)
    assert "symbolic link" in str(info.value)


def test_symlink_loop_to_an_ancestor_is_refused(tmp_path):
    root = make_files(tmp_path / "src", {"sub/a.txt": b"a"})
    (root / "sub" / "up").symlink_to(root, target_is_directory=True)
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert "loop" in str(info.value)
    assert str(root / "sub" / "up") in str(info.value)


def test_self_referencing_symlink_is_refused(tmp_path):
    root = make_files(tmp_path / "src", {"a.txt": b"a"})
    (root / "me").symlink_to(root / "me")
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert str(root / "me") in str(info.value)


def test_source_that_is_a_broken_symlink(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(SourceError) as info:
        open_source(str(link))
    assert str(link) in str(info.value)
    assert "broken symbolic link" in str(info.value)


# -- missing, empty, unsupported ----------------------------------------------------------------------------


def test_empty_folder_is_refused(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert str(root) in str(info.value)
    assert "empty" in str(info.value)


def test_folder_with_only_hidden_files_is_empty(tmp_path):
    root = make_files(tmp_path / "src", {".a": b"1", ".b/c.txt": b"2"})
    (root / "sub").mkdir()
    with pytest.raises(SourceError) as info:
        open_source(str(root))
    assert "empty" in str(info.value)
    assert "2 hidden" in str(info.value)


def test_missing_source_is_named(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(SourceError) as info:
        open_source(str(missing))
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


@pytest.mark.parametrize("name", ["sheet.xlsx", "notes.txt", "image.jpg", "noextension"])
def test_unsupported_single_file_is_named(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"content")
    with pytest.raises(SourceError) as info:
        open_source(str(path))
    assert str(path) in str(info.value)
    assert ".parquet" in str(info.value)  # says which files it can take


def test_table_file_with_a_folder_layout_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(small_table(), path)
    with pytest.raises(SourceError) as info:
        open_source(str(path), layout="files")
    assert str(path) in str(info.value)


def test_remote_source_is_refused():
    with pytest.raises(SourceError, match="s3://bucket/data"):
        open_source("s3://bucket/data")


def test_unreadable_folder_is_named(tmp_path):
    preexec = permission_preexec(tmp_path)
    root = make_files(tmp_path / "src", {"a.txt": b"a", "locked/b.txt": b"b"})
    (root / "locked").chmod(0)
    code = f"""
from shardstream.errors import SourceError
from shardstream.sources import open_source
try:
    open_source({str(root)!r})
except SourceError as exc:
    print("SourceError:", exc)
else:
    print("no error")
"""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            preexec_fn=preexec,
            timeout=60,
        )
    finally:
        (root / "locked").chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SourceError: "), proc.stdout
    assert str(root / "locked") in proc.stdout
    assert "permission denied" in proc.stdout


# -- the registry ------------------------------------------------------------------------------


def test_every_registered_kind_loads_its_lister():
    from shardstream.sources import REGISTRY

    for name, kind in REGISTRY.items():
        assert callable(kind.load(name)), name


def test_a_kind_whose_library_is_missing_names_the_install_command():
    from shardstream.sources import SourceKind

    kind = SourceKind(
        "shardstream.sources.folder:file_tree",
        ("no_such_library_here",),
        "pip install 'shardstream[x]'",
    )
    with pytest.raises(
        SourceError,
        match="hdf5 sources need the 'no_such_library_here' package; install it with: "
        "pip install 'shardstream\\[x\\]'",
    ):
        kind.load("hdf5")


def test_the_lister_is_imported_only_when_a_pack_uses_it():
    import subprocess
    import sys

    code = (
        "import sys, shardstream.sources as s; assert 'pyarrow' not in sys.modules, 'eager'; "
        "s.REGISTRY['table'].load('table'); assert 'pyarrow' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_field_names_are_lower_case_as_webdataset_names_them(tmp_path):
    import tarfile

    from shardstream import ShardDataset, pack

    root = make_files(
        tmp_path / "src",
        {"n01/IMG_1.JPEG": b"x", "n01/IMG_1.Seg.PNG": b"y", "n01/IMG_2.JPEG": b"z"},
    )
    src = open_source(str(root))
    assert fields_of(src)["n01/IMG_1"] == {
        "jpeg": (str(root / "n01" / "IMG_1.JPEG"), 1),
        "seg.png": (str(root / "n01" / "IMG_1.Seg.PNG"), 1),
    }
    result = pack(root, tmp_path / "ds", workers=1, shuffle=False, progress=False)
    with tarfile.open(tmp_path / "ds" / result.manifest.paths[0]) as tar:
        names = tar.getnames()
    assert names == [
        "n01/IMG_1.cls",
        "n01/IMG_1.jpeg",
        "n01/IMG_1.seg.png",
        "n01/IMG_2.cls",
        "n01/IMG_2.jpeg",
    ]
    (first, _) = ShardDataset(str(tmp_path / "ds"), decode=None, shuffle=False)
    assert first["jpeg"] == b"x" and first["__key__"] == "n01/IMG_1"
    clash = make_files(tmp_path / "clash", {"a.JPG": b"1", "a.jpg": b"2"})
    with pytest.raises(
        SourceError, match=r"both give field 'jpg' of sample 'a' \(field names are lower case"
    ):
        open_source(str(clash))
