"""HDF5 sources: datasets along axis 0 become fields, read in workers that open the file themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardstream as ss
from shardstream.errors import SourceError
from shardstream.sources import numpy_arrays
from tests.sample_datasets import without_run

h5py = pytest.importorskip("h5py")

N = 29


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' and their sample indexes' bytes (``.shardstream/``) by their names without the run's token."""
    found = [*dest.glob("shard-*"), *dest.glob(".shardstream/shard-*")]
    return {without_run(p.relative_to(dest).as_posix()): p.read_bytes() for p in sorted(found)}


def read_back(dest: Path) -> dict[str, dict]:
    return {s["__key__"]: s for s in ss.ShardDataset(str(dest), shuffle=False, decode="numpy")}


@pytest.fixture
def h5file(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    rng = np.random.default_rng(7)
    data = {
        "images": rng.integers(0, 255, (N, 6, 5, 3), dtype=np.uint8),
        "meta/labels": np.arange(N) % 4,
        "score": rng.random(N).astype(np.float32),
        "names": [f"sample {i} é" for i in range(N)],
        "jpegs": [bytes([i]) * (i + 1) for i in range(N)],
    }
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["images"] = data["images"]
        f["meta/labels"] = data["meta/labels"]
        f["score"] = data["score"]
        f["names"] = np.array(data["names"], dtype=h5py.string_dtype())
        blobs = f.create_dataset("jpegs", (N,), dtype=h5py.vlen_dtype(np.uint8))
        for i, b in enumerate(data["jpegs"]):
            blobs[i] = np.frombuffer(b, np.uint8)
        f["version"] = 3  # one value: not a field
    return path, data


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_round_trip(h5file, tmp_path: Path, fmt: str) -> None:
    path, data = h5file
    result = ss.pack(path, tmp_path / "out", format=fmt, samples_per_shard=8, progress=False)
    assert result.samples == N and result.manifest.created["layout"] == "hdf5"
    got = read_back(tmp_path / "out")
    assert sorted(got) == [f"{i:09d}" for i in range(N)]
    for i in range(N):
        s = got[f"{i:09d}"]
        assert set(s) == {"__key__", "images.npy", "meta_labels", "score", "names", "jpegs"}
        np.testing.assert_array_equal(s["images.npy"], data["images"][i])
        assert s["meta_labels"] == data["meta/labels"][i]
        assert s["score"] == pytest.approx(float(data["score"][i]), rel=1e-7)
        assert s["names"] == data["names"][i] and s["jpegs"] == data["jpegs"][i]


def test_workers_give_identical_shards(
    h5file, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(numpy_arrays, "MAX_CHUNK", 3)  # ten jobs: each worker opens the file itself
    path, _ = h5file
    ss.pack(path, tmp_path / "one", workers=1, samples_per_shard=6, progress=False)
    ss.pack(path, tmp_path / "two", workers=2, samples_per_shard=6, progress=False)
    ss.pack(path, tmp_path / "again", workers=2, samples_per_shard=6, progress=False)
    assert (
        shard_bytes(tmp_path / "one")
        == shard_bytes(tmp_path / "two")
        == shard_bytes(tmp_path / "again")
    )
    assert len(shard_bytes(tmp_path / "one")) == 2 * 5  # shards and their sample indexes


def test_fields_pick_datasets(h5file, tmp_path: Path) -> None:
    path, data = h5file
    ss.pack(
        path, tmp_path / "out", fields=["images", "/meta/labels"], shuffle=False, progress=False
    )
    got = read_back(tmp_path / "out")
    assert set(got["000000004"]) == {"__key__", "images.npy", "meta_labels"}
    with pytest.raises(
        SourceError, match=r"data.h5: no dataset 'nope' \(datasets: images, jpegs, meta/labels"
    ):
        ss.pack(path, tmp_path / "bad", fields=["nope"], progress=False)


def test_unequal_lengths_name_file_and_datasets(tmp_path: Path) -> None:
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((10, 2))
        f["y"] = np.zeros(9)
    with pytest.raises(
        SourceError, match=r"odd.h5: datasets have different lengths along axis 0 \(x: 10, y: 9\)"
    ):
        ss.pack(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "_manifest.json").exists()


def test_unsupported_dtype_and_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "refs.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
        refs = f.create_dataset("refs", (3,), dtype=h5py.ref_dtype)
        refs[0] = f["x"].ref
        f.create_dataset("floats", (3,), dtype=h5py.vlen_dtype(np.float32))
    with pytest.raises(
        SourceError, match=r"refs.h5: dataset 'floats' has variable-length rows of float32"
    ):
        ss.pack(path, tmp_path / "out", progress=False)
    with pytest.raises(SourceError, match=r"refs.h5: dataset 'refs' holds HDF5 references"):
        ss.pack(path, tmp_path / "out", fields=["refs"], progress=False)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"this is not hdf5")
    with pytest.raises(SourceError, match=r"cannot read HDF5 file .*junk.h5: .*h5dump") as info:
        ss.pack(junk, tmp_path / "out", progress=False)
    assert "\n" not in str(info.value)


def test_file_is_not_pickled_to_workers(h5file, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    from shardstream.sources.hdf5 import open_hdf5_source

    path, _ = h5file
    reader, jobs = open_hdf5_source(str(path)).sample_jobs(0)
    assert len(pickle.dumps((reader, jobs[0]))) < 10_000  # a path and row numbers, no h5py object
    assert reader(jobs[0])[0]["__key__"] == f"{int(jobs[0][0]):09d}"


def test_command_line_fields(h5file, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardstream.cli import cli

    path, _ = h5file
    result = CliRunner().invoke(
        cli, ["pack", str(path), str(tmp_path / "out"), "--fields", "images, meta/labels", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "layout hdf5" in result.output
    assert set(read_back(tmp_path / "out")["000000000"]) == {"__key__", "images.npy", "meta_labels"}
    result = CliRunner().invoke(
        cli, ["pack", str(path), str(tmp_path / "bad"), "--field-name", "x", "-q"]
    )
    assert result.exit_code != 0 and "field_name do not apply to" in result.output
