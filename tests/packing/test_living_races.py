"""Writers and ``gc`` on one living dataset at once, in a local folder (issue 38): every version that is published
stays readable and means what it meant until ``gc`` removes it, and ``gc`` removes only what no kept version
and no claim in flight names.

Deterministic first: each operation is run at every point of the other (before each storage call it makes,
:class:`~tests.packing.living_races.Interleave`): ``gc`` in the middle of an append's publish (with a shard
table too: large datasets), an append's publish and a whole append in the middle of ``gc``, and an append in the
middle of a ``pack --overwrite``. Then the same races between real processes at random offsets, as the
concurrent-pack tests run them (``SHARDSTREAM_RACES`` of each). The S3 counterparts are in
``tests/remote/test_living_races.py``.
"""

from __future__ import annotations

import json
import os

import pytest

import shardstream as ss
import shardstream.manifest.versions as versions
import shardstream.packing.destination as destination
import shardstream.packing.gc as gc_module
from shardstream.errors import ShardstreamError
from shardstream.manifest import load_manifest
from shardstream.manifest.files import manifest_files
from shardstream.manifest.versions import list_versions
from shardstream.packing.destination import DestinationLost, prepare_destination
from shardstream.packing.gc import collect
from shardstream.storage import Store
from tests.packing.living_races import (
    Interleave,
    append_and_gc_races,
    check_versions,
    each_point,
    judge_overwrite_race,
    overwrite_and_append_races,
)
from tests.packing.races import Runner


class Living:
    """A dataset in ``url`` of two versions (the second an append) and a crashed run's leftover, and the samples
    of the appends and overwrites to come; keys are unique to each writer."""

    def __init__(self, url: str, storage_options: dict | None = None, spp: int = 2):
        self.url, self.options, self.spp = url, storage_options, spp
        # one store (one client of an object store) for every writer, gc and check
        self.store = Store(url, storage_options)
        self.keys: set[str] = set()
        for tag in ("v1", "v2"):
            with self.writer(append=True) as w:
                self.keys |= self.add(w, tag, 3)
        # what a crashed run left: gc removes it unless a claim is in flight
        self.store.write_bytes("shard-000000-0123456789abcdef.tar", b"left by a crashed run")

    def writer(self, overwrite: bool = False, append: bool = False) -> ss.ShardWriter:
        """A writer that claims the dataset now, as ``ShardWriter(url, ...)`` does, through this store."""
        claim = prepare_destination(self.store, overwrite, True, append)
        return ss.ShardWriter(self.url, samples_per_shard=self.spp, _claim=claim)

    @staticmethod
    def add(writer: ss.ShardWriter, tag: str, n: int) -> set[str]:
        keys = {f"{tag}/{i:03d}" for i in range(n)}
        for key in sorted(keys):
            writer.write({"__key__": key, "txt": f"{key} ".encode() * 20})
        return keys

    def gc(self, keep: int = 1):
        return collect(self.store, keep, delete=True)


def judge(living: Living, expected: set[str] | None, where: str, paths: list | None = None) -> None:
    """Every version reads whole; the latest holds the ``expected`` samples (read), or names ``paths``."""
    problems = check_versions(living.store, expected)
    assert not problems, f"{where}: {problems[0]}"
    if paths is not None:
        assert load_manifest(living.store).paths == paths, f"{where}: the latest is not the append"


def gc_in_an_append(living: Living, k: int, tag: str) -> bool:
    """gc before the ``k``-th storage call of an append's publish (its shards written before)."""
    writer = living.writer(append=True)
    new = Living.add(writer, tag, 3)
    with Interleave(k, living.gc) as point:
        writer.close()  # the publish: no gc makes it fail
    if point.fired:
        assert point.error is None, f"gc at call {k} of the publish: {point.error}"
    living.keys |= new
    judge(living, None, f"gc at call {k} of an append's publish", writer.manifest.paths)
    return point.fired


def test_gc_at_every_point_of_an_append_s_publish_removes_nothing_it_publishes(tmp_path):
    living = Living(str(tmp_path / "ds"))
    points = each_point(lambda k: gc_in_an_append(living, k, f"a{k}"))
    assert points > 10
    judge(living, living.keys, "after every point")
    living.gc()  # and afterwards gc finds what the crashed run left, and the older versions
    assert not living.store.exists("shard-000000-0123456789abcdef.tar")
    assert list_versions(living.store) == [load_manifest(living.store).version]
    judge(living, living.keys, "after the last gc")


def test_gc_at_every_point_of_an_append_of_a_large_dataset_spares_its_shard_table(
    tmp_path, monkeypatch
):
    """From 10,000 shards a manifest's columns go to a shard table, named by its content, not by the run; gc
    must not remove the one an append is about to publish (here from 1 shard: the same code)."""
    monkeypatch.setattr(destination, "manifest_files", lambda m: manifest_files(m, 1))
    living = Living(str(tmp_path / "ds"))
    assert each_point(lambda k: gc_in_an_append(living, k, f"t{k}")) > 10
    judge(living, living.keys, "after every point")
    head = (tmp_path / "ds" / "_manifest.json").read_text()
    assert '"table": ".shardstream/shards-' in head  # the versions published have shard tables


