"""Loud layout detection (issue 11): a stray file in an ImageFolder tree is named, not silently
packed as plain files; the summary names the layout and the classes."""

from __future__ import annotations

import pytest

from shardstream import pack
from shardstream.errors import SourceError
from shardstream.sources import open_source
from tests.sample_datasets import make_files


def tree(root, extra: dict[str, bytes]):
    files = {f"{c}/{i}.jpg": b"x" for c in ("cat", "dog") for i in range(5)}
    return make_files(root, {**files, **extra})


@pytest.mark.parametrize("stray", ["README.txt", "cat/nested/1.jpg", "dog/notes.txt"])
def test_a_stray_file_in_an_image_folder_is_named(tmp_path, stray):
    src = tree(tmp_path / "src", {stray: b"hello"})
    with pytest.raises(
        SourceError, match=r"does not fit the ImageFolder layout.*--layout files"
    ) as info:
        open_source(str(src))
    assert stray in str(info.value) and "\n" not in str(info.value)
    assert open_source(str(src), "files").layout == "files"  # asked for explicitly: packed as files


def test_the_summary_names_the_layout_and_the_classes(tmp_path):
    result = pack(tree(tmp_path / "src", {}), tmp_path / "out", progress=False)
    assert result.summary().endswith("; layout imagefolder, 2 classes")
    files = make_files(tmp_path / "plain", {"a.txt": b"1", "b/c.json": b"{}", "b/d.txt": b"2"})
    assert pack(files, tmp_path / "out2", progress=False).summary().endswith("; layout files")
