"""Damage never trains silently (issue 39): one byte flipped inside one sample's value of a local dataset
packed with default settings is an error naming the shard, the sample's key and the field, in every
reader; under ``on_error="skip"`` that sample alone is skipped and counted. A dataset without per-sample
checksums (an old index) reads as before, with one warning saying how to add them."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image
from torch.utils.data import DataLoader

import shardstream as ss
from shardstream.cli import cli
from shardstream.errors import CorruptShardError
from shardstream.formats import tar as tar_format
from shardstream.formats.compression import compressing_writer, decompress
from shardstream.manifest import dataset_store, load_manifest, write_manifest
from shardstream.manifest.index_parquet import index_parquet
from shardstream.manifest.side_names import index_name, old_index_name
from shardstream.manifest.verify import verify
from tests.folders import as_format_3

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    pytest.mark.filterwarnings(
        "ignore:batch\\['jpg'\\] is a list of"
    ),  # two image sizes, on purpose
]

IMAGES = 12
PER_SHARD = 4
BAD = 5  # the damaged sample: shard 1, position 1 (packed in order)
KINDS = ("tar", "tar.zst", "arrow", "parquet")


def label(i: int) -> int:
    return i // (IMAGES // 2)  # two classes, so that the folder's order is the samples' numbers


def key(i: int) -> str:
    return f"class_{label(i)}/img_{i:03d}"


def jpeg(i: int) -> bytes:
    """A small JPEG of noise (its bytes are unique), 24 wide and 16 or 32 high."""
    rng = np.random.default_rng(i)
    pixels = rng.integers(0, 256, (16 * (1 + i % 2), 24, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def folder(root: Path) -> Path:
    for i in range(IMAGES):
        path = root / "src" / f"{key(i)}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg(i))
    return root / "src"


def parquet(root: Path) -> str:
    """The same samples as a Parquet file of three row groups, indexed in place."""
    out = root / "pq"
    out.mkdir()
    table = pa.table(
        {
            "__key__": [key(i) for i in range(IMAGES)],
            "jpg": [jpeg(i) for i in range(IMAGES)],
            "cls": pa.array([label(i) for i in range(IMAGES)], pa.int64()),
        }
    )
    plain = {"compression": "none", "use_dictionary": False, "row_group_size": PER_SHARD}
    pq.write_table(table, out / "a.parquet", **plain)
    return index_parquet([str(out / "a.parquet")]).url


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, str]:
    """Each kind of dataset, as packed with default settings (12 samples, 3 shards, in order)."""
    root = tmp_path_factory.mktemp("integrity")
    src = folder(root)
    made = {}
    for kind, options in {
        "tar": {},
        "tar.zst": {"compression": "zstd"},
        # uncompressed buffers, so that a value's bytes are in the file as they are
        "arrow": {"format": "arrow", "compression": "none"},
    }.items():
        out = root / kind
        ss.pack(src, out, samples_per_shard=PER_SHARD, shuffle=False, progress=False, **options)
        made[kind] = str(out)
    made["parquet"] = parquet(root)
    return made


def copy(pristine: dict[str, str], kind: str, tmp_path: Path) -> str:
    target = tmp_path / kind
    shutil.copytree(pristine[kind], target)
    return str(target)


def flip(data: bytearray, at: int) -> None:
    data[at] ^= 0x10


def recompressed(store, m, shard: int, plain: bytes) -> bytes:
    """``plain`` compressed as a pack writes it, the manifest's size and sha256 of ``shard`` made that
    frame's: a tool's bad copy that decompressed and compressed again (a valid frame, its checksum the
    changed tar's), which only the per-sample checksums can tell."""
    out = io.BytesIO()
    writer = compressing_writer(out, "zstd", None, len(plain))
    writer.write(plain)
    writer.close()
    frame = out.getvalue()
    nbytes, sha256 = m.nbytes.copy(), list(m.sha256)
    nbytes[shard], sha256[shard] = len(frame), hashlib.sha256(frame).hexdigest()
    write_manifest(store, dataclasses.replace(m, nbytes=nbytes, sha256=sha256))
    return frame


def damage(dataset: str, kind: str, field: str, sample: int = BAD) -> tuple[str, str]:
    """Flip one byte in the middle of ``field`` of ``sample``; (the shard's file name, the key)."""
    url = dataset
    store = dataset_store(url)
    m = load_manifest(store)
    path = Path(url) / m.paths[0 if kind == "parquet" else sample // PER_SHARD]
    data = bytearray(path.read_bytes())
    if kind in ("tar", "tar.zst"):
        plain = bytearray(decompress(bytes(data), "zstd" if kind == "tar.zst" else None, "s"))
        _, fields = tar_format.index_samples(plain, "s")  # from the headers
        offset, size = fields[sample % PER_SHARD][field]
        if kind == "tar":
            flip(plain, offset + size // 2)
            data = plain
        else:
            flip(plain, offset + size // 2)
            data = bytearray(recompressed(store, m, sample // PER_SHARD, bytes(plain)))
    elif field == "jpg":
        value = jpeg(sample)
        at = bytes(data).index(value)
        flip(data, at + len(value) // 2)
    else:  # the label column of the sample's shard (Arrow) or of the file (Parquet): int64 values
        first = 0 if kind == "parquet" else sample // PER_SHARD * PER_SHARD
        count = IMAGES if kind == "parquet" else PER_SHARD
        if kind == "parquet":  # one row group's values at a time
            first, count = sample // PER_SHARD * PER_SHARD, PER_SHARD
        labels = np.array([label(i) for i in range(first, first + count)], dtype="<i8").tobytes()
        at = bytes(data).index(labels)
        flip(data, at + 8 * (sample - first))
    path.write_bytes(bytes(data))
    return path.name, key(sample)


def named(exc: BaseException, shard: str, sample: str, field: str) -> bool:
    text = str(exc)
    return shard in text and f"sample {sample!r}" in text and f"field {field!r}" in text


# -- every reader, with default settings ------------------------------------------------------------------


def epoch(url: str, **kwargs) -> list:
    ds = ss.ShardDataset(url, decode=kwargs.pop("decode", None), **kwargs.pop("dataset", {}))
    out = []
    for batch in ds.loader(batch_size=4, **kwargs):
        out += list(batch["__key__"])
        taken(batch)
    return out


def taken(batch: dict) -> None:
    """Every value of a raw batch taken as bytes (locations in the shard files are read here)."""
    for name in ("jpg", "cls"):
        if isinstance(batch[name], ss.dataset.MappedBytes):
            list(batch[name])


def decoded(url: str) -> list:
    return [s["__key__"] for s in ss.ShardDataset(url)]  # decode="torch", sample by sample


def map_item(url: str) -> list:
    m = ss.ShardMap(url, decode=None)
    return [m[i]["__key__"] for i in range(len(m))]


def map_batches(url: str) -> list:
    """The map through a default DataLoader: its batches read by ``__getitems__``, one call each."""
    m = ss.ShardMap(url, decode=None)
    loader = DataLoader(m, batch_size=3, sampler=list(reversed(range(len(m)))), collate_fn=list)
    return [s["__key__"] for batch in loader for s in batch]


def map_get(url: str) -> list:
    m = ss.ShardMap(url, decode=None)
    return [m.get(key(i))["__key__"] for i in range(len(m))]


def cat(url: str) -> list:
    runner, keys = CliRunner(), []
    for i in range(IMAGES):
        result = runner.invoke(cli, ["cat", url, str(i)])
        assert result.exit_code in (0, 1), result.output
        if result.exit_code:
            raise CorruptShardError(result.stderr)
        keys += [k for k in (key(j) for j in range(IMAGES)) if k in result.stdout.split()]
    return keys


def bucketed(url: str) -> list:
    ds = ss.ShardDataset(url, decode=None)
    batches = ss.Bucketed(ds, key=ss.aspect_ratio("jpg"), batch_size=4, num_workers=0)
    assert batches.planned_up_front
    out = []
    for batch in batches:
        out += list(batch["__key__"])
        taken(batch)
    return out


READERS = {
    "processes-0": lambda url: epoch(url, num_workers=0),
    "processes-2": lambda url: epoch(url, num_workers=2, workers="processes"),
    "threads-2": lambda url: epoch(url, num_workers=2, workers="threads"),
    "decoded": decoded,
    "map[i]": map_item,
    "map batches": map_batches,
    "map.get": map_get,
    "cat": cat,
    "bucketed": bucketed,
}


def cases():
    for kind in KINDS:
        for reader in READERS:
            if reader == "bucketed" and kind == "parquet":
                continue  # indexed in place: no recorded image sizes to plan from
            yield kind, "jpg", reader
        for reader in ("processes-0", "map[i]", "map batches"):
            yield kind, "cls", reader


@pytest.mark.parametrize(("kind", "field", "reader"), list(cases()))
def test_a_flipped_byte_is_an_error_naming_shard_key_and_field(
    pristine, tmp_path, kind, field, reader
):
    dataset = copy(pristine, kind, tmp_path)
    assert sorted(READERS[reader](dataset)) == sorted(key(i) for i in range(IMAGES))
    shard, sample = damage(dataset, kind, field)
    with pytest.raises(CorruptShardError) as info:
        READERS[reader](dataset)
    assert named(info.value, shard, sample, field), str(info.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "reader",
    [
        {"num_workers": 0},
        {"num_workers": 2, "workers": "processes"},  # (reader threads do not skip: refused)
        {"num_workers": 0, "decode": "torch"},
    ],
    ids=["processes-0", "processes-2", "decoded"],
)
def test_under_skip_that_one_sample_is_skipped_and_counted(pristine, tmp_path, kind, reader):
    dataset = copy(pristine, kind, tmp_path)
    _, bad = damage(dataset, kind, "jpg")
    ds = ss.ShardDataset(
        dataset, decode=reader.get("decode"), on_error="skip", shuffle=False, seed=3
    )
    kwargs = {k: v for k, v in reader.items() if k != "decode"}
    keys = [k for batch in ds.loader(batch_size=4, **kwargs) for k in batch["__key__"]]
    assert len(keys) == IMAGES and ds.skipped == 1
    # every other sample of the damaged shard is read; the bad one is replaced by the one before it
    assert set(keys) == {key(i) for i in range(IMAGES)} - {bad}
    assert keys[BAD] == keys[BAD - 1]


def test_a_damaged_value_is_never_handed_out_in_a_raw_batch(pristine, tmp_path):
    """The raw batches of local tars (locations in the shard files) carry each value's checksum: a value is
    checked where it is read, as it is taken from the batch."""
    dataset = copy(pristine, "tar", tmp_path)
    damage(dataset, "tar", "jpg", sample=1)
    ds = ss.ShardDataset(dataset, decode=None, shuffle=False)
    batch = next(iter(ds.loader(batch_size=4, num_workers=0)))
    with pytest.raises(CorruptShardError, match=r"sample 'class_0/img_001' .*field 'jpg'"):
        taken(batch)


# -- datasets without per-sample checksums ---------------------------------------------------------------


def old_indexes(url: str) -> None:
    """The dataset as 0.5.0 left it: format 3, each tar's sample index beside it (version 1: no member checksums)."""
    store = dataset_store(url)
    m = load_manifest(store)
    digests = []
    for name in m.paths:
        tar = (Path(url) / name).read_bytes()
        raw = tar_format.build_index(tar, name)
        assert raw[:8] == b"SSTARIX1"
        (Path(url) / index_name(name)).unlink()
        (Path(url) / old_index_name(name)).write_bytes(raw)  # where 0.5.0 kept it: beside its shard
        digests.append(hashlib.sha256(raw).hexdigest())
    write_manifest(store, dataclasses.replace(m, index_sha256=digests))
    as_format_3(url)  # and the manifest as 0.5.0 wrote it


def test_an_old_index_reads_as_before_with_one_warning(pristine, tmp_path, caplog):
    dataset = copy(pristine, "tar", tmp_path)
    old_indexes(dataset)
    caplog.set_level(logging.WARNING, logger="shardstream")
    for _ in range(2):  # two epochs, a map: one warning in this process
        assert sorted(epoch(dataset, num_workers=0)) == sorted(key(i) for i in range(IMAGES))
    assert map_item(dataset)
    lines = [r.getMessage() for r in caplog.records if "per-sample checksums" in r.getMessage()]
    assert len(lines) == 1, lines
    assert dataset in lines[0] and f"'shardstream upgrade {dataset}' adds them" in lines[0]
    # damage inside a value goes unnoticed, as it did before: the warning said so
    damage(dataset, "tar", "jpg")
    assert len(epoch(dataset, num_workers=0)) == IMAGES


def test_verify_says_which_datasets_have_per_sample_checksums(pristine, tmp_path):
    new, old = copy(pristine, "tar", tmp_path / "new"), copy(pristine, "tar", tmp_path / "old")
    old_indexes(old)
    assert (
        verify(new)
        .checksums_line()
        .startswith("per-sample checksums (xxh3_64): every shard has them")
    )
    assert verify(old).checksums_line().startswith("per-sample checksums: none")
    assert f"'shardstream upgrade {old}' adds them" in verify(old).checksums_line()
    for kind in ("tar.zst", "arrow", "parquet"):
        assert verify(copy(pristine, kind, tmp_path / "v")).checksums == [True] * (
            1 if kind == "parquet" else 3
        )
    result = CliRunner().invoke(cli, ["verify", "-q", old])
    assert result.exit_code == 0 and "per-sample checksums: none" in result.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_verify_names_the_damaged_sample_and_field(pristine, tmp_path, kind):
    dataset = copy(pristine, kind, tmp_path)
    shard, sample = damage(dataset, kind, "cls")
    (problem,) = verify(dataset).problems
    assert shard in problem and f"sample {sample!r}" in problem and "'cls'" in problem


def test_arrow_readers_see_no_extra_column(pristine):
    import pyarrow.dataset as pads
    import pyarrow.feather as feather

    url = pristine["arrow"]
    m = load_manifest(dataset_store(url))
    path = str(Path(url) / m.paths[0])
    assert feather.read_table(path).column_names == ["__key__", "jpg", "cls"]
    with pa.ipc.open_file(path) as reader:
        assert reader.schema.names == ["__key__", "jpg", "cls"]
        # the schema's metadata is the Hugging Face features and the image columns: the checksums are the
        # record batches'
        assert set(reader.schema.metadata) == {b"huggingface", b"shardstream"}
        assert b"checksum" not in reader.schema.metadata[b"shardstream"]
        _, metadata = reader.get_batch_with_custom_metadata(0)
        doc = json.loads(metadata[b"shardstream.checksums"])
        assert doc["hash"] == "xxh3_64" and len(doc["columns"]) == 3
    assert pads.dataset(url, format="ipc").to_table().num_rows == IMAGES


def test_the_check_costs_nothing_when_switched_off_for_measuring(pristine, tmp_path, monkeypatch):
    """The benchmark's switch (not a setting): with it off, damage goes through unchecked."""
    from shardstream.formats import checksums

    dataset = copy(pristine, "tar", tmp_path)
    damage(dataset, "tar", "jpg")
    monkeypatch.setattr(checksums, "CHECK_ON_READ", False)
    assert len(epoch(dataset, num_workers=0)) == IMAGES