def an_append_in_gc(living: Living, k: int, tag: str, claimed_before: bool) -> bool:
    """An append's publish (``claimed_before``: its claim taken and shards written before gc starts), or a whole
    append, before gc's ``k``-th storage call."""
    new: set[str] = set()
    if claimed_before:
        writer = living.writer(append=True)
        new = Living.add(writer, tag, 3)

        def append() -> list[str]:
            writer.close()
            return writer.manifest.paths
    else:

        def append() -> list[str]:
            with living.writer(append=True) as w:
                new.update(Living.add(w, tag, 3))
            return w.manifest.paths

    with Interleave(k, append) as point:
        living.gc()
    paths = point.result if point.fired else append()
    assert point.error is None, f"an append at call {k} of gc: {point.error}"
    living.keys |= new
    judge(living, None, f"an append at call {k} of gc", paths)
    return point.fired


@pytest.mark.parametrize("claimed_before", [True, False], ids=["publish", "whole-append"])
def test_an_append_at_every_point_of_gc_stays_published(tmp_path, claimed_before):
    living = Living(str(tmp_path / "ds"))
    points = each_point(lambda k: an_append_in_gc(living, k, f"g{k}", claimed_before))
    assert points > 5
    judge(living, living.keys, "after every point")


def an_append_in_an_overwrite(living: Living, k: int, tag: str) -> bool:
    """A whole append before the ``k``-th storage call of a ``pack --overwrite``'s publish: one of them loses (and
    says so), or both publish, the one after the other."""
    over = living.writer(overwrite=True)
    replacing = Living.add(over, f"o-{tag}", 3)
    appended: set[str] = set()

    def append() -> ss.Manifest:
        with living.writer(append=True) as w:
            appended.update(Living.add(w, tag, 3))
        return w.manifest

    with Interleave(k, append) as point:
        try:
            over.close()
            published = (over.manifest.version, over.manifest.fingerprint)
        except DestinationLost:
            published = None
    result = point.result if point.fired else append()
    assert point.error is None or isinstance(point.error, DestinationLost), point.error
    appended_as = None if point.error else (result.version, result.fingerprint)
    living.keys, problems = judge_overwrite_race(
        living.store, living.keys, published, replacing, appended_as, appended, read=False
    )
    assert not problems, f"an append at call {k} of an overwrite: {problems[0]}"
    return point.fired


def test_an_append_at_every_point_of_an_overwrite_is_published_or_refused(tmp_path):
    living = Living(str(tmp_path / "ds"))
    points = each_point(lambda k: an_append_in_an_overwrite(living, k, f"x{k}"))
    assert points > 10
    judge(living, living.keys, "after every point")


def test_gc_completes_a_publish_cut_short_before_it_removes_the_head_s_version(
    tmp_path, monkeypatch
):
    """An overwrite that died between its version file and moving ``_manifest.json``: gc moves the head forward
    before it removes the older version and its shards, so the head never names removed files."""
    living = Living(str(tmp_path / "ds"))

    def die(*args, **kwargs):
        raise RuntimeError("killed before the head moved")

    monkeypatch.setattr(versions, "move_head", die)
    writer = living.writer(overwrite=True)
    replacing = Living.add(writer, "new", 3)
    with pytest.raises(RuntimeError, match="killed before the head moved"):
        writer.close()
    monkeypatch.undo()
    assert list_versions(living.store) == [1, 2, 3] and load_manifest(living.store).version == 3
    living.gc()
    assert list_versions(living.store) == [3]
    assert json.loads((tmp_path / "ds" / "_manifest.json").read_bytes())["version"] == 3
    judge(living, replacing, "after gc")


def test_gc_that_finds_a_new_version_at_each_look_removes_nothing_and_says_so(
    tmp_path, monkeypatch
):
    living = Living(str(tmp_path / "ds"))
    looks = []

    def changing(store):  # as if a version were published between any two looks
        looks.append(1)
        return [*list_versions(store), 100 + len(looks)]

    monkeypatch.setattr(gc_module, "list_versions", changing)
    with pytest.raises(
        ShardstreamError, match=r"changed each of the 8 times gc read it .*run gc again"
    ):
        living.gc()
    monkeypatch.undo()
    assert living.store.exists("shard-000000-0123456789abcdef.tar")  # nothing was removed
    assert list_versions(living.store) == [1, 2]


# -- the same races between processes, at random offsets ------------------------------------------------------

RACES = int(os.environ.get("SHARDSTREAM_RACES", "20"))  # per variant


@pytest.fixture(scope="module")
def runners():
    """Two warm runner processes (see :mod:`tests.packing.races`)."""
    made = (Runner(), Runner())
    yield made
    for runner in made:
        runner.close()


PACK = {"samples_per_shard": 2, "workers": 1}


def test_appends_and_gc_at_random_offsets_lose_nothing(runners, tmp_path):
    problems = append_and_gc_races(*runners, tmp_path, str(tmp_path / "ds"), PACK, {}, RACES, 38)
    assert not problems, problems[:3]


def test_appends_and_overwrites_at_random_offsets_publish_one_after_the_other_or_refuse(
    runners, tmp_path
):
    problems, ends = overwrite_and_append_races(
        *runners, tmp_path, str(tmp_path / "ds"), PACK, RACES, 39
    )
    print(f"local overwrite and append races: {ends}")
    assert not problems, problems[:3]
