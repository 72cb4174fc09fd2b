"""pack(split_by="cls"): one dataset per class with the tree's classes, a labels file written last."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from shardstream import pack
from shardstream.errors import DatasetExistsError, ManifestError, SourceError
from shardstream.formats import iter_shard_samples
from shardstream.manifest import open_dataset
from shardstream.manifest.labels import LABELS_NAME, read_labels
from shardstream.packing.split import folder_name
from tests.sample_datasets import make_files

COUNTS = {"ant": 2, "cat": 9, "zebra": 4}  # skewed on purpose


def image_tree(root):
    files = {
        f"{cls}/{i:02d}.jpg": f"{cls}{i}".encode() * 8
        for cls, n in COUNTS.items()
        for i in range(n)
    }
    return make_files(root, files)


def load_manifest(url):
    return open_dataset(str(url))[1]


def read_all(url):
    m = load_manifest(url)
    return [
        s for p in m.paths for s in iter_shard_samples(m.shard_format, Path(url, p).read_bytes(), p)
    ]


def test_one_dataset_per_class_keeping_the_global_class_values(tmp_path):
    src = image_tree(tmp_path / "src")
    result = pack(src, tmp_path / "out", split_by="cls", samples_per_shard=3, progress=False)
    store, index = read_labels(str(tmp_path / "out"))
    assert [(e.name, e.value, e.path, e.samples) for e in index.labels] == [
        ("ant", 0, "ant", 2),
        ("cat", 1, "cat", 9),
        ("zebra", 2, "zebra", 4),
    ]
    assert (
        result.samples == 15 and "3 datasets by cls (2 to 9 samples per label)" in result.summary()
    )
    for entry in index.labels:
        url = f"{store.url}/{entry.path}"
        assert load_manifest(url).classes == ["ant", "cat", "zebra"]
        samples = read_all(url)
        assert len(samples) == entry.samples
        assert {int(s["cls"]) for s in samples} == {entry.value}
        assert all(s["jpg"] == (src / f"{s['__key__']}.jpg").read_bytes() for s in samples)


def test_the_same_split_whatever_the_workers(tmp_path):
    src = image_tree(tmp_path / "src")
    pack(src, tmp_path / "one", split_by="cls", samples_per_shard=3, workers=1, progress=False)
    pack(src, tmp_path / "two", split_by="cls", samples_per_shard=3, workers=2, progress=False)
    for name in COUNTS:
        assert (
            load_manifest(tmp_path / "one" / name).sha256
            == load_manifest(tmp_path / "two" / name).sha256
        )


def test_an_existing_split_needs_overwrite(tmp_path):
    src = image_tree(tmp_path / "src")
    pack(src, tmp_path / "out", split_by="cls", progress=False)
    with pytest.raises(DatasetExistsError, match="already holds a split pack"):
        pack(src, tmp_path / "out", split_by="cls", progress=False)
    pack(src, tmp_path / "out", split_by="cls", progress=False, overwrite=True)


def test_only_image_folders_split(tmp_path):
    src = make_files(tmp_path / "flat", {"a.txt": b"1", "b.txt": b"2"})
    with pytest.raises(SourceError, match="no ImageFolder tree"):
        pack(src, tmp_path / "out", split_by="cls", progress=False)
    with pytest.raises(SourceError, match="cannot split by 'label'"):
        pack(image_tree(tmp_path / "src"), tmp_path / "out", split_by="label", progress=False)
    assert not (tmp_path / "out" / LABELS_NAME).exists()


def test_a_bad_label_index_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ManifestError, match="is no split pack"):
        read_labels(str(tmp_path))
    (tmp_path / LABELS_NAME).write_text(
        json.dumps(
            {
                "version": 1,
                "split_by": "cls",
                "labels": [{"name": "x", "value": 0, "path": "../../etc", "samples": 1}],
            }
        )
    )
    with pytest.raises(ManifestError, match=r"_labels.json is malformed .*not a sub-folder"):
        read_labels(str(tmp_path))


def test_folder_names_are_safe():
    assert (
        folder_name("cat", 0) == "cat"
        and folder_name("a/b", 1) == "a_b"
        and folder_name(".hidden", 2) == "label-2"
    )


def test_the_command_line_splits(tmp_path):
    src = image_tree(tmp_path / "src")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardstream",
            "pack",
            str(src),
            str(tmp_path / "out"),
            "--split-by",
            "cls",
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "3 datasets by cls" in done.stdout
    _, index = read_labels(str(tmp_path / "out"))
    assert Counter({e.name: e.samples for e in index.labels}) == Counter(COUNTS)
