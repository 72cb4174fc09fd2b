"""NumPy sources: .npy files and folders of them, read along axis 0, round-trip through ShardDataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardstream as ss
from shardstream.errors import SourceError
from shardstream.sources import numpy_arrays
from tests.sample_datasets import without_run


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' bytes by their names without the run's token."""
    return {without_run(p.name): p.read_bytes() for p in sorted(dest.glob("shard-*"))}


def read_back(dest: Path, decode: str | None = "numpy") -> dict[str, dict]:
    return {s["__key__"]: s for s in ss.ShardDataset(str(dest), shuffle=False, decode=decode)}


@pytest.fixture
def arrays(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    images = rng.integers(0, 255, (37, 5, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 37)
    src = tmp_path / "arrays"
    src.mkdir()
    np.save(src / "images.npy", images)
    np.save(src / "Labels.npy", labels)
    return src, images, labels


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_folder_round_trips(arrays, tmp_path: Path, fmt: str) -> None:
    src, images, labels = arrays
    result = ss.pack(src, tmp_path / "out", format=fmt, samples_per_shard=10, progress=False)
    assert result.samples == 37 and result.manifest.created["layout"] == "numpy"
    got = read_back(tmp_path / "out")
    assert sorted(got) == [f"{i:09d}" for i in range(37)]
    for i in range(37):
        sample = got[f"{i:09d}"]
        assert set(sample) == {"__key__", "images.npy", "labels"}
        np.testing.assert_array_equal(sample["images.npy"], images[i])
        assert sample["labels"] == labels[i] and isinstance(sample["labels"], int)


def test_workers_give_identical_shards(
    arrays, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(numpy_arrays, "MAX_CHUNK", 4)  # ten jobs, so two workers really share them
    src, _, _ = arrays
    one = ss.pack(src, tmp_path / "one", workers=1, samples_per_shard=8, progress=False)
    two = ss.pack(src, tmp_path / "two", workers=2, samples_per_shard=8, progress=False)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")
    assert one.fingerprint == two.fingerprint and one.shards == 5


def test_shuffle_keeps_keys_and_changes_order(arrays, tmp_path: Path) -> None:
    src, images, _ = arrays
    ss.pack(src, tmp_path / "plain", shuffle=False, progress=False)
    ss.pack(src, tmp_path / "mixed", seed=5, progress=False)
    plain = [
        s["__key__"] for s in ss.ShardDataset(str(tmp_path / "plain"), shuffle=False, decode=None)
    ]
    mixed = [
        s["__key__"] for s in ss.ShardDataset(str(tmp_path / "mixed"), shuffle=False, decode=None)
    ]
    assert plain == sorted(plain) and mixed != plain and sorted(mixed) == plain
    got = read_back(tmp_path / "mixed")
    np.testing.assert_array_equal(got["000000011"]["images.npy"], images[11])


def test_one_file_and_fields(arrays, tmp_path: Path) -> None:
    src, images, _ = arrays
    ss.pack(src / "images.npy", tmp_path / "single", progress=False)
    got = read_back(tmp_path / "single")
    np.testing.assert_array_equal(got["000000036"]["images.npy"], images[36])
    ss.pack(src, tmp_path / "picked", fields=["Labels"], progress=False)
    assert set(read_back(tmp_path / "picked")["000000000"]) == {"__key__", "labels"}


def test_unequal_lengths_name_the_files(arrays, tmp_path: Path) -> None:
    src, _, _ = arrays
    np.save(src / "short.npy", np.zeros(5))
    with pytest.raises(
        SourceError, match=r"different lengths along axis 0 \(.*short.npy: 5"
    ) as info:
        ss.pack(src, tmp_path / "out", progress=False)
    assert "\n" not in str(info.value) and not (tmp_path / "out" / "_manifest.json").exists()


def test_object_arrays_and_bad_files_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError, match=r"objects.npy holds Python objects"):
        ss.pack(tmp_path / "objects.npy", tmp_path / "out", progress=False)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(SourceError, match=r"cannot read .*junk.npy"):
        ss.pack(tmp_path / "junk.npy", tmp_path / "out", progress=False)
    with pytest.raises(SourceError, match="field_name do not apply"):
        ss.pack(tmp_path / "objects.npy", tmp_path / "out", field_name="x", progress=False)
