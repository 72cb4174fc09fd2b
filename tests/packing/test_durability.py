"""Durability (issue 10, finding 8): after a power loss a manifest never survives without its shards.

Every shard is fsynced before its rename, the folder after the shard renames and before the
manifest is written, the manifest before its rename (or hard link: a pack's exclusive publish)
and the folder after it. The order is checked by recording ``os.fsync`` and the renames and links
of a pack run in this process.
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream import ShardWriter, pack
from shardstream.errors import StorageError
from shardstream.manifest import MANIFEST_NAME
from shardstream.manifest.files import IN_PROGRESS
from shardstream.manifest.index_tars import index
from shardstream.storage import Store
from tests.sample_datasets import make_files


class Recorder:
    """``os.fsync`` and ``os.replace``/``os.rename``/``os.link`` calls (all "rename": a file gets a name), in order,
    by path."""

    def __init__(self, monkeypatch, fail=None):
        self.events: list[tuple[str, ...]] = []
        self.fail = fail
        real_fsync, real_replace, real_rename, real_link = os.fsync, os.replace, os.rename, os.link

        def fsync(fd):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if self.fail is not None:
                self.fail(path)
            self.events.append(("fsync", path))
            return real_fsync(fd)

        def replace(src, dst, *a, **kw):
            self.events.append(("rename", os.path.abspath(src), os.path.abspath(dst)))
            return real_replace(src, dst, *a, **kw)

        def rename(src, dst, *a, **kw):
            self.events.append(("rename", os.path.abspath(src), os.path.abspath(dst)))
            return real_rename(src, dst, *a, **kw)

        def link(src, dst, *a, **kw):
            self.events.append(("rename", os.path.abspath(src), os.path.abspath(dst)))
            return real_link(src, dst, *a, **kw)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "link", link)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)

    def check_publication(self, dest: Path, shards: list[str]) -> None:
        """The order that makes a published dataset durable."""
        dest = Path(os.path.realpath(dest))
        # files whose bytes were on disk before they got their current name
        durable: set[str] = set()
        renamed_at: dict[str, int] = {}
        dir_syncs: list[int] = []
        for i, event in enumerate(self.events):
            if event[0] == "fsync":
                if os.path.realpath(event[1]) == str(dest):
                    dir_syncs.append(i)
                else:
                    durable.add(event[1])
            else:
                _, src, dst = event
                # the marker's token only matters to runs that are alive
                if dst.endswith(IN_PROGRESS):
                    continue
                assert src in durable, f"{src} renamed to {dst} before its bytes were synced"
                durable.add(dst)
                renamed_at[dst] = i
        manifest = str(dest / MANIFEST_NAME)
        last_shard = max((renamed_at[str(dest / s)] for s in shards), default=-1)
        assert manifest in renamed_at, "the manifest was not renamed or linked into place"
        assert any(last_shard < i < renamed_at[manifest] for i in dir_syncs), (
            "the folder was not synced between the shard renames and the manifest"
        )
        assert any(i > renamed_at[manifest] for i in dir_syncs), (
            "the folder was not synced after the manifest"
        )


def shard_names(dest: Path) -> list[str]:
    return json.loads((dest / MANIFEST_NAME).read_bytes())["shards"]["path"]


@pytest.fixture
def source(tmp_path):
    return make_files(tmp_path / "src", {f"c{i % 2}/s{i:03d}.txt": b"x" * 700 for i in range(12)})


def test_folder_pack_syncs_shards_then_folder_then_manifest(tmp_path, monkeypatch, source):
    rec = Recorder(monkeypatch)
    dest = tmp_path / "out"
    pack(str(source), str(dest), workers=1, samples_per_shard=4, progress=False)
    rec.check_publication(dest, shard_names(dest))


def test_shard_writer_syncs_shards_then_folder_then_manifest(tmp_path, monkeypatch):
    rec = Recorder(monkeypatch)
    dest = tmp_path / "out"
    with ShardWriter(str(dest), samples_per_shard=2) as w:
        for i in range(5):
            w.write({"__key__": f"k{i}", "txt": "x"})
    rec.check_publication(dest, shard_names(dest))


def test_table_pack_syncs_shards_then_folder_then_manifest(tmp_path, monkeypatch):
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": list(range(100))}), table)
    rec = Recorder(monkeypatch)
    dest = tmp_path / "out"
    pack(str(table), str(dest), samples_per_shard=30, workers=2, progress=False)
    rec.check_publication(dest, shard_names(dest))


def test_index_syncs_its_manifest(tmp_path, monkeypatch, source):
    dest = tmp_path / "out"
    pack(str(source), str(dest), workers=1, samples_per_shard=4, progress=False)
    (dest / MANIFEST_NAME).unlink()
    rec = Recorder(monkeypatch)
    index([str(dest)])
    assert (
        "fsync",
        str(dest / MANIFEST_NAME),
    ) not in rec.events  # the temporary file is synced, then renamed
    rec.check_publication(dest, [])
    manifest_at = next(
        i for i, e in enumerate(rec.events) if e[0] == "rename" and e[2].endswith(MANIFEST_NAME)
    )
    synced = {e[1] for e in rec.events[:manifest_at] if e[0] == "fsync"}
    assert {
        str(dest / name) for name in shard_names(dest)
    } <= synced  # tars written by others, just before


def test_fsync_false_syncs_nothing(tmp_path, monkeypatch, source):
    rec = Recorder(monkeypatch)
    pack(
        str(source),
        str(tmp_path / "out"),
        workers=1,
        samples_per_shard=4,
        progress=False,
        fsync=False,
    )
    with ShardWriter(str(tmp_path / "w"), fsync=False) as w:
        w.write({"txt": "x"})
    assert [e for e in rec.events if e[0] == "fsync"] == []


def test_a_folder_that_cannot_be_synced_is_not_an_error(tmp_path, monkeypatch, source):
    def refuse_folders(path):
        if os.path.isdir(path):
            raise OSError(errno.EINVAL, "Invalid argument")

    Recorder(monkeypatch, fail=refuse_folders)
    result = pack(str(source), str(tmp_path / "out"), workers=1, progress=False)
    assert result.samples == 12


def test_a_failing_fsync_stops_the_pack_naming_the_shard_and_publishes_nothing(
    tmp_path, monkeypatch, source
):
    def io_error(path):
        if "shard-000001" in path:
            raise OSError(errno.EIO, "Input/output error")

    Recorder(monkeypatch, fail=io_error)
    dest = tmp_path / "out"
    with pytest.raises(StorageError) as info:
        pack(str(source), str(dest), workers=1, samples_per_shard=4, progress=False)
    text = str(info.value)
    assert "\n" not in text and re.search(r"shard-000001-[0-9a-f]{16}\.tar", text)
    assert not (dest / MANIFEST_NAME).exists()


def test_object_stores_need_no_fsync(monkeypatch):
    rec = Recorder(monkeypatch)
    url = f"memory://durable-{uuid.uuid4().hex}/ds"
    with ShardWriter(url) as w:
        w.write({"txt": "x"})
    assert Store(url).exists(MANIFEST_NAME)
    assert [e for e in rec.events if e[0] == "fsync"] == []
