"""A run's own names, its exclusive publish and what it removes (issue 32), one case at a time.

The races themselves are in ``test_concurrent_packs.py``; here each way a run can lose is made to happen
at a known point: another run claims the folder, another manifest appears, the manifest a run replaces
changes, or (on a store without conditional writes) another manifest lands right after this run's.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from shardstream import ShardWriter, pack
from shardstream.errors import DatasetExistsError
from shardstream.manifest import MANIFEST_NAME, load_manifest
from shardstream.manifest.files import IN_PROGRESS, write_manifest
from shardstream.manifest.side_names import version_name
from shardstream.manifest.verify import verify
from shardstream.packing.destination import DestinationLost
from shardstream.storage import Store
from shardstream.storage.conditional import Expect, WriteConflict
from tests import folders
from tests.folders import folder_files
from tests.sample_datasets import make_files


def other_manifest(tmp_path, samples: int = 2):
    """A manifest of another dataset (its shards in a folder of their own)."""
    with ShardWriter(str(tmp_path / f"other-{uuid.uuid4().hex[:6]}")) as w:
        for i in range(samples):
            w.write({"__key__": f"o{i}", "txt": "other"})
    return w.manifest


def written(writer: ShardWriter, n: int = 3) -> ShardWriter:
    for i in range(n):
        writer.write({"__key__": f"k{i}", "txt": f"sample {i}"})
    writer.finish()
    return writer


# -- the conditional write itself --------------------------------------------------------------------------------


def test_a_local_conditional_write_creates_once_and_replaces_only_the_version_read(tmp_path):
    store = Store(str(tmp_path))
    assert store.honours_conditions(".probe")
    store.write_if("m.json", b"one", Expect(None), fsync=True)
    with pytest.raises(WriteConflict, match="m.json: it already exists"):
        store.write_if("m.json", b"two", Expect(None))
    data, tag = store.read_tagged("m.json")
    assert data == b"one"
    store.write_if("m.json", b"three", Expect(tag))
    with pytest.raises(WriteConflict, match="holds another version than expected"):
        store.write_if("m.json", b"four", Expect(tag))  # the version read is gone: refused
    os.unlink(tmp_path / "m.json")
    with pytest.raises(WriteConflict, match="is gone"):
        store.write_if("m.json", b"five", Expect(store.read_tagged("x") or "0" * 64))
    # no temporary file left
    assert store.read_tagged("m.json") is None and folder_files(tmp_path) == []


def test_stores_without_conditional_writes_say_so():
    assert not Store(f"memory://cond-{uuid.uuid4().hex}/ds").honours_conditions(".probe")


# -- names ---------------------------------------------------------------------------------------------------------


def test_every_file_of_a_run_carries_its_token_and_a_second_run_writes_none_of_them(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": str(i).encode() * 50 for i in range(6)})
    first = pack(src, tmp_path / "ds", samples_per_shard=2, index=True, progress=False)
    run = first.manifest.paths[0].split("-")[-1].split(".")[0]
    names = folder_files(tmp_path / "ds")
    assert names == sorted([MANIFEST_NAME, *indexed(first.manifest.paths)])
    assert all(run in n for n in names if n != MANIFEST_NAME)
    second = pack(
        src, tmp_path / "ds", samples_per_shard=2, index=True, overwrite=True, progress=False
    )
    assert not set(first.manifest.paths) & set(second.manifest.paths)
    assert second.fingerprint == first.fingerprint and verify(str(tmp_path / "ds")).ok


# -- losing ---------------------------------------------------------------------------------------------------------


def test_a_run_that_lost_the_claim_removes_its_files_and_says_so(tmp_path):
    dest = tmp_path / "ds"
    old = written(ShardWriter(str(dest), samples_per_shard=1))
    # claims the folder: the old run is done
    newer = written(ShardWriter(str(dest), samples_per_shard=2), 4)
    mine = set(newer.paths)
    with pytest.raises(
        DestinationLost,
        match=r"claimed by another pack while this one was writing; this run's "
        r"shards were not published and its \d+ files? (was|were) removed; let one pack",
    ) as info:
        old.close()
    assert "\n" not in str(info.value)
    assert not [n for n in folder_files(dest) if old.token in n]
    newer.close()
    assert folder_files(dest) == sorted([MANIFEST_NAME, *indexed(mine)]) and verify(str(dest)).ok


def indexed(shards) -> list[str]:
    """Tar shards with the sample index each gets by default (in ``.shardstream/``)."""
    return folders.indexed(*shards)


def test_a_manifest_that_appears_while_a_run_writes_makes_it_lose_and_stays(tmp_path):
    dest = tmp_path / "ds"
    writer = written(ShardWriter(str(dest), samples_per_shard=1))
    theirs = other_manifest(tmp_path)
    write_manifest(Store(str(dest)), theirs)  # published by someone else, the claim left as it was
    before = (dest / MANIFEST_NAME).read_bytes()
    with pytest.raises(DestinationLost) as info:
        writer.close()
    text = str(info.value)
    assert (
        "another pack published a dataset there while this one was writing (_manifest.json appeared)"
        in text
    )
    assert (
        "its 6 files were removed" in text
    )  # 3 shards and their sample indexes and "--overwrite" in text and "\n" not in text
    assert (dest / MANIFEST_NAME).read_bytes() == before  # never replaced
    # its claim
    assert (
        not [n for n in folder_files(dest) if writer.token in n]
        and not (dest / IN_PROGRESS).exists()
    )


def test_an_overwrite_loses_when_the_manifest_it_replaces_changed_meanwhile(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": str(i).encode() for i in range(4)})
    dest = tmp_path / "ds"
    pack(src, dest, samples_per_shard=2, progress=False)
    writer = written(ShardWriter(str(dest), samples_per_shard=1, overwrite=True))
    replaced = other_manifest(tmp_path)
    write_manifest(Store(str(dest)), replaced)  # another overwrite was published first
    with pytest.raises(
        DestinationLost,
        match=r"\(_manifest.json was replaced\); this run's shards were not "
        r"published and its 6 files were removed",  # 3 shards and their sample indexes
    ):
        writer.close()
    assert json.loads((dest / MANIFEST_NAME).read_bytes())["shards"]["path"] == replaced.paths


def test_an_overwrite_keeps_the_old_dataset_whole_until_its_manifest_is_published(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": str(i).encode() for i in range(4)})
    dest = tmp_path / "ds"
    old = pack(src, dest, samples_per_shard=2, progress=False)
    with pytest.raises(DatasetExistsError):
        ShardWriter(str(dest))
    writer = written(ShardWriter(str(dest), samples_per_shard=1, overwrite=True))
    # still published
    assert load_manifest(Store(str(dest))).paths == old.manifest.paths and verify(str(dest)).ok
    writer.close()
    # the old shards went after it; the new dataset is version 2, published by its version file
    assert folder_files(dest) == sorted([MANIFEST_NAME, version_name(2), *indexed(writer.paths)])
    assert verify(str(dest)).ok


def test_a_store_without_conditional_writes_checks_its_manifest_after_writing_it(
    tmp_path, monkeypatch
):
    """Where the store cannot refuse a second writer, a manifest that lands right after this run's is found by
    the re-read that follows the write: this run fails loudly and removes its files; the other one stands."""
    url = f"memory://cond-{uuid.uuid4().hex}/ds"
    writer = written(ShardWriter(url, samples_per_shard=1))
    theirs = other_manifest(tmp_path).to_json()
    store = writer.store
    real = store.write_bytes

    def and_then_another(name, data, *args, **kwargs):
        real(name, data, *args, **kwargs)
        if name == MANIFEST_NAME:
            real(name, theirs)  # another pack's publish, a moment later

    monkeypatch.setattr(store, "write_bytes", and_then_another)
    monkeypatch.setattr(store, "honours_conditions", lambda *a: False)
    # 3 shards, their indexes
    with pytest.raises(
        DestinationLost,
        match=r"another pack published a dataset over this one \(_manifest.json is "
        r"not this run's right after it was written; memory:// takes no conditional writes\); this "
        r"run's shards were not published and its 6 files were removed",
    ):
        writer.close()
    assert bytes(Store(url).read_bytes(MANIFEST_NAME)) == theirs
    assert not [n for n in Store(url).list_files(recursive=True) if writer.token in n]
