"""Hugging Face datasets saved with save_to_disk: Arrow tables straight to Arrow shards."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import shardstream as ss
from shardstream.errors import SourceError
from tests.sample_datasets import without_run

datasets = pytest.importorskip("datasets")


def png(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (i, 2 * i, 0)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    rows = [
        {"image": {"bytes": png(i), "path": f"img{i}.png"}, "label": i % 3, "text": f"row {i}"}
        for i in range(23)
    ]
    ds = datasets.Dataset.from_list(rows).cast_column("image", datasets.Image())
    path = tmp_path_factory.mktemp("hf") / "train"
    ds.save_to_disk(str(path), num_shards=2)  # two Arrow files, read in order
    return path, rows


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' bytes by their names without the run's token."""
    return {without_run(p.name): p.read_bytes() for p in sorted(dest.glob("shard-*"))}


def test_arrow_shards_round_trip(saved, tmp_path: Path) -> None:
    path, rows = saved
    result = ss.pack(path, tmp_path / "out", shuffle=False, samples_per_shard=10, progress=False)
    assert result.manifest.shard_format == "arrow" and result.samples == 23 and result.shards == 3
    assert result.manifest.created["layout"] == "hf"
    got = list(ss.ShardDataset(str(tmp_path / "out"), shuffle=False, decode=None))
    assert [r["label"] for r in got] == [r["label"] for r in rows]
    assert [r["text"] for r in got] == [r["text"] for r in rows]
    assert [r["image"]["bytes"] for r in got] == [
        r["image"]["bytes"] for r in rows
    ]  # images kept as bytes
    import pyarrow as pa

    schema = pa.ipc.open_file(str(tmp_path / "out" / result.manifest.paths[0])).schema
    assert b"huggingface" in schema.metadata  # the features metadata travels along


def test_shuffled_and_workers_identical(saved, tmp_path: Path) -> None:
    path, rows = saved
    ss.pack(path, tmp_path / "one", workers=1, samples_per_shard=5, progress=False)
    ss.pack(path, tmp_path / "two", workers=2, samples_per_shard=5, progress=False)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")
    got = list(ss.ShardDataset(str(tmp_path / "two"), shuffle=False, decode=None))
    assert sorted(r["text"] for r in got) == sorted(r["text"] for r in rows)


def test_tar_shards_keep_images_as_files(saved, tmp_path: Path) -> None:
    path, rows = saved
    ss.pack(path, tmp_path / "tar", format="tar", shuffle=False, progress=False)
    got = list(ss.ShardDataset(str(tmp_path / "tar"), shuffle=False, decode=None))
    assert [g["image.png"] for g in got] == [r["image"]["bytes"] for r in rows]
    assert [int(g["label"]) for g in got] == [
        r["label"] for r in rows
    ]  # decode=None: bytes as stored


def test_dataset_dict_and_broken_state(saved, tmp_path: Path) -> None:
    path, _ = saved
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"x": [1, 2]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(
        SourceError, match=r"is a DatasetDict with splits train; pack one split, e.g. .*dd/train"
    ):
        ss.pack(tmp_path / "dd", tmp_path / "out", progress=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "dataset_info.json").write_text("{}")
    (broken / "state.json").write_text('{"_data_files": [{"filename": "gone.arrow"}]}')
    with pytest.raises(SourceError, match=r"state.json names the Arrow file 'gone.arrow'"):
        ss.pack(broken, tmp_path / "out", progress=False)
