"""The datasets every client reads: one image folder packed as tar and Arrow shards (one shard, as a
default pack of a small folder makes, and several), and a Hub-like folder of Parquet files indexed in
place. Session-scoped and read-only: a test that lets a client write into a folder works on a copy
(:func:`copy_of`). The ``dali`` mark: NVIDIA DALI runs in an environment of its own (``make dali-test``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardstream as ss
from tests.interop.clients import CLASSES, make_images


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "dali: reads with NVIDIA DALI from its own environment, .venv-dali (make dali-test; "
        "skipped without it)",
    )


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("interop") / "images"
    return root, make_images(root)


def _pack(images, tmp_path_factory, name, **options) -> Path:
    dest = tmp_path_factory.mktemp("packs") / name
    ss.pack(images[0], dest, workers=1, progress=False, **options)
    return dest


@pytest.fixture(scope="session")
def tar_pack(images, tmp_path_factory) -> Path:
    """``shardstream pack images ds`` with the defaults: one tar shard for a folder this small."""
    return _pack(images, tmp_path_factory, "tar")


@pytest.fixture(scope="session")
def tar_shards(images, tmp_path_factory) -> Path:
    """Tar shards of 10 samples: 3 shards."""
    return _pack(images, tmp_path_factory, "tar-shards", samples_per_shard=10)


@pytest.fixture(scope="session")
def tar_zst(images, tmp_path_factory) -> Path:
    """``pack --compression zstd``: whole shards compressed."""
    return _pack(images, tmp_path_factory, "tar-zst", compression="zstd", samples_per_shard=10)


@pytest.fixture(scope="session")
def arrow_pack(images, tmp_path_factory) -> Path:
    return _pack(images, tmp_path_factory, "arrow", format="arrow")


@pytest.fixture(scope="session")
def arrow_shards(images, tmp_path_factory) -> Path:
    return _pack(images, tmp_path_factory, "arrow-shards", format="arrow", samples_per_shard=10)


def hub_features() -> bytes:
    """The ``huggingface`` schema metadata ``push_to_hub`` writes for these columns."""
    features = {
        "key": {"dtype": "string", "_type": "Value"},
        "image": {"_type": "Image"},
        "label": {"names": CLASSES, "_type": "ClassLabel"},
    }
    return json.dumps({"info": {"features": features}}).encode()


def write_hub_folder(root: Path, truth: dict, names: list[str]) -> list[Path]:
    """The truth as Parquet files ``root/data/<name>`` as the Hub holds them (an Image struct column, a
    ClassLabel, row groups of 5 rows), the rows split evenly between the files."""
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [("key", pa.string()), ("image", image), ("label", pa.int64())],
        metadata={b"huggingface": hub_features()},
    )
    keys = sorted(truth)
    (root / "data").mkdir(parents=True)
    files = []
    for i, name in enumerate(names):
        part = keys[i * len(keys) // len(names) : (i + 1) * len(keys) // len(names)]
        table = pa.table(
            {
                "key": part,
                "image": [
                    {"bytes": truth[k]["jpg"], "path": k.split("/")[1] + ".jpg"} for k in part
                ],
                "label": [truth[k]["cls"] for k in part],
            },
            schema=schema,
        )
        pq.write_table(table, root / "data" / name, row_group_size=5)
        files.append(root / "data" / name)
    return files


@pytest.fixture(scope="session")
def parquet_hub(images, tmp_path_factory) -> Path:
    """A Hub-like snapshot, ``root/data/train-0000{0,1}-of-00002.parquet``, after
    ``shardstream index 'root/data/*.parquet'`` (the dataset's folder is ``root/data``). Returns ``root``."""
    root = tmp_path_factory.mktemp("hub") / "snapshot"
    write_hub_folder(root, images[1], [f"train-{i:05d}-of-00002.parquet" for i in range(2)])
    ss.index(str(root / "data" / "*.parquet"))
    return root


PARQUET_FIELDS = {"key": "key", "jpg": "image", "cls": "label"}


def copy_of(folder: Path, tmp_path: Path) -> Path:
    """A copy of a dataset's folder (hidden files included) for a client that writes into it."""
    dest = tmp_path / folder.name
    shutil.copytree(folder, dest, symlinks=True)
    return dest
