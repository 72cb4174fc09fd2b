"""Resharding: WebDataset tars or a shardstream dataset into another shard size, format or compression."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import shardstream as ss
from shardstream.errors import SourceError
from tests.sample_datasets import shard_path, without_run


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' bytes by their names without the run's token."""
    return {without_run(p.name): p.read_bytes() for p in sorted(dest.glob("shard-*"))}


def samples(dest: Path, decode: str | None = None) -> list[dict]:
    return list(ss.ShardDataset(str(dest), shuffle=False, decode=decode))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A packed ImageFolder-like dataset of 3 classes, with a typed field from ShardWriter."""
    src = tmp_path / "src"
    for c in ("a", "b", "c"):
        (src / c).mkdir(parents=True)
        for i in range(7):
            (src / c / f"{i}.png").write_bytes(b"\x89PNG" + bytes([i]) * (i + 3))
    ss.pack(src, tmp_path / "packed", samples_per_shard=4, progress=False)
    return tmp_path / "packed"


@pytest.mark.parametrize(
    "options",
    [
        {"samples_per_shard": 5, "compression": "zstd"},
        {"shard_size": "300B", "compression": "gzip"},
        {"format": "arrow"},
    ],
)
def test_reshard_keeps_samples_order_and_classes(
    dataset: Path, tmp_path: Path, options: dict
) -> None:
    result = ss.pack(dataset, tmp_path / "out", progress=False, **options)
    assert result.manifest.created["layout"] == "shards"
    assert result.manifest.classes == ["a", "b", "c"]
    before, after = samples(dataset), samples(tmp_path / "out")
    assert [(s["__key__"], s["png"], int(s["cls"])) for s in after] == [
        (s["__key__"], s["png"], int(s["cls"])) for s in before
    ]  # in the source's order (no second shuffle)
    assert result.shards != 6


def test_arrow_dataset_back_to_tar(dataset: Path, tmp_path: Path) -> None:
    ss.pack(dataset, tmp_path / "arrow", format="arrow", progress=False)
    result = ss.pack(
        tmp_path / "arrow", tmp_path / "tar", format="tar", samples_per_shard=8, progress=False
    )
    assert result.manifest.classes == ["a", "b", "c"] and result.shards == 3
    assert [(s["__key__"], s["png"], int(s["cls"])) for s in samples(tmp_path / "tar")] == [
        (s["__key__"], s["png"], int(s["cls"])) for s in samples(dataset)
    ]


def test_typed_fields_stay_typed(tmp_path: Path) -> None:
    with ss.ShardWriter(str(tmp_path / "typed"), samples_per_shard=3) as w:
        for i in range(10):
            w.write(
                {
                    "__key__": f"k{i}",
                    "n": i,
                    "x": i / 3,
                    "ok": i % 2 == 0,
                    "name": f"s{i}",
                    "raw": b"\0" * i,
                }
            )
    ss.pack(tmp_path / "typed", tmp_path / "out", samples_per_shard=4, workers=2, progress=False)
    assert samples(tmp_path / "out", "numpy") == samples(tmp_path / "typed", "numpy")
    assert samples(tmp_path / "out", "numpy")[3] == {
        "__key__": "k3",
        "n": 3,
        "x": 1.0,
        "ok": False,
        "name": "s3",
        "raw": b"\0" * 3,
    }


def test_workers_give_identical_shards(dataset: Path, tmp_path: Path) -> None:
    ss.pack(dataset, tmp_path / "one", samples_per_shard=5, workers=1, progress=False)
    ss.pack(dataset, tmp_path / "two", samples_per_shard=5, workers=2, progress=False)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")


def make_tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> None:
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_webdataset_tars_without_manifest(tmp_path: Path) -> None:
    tars = tmp_path / "wds"
    tars.mkdir()
    make_tar(
        tars / "part-0.tar",
        [(f"s{i}.{ext}", f"{ext}{i}".encode()) for i in range(5) for ext in ("jpg", "txt")],
    )
    make_tar(tars / "part-1.tar.gz", [(f"t{i}.jpg", b"J" * i) for i in range(1, 4)], "w:gz")
    result = ss.pack(tars, tmp_path / "out", format="arrow", progress=False)
    assert result.samples == 8 and result.manifest.created["layout"] == "shards"
    rows = samples(tmp_path / "out")
    assert [r["__key__"] for r in rows] == [f"s{i}" for i in range(5)] + ["t1", "t2", "t3"]
    assert rows[2]["txt"] == b"txt2" and rows[7]["jpg"] == b"JJJ" and rows[7]["txt"] is None
    one = ss.pack(tars / "part-0.tar", tmp_path / "one", progress=False)
    assert one.samples == 5


def test_damaged_shard_is_named(dataset: Path, tmp_path: Path) -> None:
    shard = shard_path(dataset, 2)
    data = bytearray(shard.read_bytes())
    data[600] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(
        SourceError, match=rf"{shard.name} does not match the sha256 in its manifest"
    ) as info:
        ss.pack(dataset, tmp_path / "out", workers=2, progress=False)
    assert "\n" not in str(info.value) and not (tmp_path / "out" / "_manifest.json").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.tar").write_bytes(b"garbage" * 100)
    with pytest.raises(SourceError, match=r"x.tar"):
        ss.pack(tmp_path / "bad", tmp_path / "out2", progress=False)
