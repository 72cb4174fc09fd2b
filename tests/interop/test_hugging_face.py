"""Hugging Face ``datasets`` (``load_dataset`` by folder and by ``data_files``, streaming and not) reads
exactly the samples of tar packs, of Arrow packs (images decoded as ``Image``, labels as ``ClassLabel``
with the pack's classes, as shardstream decodes them) and of a Hub-like Parquet folder indexed in place;
shardstream still reads each after. No network: every path is local, the hub is off."""

from __future__ import annotations

import numpy as np
import pytest

import shardstream as ss
from tests.interop.clients import CLASSES, check_ours, check_samples, shards_of
from tests.interop.conftest import PARQUET_FIELDS, write_hub_folder

datasets = pytest.importorskip("datasets", reason="datasets is not installed (the test extras)")


@pytest.fixture
def load(tmp_path, monkeypatch):
    """``datasets.load_dataset`` offline, with a cache of this test's own; split ``train``."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    datasets.disable_progress_bars()

    def load_dataset(*args, **kwargs):
        return datasets.load_dataset(*args, split="train", cache_dir=str(tmp_path / "hf"), **kwargs)

    return load_dataset


def undecoded(ds, *columns):
    """The dataset with its Image columns as ``{"bytes", "path"}`` (the stored bytes)."""
    for column in columns:
        ds = ds.cast_column(column, datasets.Image(decode=False))
    return ds


# -- tar packs: the webdataset builder -----------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["loaded", "streamed"])
@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_tar_shards_by_data_files(pack, streaming, images, load, request):
    folder = request.getfixturevalue(pack)
    ds = load("webdataset", data_files={"train": shards_of(folder)}, streaming=streaming)
    check_samples(undecoded(ds, "jpg"), images[1])
    check_ours(folder, images[1])


@pytest.mark.parametrize("streaming", [False, True], ids=["loaded", "streamed"])
def test_a_folder_of_tar_shards(tar_shards, streaming, images, load):
    ds = load(str(tar_shards), streaming=streaming)
    assert isinstance(ds.features["jpg"], datasets.Image)
    check_samples(undecoded(ds, "jpg"), images[1])
    check_ours(tar_shards, images[1])


@pytest.mark.xfail(
    strict=True,
    reason="datasets picks a folder's builder by its most common file extension, a tie going to .json "
    "over .tar: one tar shard beside _manifest.json loads as the JSON of the manifest (pass "
    "data_files=, or pack 2 shards or more)",
)
def test_a_folder_of_one_tar_shard(tar_pack, images, load):
    check_samples(undecoded(load(str(tar_pack)), "jpg"), images[1])


def test_a_zstd_pack_is_not_for_the_webdataset_builder_as_the_guide_says(tar_zst, load):
    with pytest.raises(Exception):  # noqa: B017 - tarfile's ReadError, wrapped by datasets or not
        load("webdataset", data_files={"train": shards_of(tar_zst)})


# -- Arrow packs: the arrow builder, with the features the shards carry --------------------------------


def check_decoded(ds, folder, truth):
    """Images decoded to PIL as shardstream's decode="pil" does, labels to ClassLabel ids of the classes."""
    assert isinstance(ds.features["jpg"], datasets.Image)
    assert ds.features["cls"] == datasets.ClassLabel(names=CLASSES)
    ours = ss.ShardMap(str(folder), decode="pil")
    by_key = {ours[i]["__key__"]: ours[i] for i in range(len(ours))}
    seen = 0
    for row in ds:
        mine = by_key[row["__key__"]]
        assert row["cls"] == mine["cls"] == truth[row["__key__"]]["cls"]
        assert row["jpg"].size == mine["jpg"].size
        assert np.array_equal(np.asarray(row["jpg"].convert("RGB")), np.asarray(mine["jpg"]))
        seen += 1
    assert seen == len(truth)


@pytest.mark.parametrize("streaming", [False, True], ids=["loaded", "streamed"])
@pytest.mark.parametrize("pack", ["arrow_pack", "arrow_shards"])
def test_arrow_shards_by_data_files_decode_as_shardstream_does(
    pack, streaming, images, load, request
):
    folder = request.getfixturevalue(pack)
    ds = load("arrow", data_files={"train": shards_of(folder)}, streaming=streaming)
    check_decoded(ds, folder, images[1])
    check_samples(undecoded(ds, "jpg"), images[1])
    check_ours(folder, images[1])


@pytest.mark.parametrize("streaming", [False, True], ids=["loaded", "streamed"])
@pytest.mark.parametrize("pack", ["arrow_pack", "arrow_shards"])
def test_a_folder_of_arrow_shards_decodes_as_shardstream_does(
    pack, streaming, images, load, request
):
    folder = request.getfixturevalue(pack)
    ds = load(str(folder), streaming=streaming)
    check_decoded(ds, folder, images[1])
    check_samples(undecoded(ds, "jpg"), images[1])
    check_ours(folder, images[1])


# -- Parquet indexed in place ---------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["loaded", "streamed"])
def test_the_hub_folder_after_index(parquet_hub, streaming, images, load):
    ds = load(str(parquet_hub), streaming=streaming)
    assert ds.features["label"] == datasets.ClassLabel(names=CLASSES)
    check_samples(undecoded(ds, "image"), images[1], **PARQUET_FIELDS)
    check_ours(parquet_hub / "data", images[1], **PARQUET_FIELDS)


@pytest.mark.parametrize("streaming", [False, True], ids=["loaded", "streamed"])
def test_the_parquet_builder_by_data_files_and_by_data_dir(parquet_hub, streaming, images, load):
    files = str(parquet_hub / "data" / "*.parquet")
    ds = load("parquet", data_files={"train": files}, streaming=streaming)
    check_samples(undecoded(ds, "image"), images[1], **PARQUET_FIELDS)
    # the Hub's file names say their split: data_dir= takes the train files alone
    ds = load("parquet", data_dir=str(parquet_hub / "data"), streaming=streaming)
    check_samples(undecoded(ds, "image"), images[1], **PARQUET_FIELDS)
    check_ours(parquet_hub / "data", images[1], **PARQUET_FIELDS)


def test_parquet_files_whose_names_say_no_split(images, load, tmp_path):
    """``part-0.parquet``, ``part-1.parquet`` indexed in place: the folder loads (its builder inferred, its
    files filtered by extension) and so do data_files; the parquet builder with data_dir= takes every file
    not hidden, the manifest too, and fails on it, as the guide says."""
    write_hub_folder(tmp_path / "root", images[1], ["part-0.parquet", "part-1.parquet"])
    folder = tmp_path / "root" / "data"
    ss.index(str(folder / "*.parquet"))
    check_samples(undecoded(load(str(folder)), "image"), images[1], **PARQUET_FIELDS)
    ds = load("parquet", data_files={"train": str(folder / "*.parquet")})
    check_samples(undecoded(ds, "image"), images[1], **PARQUET_FIELDS)
    with pytest.raises(Exception, match="_manifest.json|Parquet magic bytes"):
        load("parquet", data_dir=str(folder))
    check_ours(folder, images[1], **PARQUET_FIELDS)
