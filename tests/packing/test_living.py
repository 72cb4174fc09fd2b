"""Datasets that live, in a local folder: append, versions, pinning, resume across a publish, gc, kill -9
during an append, and two appends at once."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

import shardstream as ss
from shardstream.errors import ManifestError, ShardstreamError, UsageError
from shardstream.manifest import MANIFEST_NAME, dataset_store, load_manifest
from shardstream.manifest.files import write_manifest
from shardstream.manifest.verify import verify
from shardstream.manifest.versions import commit_version, history, version_name
from shardstream.packing.destination import DestinationLost
from shardstream.packing.gc import collect
from shardstream.storage import Store
from shardstream.storage.conditional import WriteConflict
from tests.folders import folder_bytes, folder_files


def text_folder(root: Path, n: int, start: int = 0, ext: str = "txt") -> set[str]:
    """``n`` samples per folder ``a`` and ``b`` (keys ``a/0007``...); returns their keys."""
    keys = set()
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(start, start + n):
            (root / cls / f"{i:04d}.{ext}").write_bytes(f"{cls}-{i}-".encode() * 7)
            keys.add(f"{cls}/{i:04d}")
    return keys


def read_all(url, **kw) -> dict[str, bytes]:
    """Every sample of the dataset at ``url`` (key -> bytes), checking none comes twice."""
    out: dict[str, bytes] = {}
    for sample in ss.ShardDataset(str(url), shuffle=False, decode=None, **kw):
        assert sample["__key__"] not in out
        out[sample["__key__"]] = bytes(sample["txt"])
    return out


def pack_quiet(src, dest, **kw):
    return ss.pack(str(src), str(dest), samples_per_shard=3, progress=False, workers=1, **kw)


@pytest.fixture
def sources(tmp_path):
    keys = {}
    for name, start, n in (("one", 0, 6), ("two", 100, 2), ("three", 200, 3)):
        keys[name] = text_folder(tmp_path / name, n, start)
    return tmp_path, keys


def test_append_adds_a_version_and_every_earlier_version_reads_as_before(sources):
    root, keys = sources
    dest = root / "ds"
    first = pack_quiet(root / "one", dest)
    before = read_all(dest)
    second = pack_quiet(root / "two", dest, append=True)
    assert (first.manifest.version, second.manifest.version) == (1, 2)
    assert second.manifest.num_samples == len(keys["one"]) + len(keys["two"])
    assert second.manifest.paths[: first.manifest.num_shards] == first.manifest.paths
    assert list(second.manifest.sha256[: first.manifest.num_shards]) == list(first.manifest.sha256)
    latest = read_all(dest)
    assert set(latest) == keys["one"] | keys["two"]
    assert {k: latest[k] for k in before} == before
    # version 1 is still there, byte for byte the same dataset
    assert read_all(dest, version=1) == before
    assert load_manifest(str(dest), version=1).fingerprint == first.manifest.fingerprint
    assert load_manifest(str(dest)).fingerprint == second.manifest.fingerprint
    assert verify(str(dest)).ok
    assert [e.version for e in history(dataset_store(str(dest)))] == [1, 2]


def test_an_append_s_summary_says_what_it_added_then_the_version_it_made(sources):
    root, _ = sources
    dest = root / "ds"
    first = pack_quiet(root / "one", dest)  # 12 samples in 4 shards
    assert first.summary().startswith("packed 12 samples into 4 tar shards, ")
    second = pack_quiet(root / "two", dest, append=True)  # 4 more, in 2 shards
    added = sum(int(n) for n in second.manifest.nbytes[4:])
    summary = second.summary()
    assert summary.startswith(
        f"appended 4 samples in 2 tar shards, {ss.sizes.format_size(added)} (from "
    ), summary
    assert summary.endswith(
        f" -> {second.url} (version 2: 16 samples in 6 shards, "
        f"{ss.sizes.format_size(second.nbytes)}); layout files"
    ), summary
    third = ss.pack(
        [0, 1, 2], str(dest), fn=lambda i: {"__key__": f"fn/{i}", "txt": "x"}, append=True,
        progress=False, workers=1,
    )  # fmt: skip
    assert third.summary().startswith("appended 3 samples in 1 tar shard, ")
    assert "(version 3: 19 samples in 7 shards, " in third.summary()


def test_append_of_other_data_is_a_one_line_error_and_leaves_the_dataset_as_it_was(sources):
    root, _ = sources
    dest = root / "ds"
    pack_quiet(root / "one", dest)
    names = folder_files(dest)
    other = root / "other"
    text_folder(other, 2, ext="json")
    with pytest.raises(ManifestError, match=r"cannot append to .*: its fields are \['txt'\]"):
        pack_quiet(other, dest, append=True)
    with pytest.raises(ManifestError, match=r"its shards are tar, the new ones arrow"):
        pack_quiet(root / "two", dest, append=True, format="arrow")
    # version 1's file, and the claim of the failed runs (the next run's to clear): no shard of theirs
    assert folder_files(dest, claim=False) == sorted([*names, version_name(1)])
    assert load_manifest(str(dest)).version == 1
    with pytest.raises(UsageError, match="pass one of them, not both"):
        pack_quiet(root / "two", dest, append=True, overwrite=True)


def test_shardwriter_appends_and_an_append_to_nothing_packs_version_one(tmp_path):
    url = str(tmp_path / "w")
    with ss.ShardWriter(url, samples_per_shard=2, append=True) as w:
        w.write({"__key__": "x0", "txt": b"0"})
    with ss.ShardWriter(url, samples_per_shard=2, append=True) as w:
        w.write({"__key__": "x1", "txt": b"1"})
    assert w.manifest.version == 2 and w.manifest.num_samples == 2
    assert read_all(url) == {"x0": b"0", "x1": b"1"}
    assert read_all(url, version=1) == {"x0": b"0"}


def test_a_dataset_packed_before_versions_is_version_1_and_stays_readable_after_an_append(
    sources,
):
    root, keys = sources
    dest = root / "ds"
    first = pack_quiet(root / "one", dest)
    # as shardstream 0.5.0 wrote it: no version key, no version files
    doc = json.loads((dest / MANIFEST_NAME).read_bytes())
    assert "version" not in doc and not [n for n in folder_files(dest) if "versions" in n]
    head = (dest / MANIFEST_NAME).read_bytes()
    pack_quiet(root / "two", dest, append=True)
    assert (dest / version_name(1)).read_bytes() == head
    assert load_manifest(str(dest), version=1).fingerprint == first.manifest.fingerprint
    with pytest.raises(ManifestError, match=r"has no version 7 \(its versions: 1, 2\)"):
        load_manifest(str(dest), version=7)


def test_a_reader_pinned_to_a_version_reads_it_through_a_publish_and_resumes_on_it(sources):
    root, keys = sources
    dest = root / "ds"
    pack_quiet(root / "one", dest)
    ds = ss.ShardDataset(str(dest), shuffle=True, seed=3, decode=None)
    loader = ds.loader(batch_size=2, num_workers=0)
    it = iter(loader)
    seen = [k for _ in range(2) for k in next(it)["__key__"]]
    state = loader.state_dict()
    assert '"dataset_version": 1' in json.dumps(state)
    pack_quiet(root / "two", dest, append=True)  # version 2 is published mid-epoch
    seen += [k for batch in it for k in batch["__key__"]]
    assert sorted(seen) == sorted(keys["one"])  # the epoch read version 1, exactly once each
    # the resume state is version 1's: the latest refuses it, naming the version; version=1 resumes it
    latest = ss.ShardDataset(str(dest), shuffle=True, seed=3, decode=None).loader(batch_size=2)
    with pytest.raises(
        ShardstreamError, match=r"dataset version 1 in the state, 2 here .*version=1"
    ):
        latest.load_state_dict(state)
    pinned = ss.ShardDataset(str(dest), shuffle=True, seed=3, decode=None, version=1)
    again = pinned.loader(batch_size=2)
    again.load_state_dict(state)
    rest = [k for batch in again for k in batch["__key__"]]
    assert sorted(seen[:4] + rest) == sorted(keys["one"])


@pytest.mark.parametrize("workers", [0, 2])
def test_on_new_version_next_epoch_resumes_on_the_state_s_version_then_moves_to_the_latest(
    sources, workers
):
    root, keys = sources
    dest = root / "ds"
    pack_quiet(root / "one", dest)
    kw = {"shuffle": True, "seed": 3, "decode": None}
    loader = ss.ShardDataset(str(dest), **kw).loader(batch_size=2, num_workers=0)
    it = iter(loader)
    first = [k for _ in range(2) for k in next(it)["__key__"]]
    state = loader.state_dict()  # mid-epoch 0, on version 1
    v1_rest = [k for batch in it for k in batch["__key__"]]  # what version 1 reads after the state
    pack_quiet(root / "two", dest, append=True)  # version 2
    assert load_manifest(str(dest)).version == 2
    ds = ss.ShardDataset(str(dest), on_new_version="next_epoch", **kw)
    assert ds.manifest.version == 2  # opened on the latest
    resumed = ds.loader(batch_size=2, num_workers=workers)
    resumed.load_state_dict(state)
    assert ds.manifest.version == 1  # the rest of the state's epoch: its version
    rest = [k for batch in resumed for k in batch["__key__"]]
    assert rest == v1_rest  # exactly version 1's remainder, in its order
    assert sorted(first + rest) == sorted(keys["one"])
    # the next epoch starts on the latest (checked as its first pass starts): version 2, each once
    assert ds.epoch == 1
    nxt = [k for batch in resumed for k in batch["__key__"]]
    assert ds.manifest.version == 2
    assert len(nxt) == len(set(nxt)) and set(nxt) == keys["one"] | keys["two"]
    # a third version at the next boundary, read by the same (persistent) workers
    pack_quiet(root / "three", dest, append=True)
    third = [k for batch in resumed for k in batch["__key__"]]
    assert sorted(third) == sorted(keys["one"] | keys["two"] | keys["three"])
    # a state taken at an epoch's start starts that epoch on the latest
    fresh = ss.ShardDataset(str(dest), on_new_version="next_epoch", version=1, **kw)
    assert fresh.manifest.version == 1
    boundary = fresh.loader(batch_size=2)
    boundary.load_state_dict(fresh.state_dict())
    assert fresh.manifest.version == 3
    # without the option: the latest refuses the state; pinned to version 1 it stays on version 1
    with pytest.raises(ShardstreamError, match="dataset version 1 in the state, 3 here"):
        ss.ShardDataset(str(dest), **kw).loader(batch_size=2).load_state_dict(state)
    pinned = ss.ShardDataset(str(dest), version=1, **kw)
    stays = pinned.loader(batch_size=2, num_workers=workers)
    stays.load_state_dict(state)
    assert [k for batch in stays for k in batch["__key__"]] == v1_rest
    assert sorted(k for batch in stays for k in batch["__key__"]) == sorted(keys["one"])
    with pytest.raises(ValueError, match="on_new_version must be"):
        ss.ShardDataset(str(dest), on_new_version="latest")


def test_gc_keeps_every_file_of_the_kept_versions_and_dry_runs_by_default(sources):
    root, keys = sources
    dest = root / "ds"
    first = pack_quiet(root / "one", dest)
    pack_quiet(root / "two", dest, append=True)
    pack_quiet(root / "three", dest, append=True)
    stray = dest / "shard-000000-0123456789abcdef.tar"  # what a crashed run left
    stray.write_bytes(b"x")
    store = dataset_store(str(dest))
    files = folder_bytes(dest)
    dry = collect(store, keep=2)
    assert (dry.versions, dry.files, dry.deleted) == ([1], [stray.name], False)
    assert folder_bytes(dest) == files
    done = collect(store, keep=2, delete=True)
    assert done.deleted and not stray.exists()
    for version in (2, 3):
        assert read_all(dest, version=version)
    assert verify(str(dest)).ok
    assert set(read_all(dest)) == keys["one"] | keys["two"] | keys["three"]
    with pytest.raises(ManifestError, match="has no version 1"):
        load_manifest(str(dest), version=1)
    # version 1's shards are version 2's too: none was removed
    assert all((dest / p).exists() for p in first.manifest.paths)
    with pytest.raises(ShardstreamError, match="--keep must be 1 or more"):
        collect(store, keep=0)


def test_publishing_a_version_is_exclusive(tmp_path):
    store = Store(str(tmp_path / "ds"))
    store.makedirs()
    m = ss.Manifest("tar", ["s.tar"], [1], [1], [""], version=2)
    write_manifest(store, ss.Manifest("tar", ["s.tar"], [1], [1], [""]))
    commit_version(store, m.to_json(), 2)
    with pytest.raises(WriteConflict, match="already exists"):
        commit_version(store, m.to_json(), 2)
    assert load_manifest(store).version == 2


def _append_in_child(src: Path, dest: Path, out: Path) -> int:
    """Fork a process that appends ``src`` to ``dest`` and writes "ok" or its error to ``out``."""
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        code = 0
        try:
            pack_quiet(src, dest, append=True)
            out.write_text("ok")
        except DestinationLost as exc:
            out.write_text(f"lost: {exc}")
        except BaseException as exc:  # reported to the parent
            out.write_text(f"error: {type(exc).__name__}: {exc}")
            code = 1
        os._exit(code)
    return pid


def test_kill_9_at_random_points_of_an_append_leaves_the_last_version_and_a_rerun_completes(
    sources,
):
    root, keys = sources
    dest = root / "ds"
    pack_quiet(root / "one", dest)
    before = read_all(dest)
    started = time.perf_counter()
    pack_quiet(root / "two", dest, append=True)
    took = time.perf_counter() - started
    expected = set(before) | keys["two"]
    rng = random.Random(7)
    published = 0
    for trial in range(24):
        version = load_manifest(str(dest)).version
        new = text_folder(root / f"k{trial}", 2, 1000 + 10 * trial)
        pid = _append_in_child(root / f"k{trial}", dest, root / f"out{trial}")
        time.sleep(rng.uniform(0, 1.5 * took))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        latest = load_manifest(str(dest))
        assert latest.version in (version, version + 1)
        assert verify(str(dest)).ok
        got = set(read_all(dest))
        if latest.version == version + 1:  # the child had published before the kill
            published += 1
        else:  # a re-run completes
            assert got == expected
            pack_quiet(root / f"k{trial}", dest, append=True)
            assert load_manifest(str(dest)).version == version + 1
        expected |= new
        assert set(read_all(dest)) == expected
        # every earlier version still reads whole
        assert set(read_all(dest, version=1)) == set(before)
    print(f"kill -9 trials: {published} of 24 had published, {24 - published} had not")
    assert verify(str(dest)).ok
    # the re-runs removed what the killed runs left: nothing is left that no version names
    assert collect(dataset_store(str(dest)), keep=10**6).files == []
    assert set(read_all(dest)) == expected


def test_two_appends_at_once_land_as_successive_versions_or_one_fails_cleanly(sources):
    root, keys = sources
    dest = root / "ds"
    pack_quiet(root / "one", dest)
    for trial in range(6):
        base = load_manifest(str(dest))
        outs = [root / f"race{trial}-{i}" for i in range(2)]
        names = [f"r{trial}-{i}" for i in range(2)]
        new = [
            text_folder(root / name, 2, 2000 + 10 * (2 * trial + i)) for i, name in enumerate(names)
        ]
        pids = [_append_in_child(root / name, dest, out) for name, out in zip(names, outs)]
        for pid in pids:
            os.waitpid(pid, 0)
        results = [out.read_text() for out in outs]
        assert all(r == "ok" or r.startswith("lost: ") for r in results), results
        latest = load_manifest(str(dest))
        landed = sum(r == "ok" for r in results)
        assert latest.version == base.version + landed
        assert verify(str(dest)).ok
        # no lost update: every append that said ok is in the latest version, each sample once
        got = set(read_all(dest))
        assert len(got) == latest.num_samples
        for added, result in zip(new, results):
            assert (added <= got) == (result == "ok")
        # retrying the one that failed succeeds
        for name, added, result in zip(names, new, results):
            if result != "ok":
                assert "run it again" in result or "claimed by another pack" in result
                pack_quiet(root / name, dest, append=True)
                assert added <= set(read_all(dest))


def test_a_publish_cut_short_before_the_head_moved_is_followed_by_readers_and_writers(sources):
    root, keys = sources
    dest = root / "ds"
    pack_quiet(root / "one", dest)
    pack_quiet(root / "two", dest, append=True)
    store = dataset_store(str(dest))
    # as if the writer of version 2 died between its version file and _manifest.json
    head_v1 = (dest / version_name(1)).read_bytes()
    (dest / MANIFEST_NAME).write_bytes(head_v1)
    assert load_manifest(store).version == 2  # readers follow the newer version file
    assert set(read_all(dest)) == keys["one"] | keys["two"]
    third = pack_quiet(root / "three", dest, append=True)  # and a writer builds on it
    assert third.manifest.version == 3
    assert json.loads((dest / MANIFEST_NAME).read_bytes())["version"] == 3
    assert set(read_all(dest)) == keys["one"] | keys["two"] | keys["three"]


def test_a_version_is_not_published_over_a_head_of_its_number_written_without_its_file(tmp_path):
    """A head written in place (``write_manifest``, an older shardstream's ``--overwrite``) that says version 2:
    a writer whose exclusive create of version 2's file succeeds would otherwise stop moving the head and
    report success, its version hidden behind the head's."""
    store = Store(str(tmp_path / "ds"))
    store.makedirs()
    write_manifest(store, ss.Manifest("tar", ["theirs.tar"], [1], [1], [""], version=2))
    mine = ss.Manifest("tar", ["mine.tar"], [1], [1], [""], version=2).to_json()
    with pytest.raises(WriteConflict, match="was replaced by another writer"):
        commit_version(store, mine, 2)
    assert not store.exists(version_name(2))  # removed again: no reader follows it
    assert load_manifest(store).paths == ["theirs.tar"]
