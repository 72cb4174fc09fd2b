"""Issue 10 (trust), the dataset's part: no stale or short bytes from mapped shard files, resume
states that refuse another order, no hang after fork, bounded reader caches, checked arguments."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from shardstream.dataset import ShardDataset
from shardstream.dataset.shards import mapped
from shardstream.dataset.shards.mapped import MappedBytes, file_identity
from shardstream.dataset.shards.readers import OpenShards
from shardstream.errors import CorruptShardError, ShardstreamError
from shardstream.packing.writer import ShardWriter
from tests.sample_datasets import key_of, write_dataset

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def write(url: Path, value: bytes, n: int = 3, overwrite: bool = False) -> None:
    with ShardWriter(str(url), samples_per_shard=100, overwrite=overwrite) as w:
        for i in range(n):
            w.write({"__key__": f"k{i}", "bin": value})


def first_batch(url: Path, num_workers: int = 0) -> dict:
    ds = ShardDataset(str(url), decode=None, shuffle=False)
    return next(iter(ds.loader(batch_size=3, num_workers=num_workers)))


def mapped_paths() -> set[str]:
    """Files this process maps that were deleted (their disk space is held while mapped)."""
    with open("/proc/self/maps") as f:
        return {
            line.split(None, 5)[-1].strip() for line in f if line.rstrip().endswith("(deleted)")
        }


# -- 2: mapped shard files --------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_repacked_dataset_is_read_anew_in_the_same_process(tmp_path, num_workers):
    url = tmp_path / "ds"
    write(url, b"A" * 10)
    batch = first_batch(url)
    # the old file is mapped now
    assert isinstance(batch["bin"], MappedBytes) and batch["bin"][0] == b"A" * 10
    del batch
    write(url, b"B" * 3000, overwrite=True)
    batch = first_batch(url, num_workers)
    assert list(batch["bin"]) == [b"B" * 3000] * 3


def test_a_batch_whose_file_was_replaced_since_it_was_read_is_refused(tmp_path):
    url = tmp_path / "ds"
    write(url, b"A" * 10)
    ds = ShardDataset(str(url), decode=None, shuffle=False)
    shards = ds.open_shards()
    reader = shards.get(0)
    assert reader.identity == file_identity(ds.store.path(ds.manifest.paths[0]))
    _, fields = reader.locate(0)
    path = ds.store.path(ds.manifest.paths[0])
    located = MappedBytes(
        [path],
        np.zeros(1, np.int32),
        np.array([fields["bin"][0]]),
        np.array([fields["bin"][1]]),
        [reader.identity],
    )
    # same sizes, other bytes (under other names: the old file is removed)
    write(url, b"B" * 10, overwrite=True)
    with pytest.raises(CorruptShardError, match="replaced or changed|is gone"):
        located[0]


def test_a_value_past_the_end_of_its_file_is_an_error_not_short_bytes(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(b"x" * 100)
    located = MappedBytes([str(path)], np.zeros(2, np.int32), np.array([0, 90]), np.array([10, 20]))
    assert located[0] == b"x" * 10
    with pytest.raises(CorruptShardError, match="past the file's end"):
        located[1]


def test_a_batch_whose_file_is_gone_is_a_named_error(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(b"x" * 100)
    located = MappedBytes([str(path)], np.zeros(1, np.int32), np.array([0]), np.array([10]))
    path.unlink()
    with pytest.raises(CorruptShardError, match="shard.tar: the shard file is gone"):
        located[0]


def test_maps_of_deleted_and_replaced_shards_are_let_go(tmp_path):
    url = tmp_path / "ds"
    write(url, b"A" * 10)
    batch = first_batch(url)
    assert batch["bin"][0] == b"A" * 10
    del batch
    gc.collect()
    (old,) = [p for p in mapped._MAPS if p.startswith(str(url))]
    # the mapped file is replaced: deleted, its space held by the map
    write(url, b"B" * 10, overwrite=True)
    assert any(p.startswith(old) for p in mapped_paths())
    ShardDataset(str(url), decode=None)  # a new dataset lets go of what was replaced
    gc.collect()
    assert not any(p.startswith(old) for p in mapped_paths())


def test_a_shard_replaced_while_it_is_opened_is_refused(tmp_path, monkeypatch):
    url = tmp_path / "ds"
    write(url, b"A" * 10)
    ds = ShardDataset(str(url), decode=None, shuffle=False)
    shards = OpenShards(ds.store, ds.manifest)
    fetch = shards.fetcher.fetch

    def replacing(shard):
        data = fetch(shard)
        write(url, b"B" * 10, overwrite=True)
        return data

    monkeypatch.setattr(shards.fetcher, "fetch", replacing)
    with pytest.raises(CorruptShardError, match="replaced while it was opened"):
        shards.get(0)


# -- 12: resume states ------------------------------------------------------------------------------


COUNTS = [30, 10, 40, 20]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("resume"), COUNTS)


def saved(url: str, **kwargs) -> dict:
    ds = ShardDataset(url, decode=None, seed=5, **kwargs)
    loader = ds.loader(batch_size=4, num_workers=0)
    it = iter(loader)
    next(it)
    return loader.state_dict()


@pytest.mark.parametrize(
    ("saved_with", "loaded_with", "named"),
    [
        ({"shuffle": True}, {"shuffle": False}, "shuffle=True in the state"),
        ({"shuffle_window": 16}, {"shuffle_window": 32}, "shuffle_window=16 in the state, 32 here"),
        ({}, {"shuffle_window": 0}, "shuffle_window="),
    ],
)
def test_a_state_saved_with_another_order_is_refused_naming_the_setting(
    url, saved_with, loaded_with, named
):
    state = saved(url, **saved_with)
    ds = ShardDataset(url, decode=None, seed=5, **loaded_with)
    with pytest.raises(ShardstreamError, match=named) as caught:
        ds.loader(batch_size=4, num_workers=0).load_state_dict(state)
    assert "\n" not in str(caught.value)


def test_without_shuffle_the_window_orders_nothing_and_is_not_checked(url):
    state = saved(url, shuffle=False, shuffle_window=16)
    ds = ShardDataset(url, decode=None, seed=5, shuffle=False, shuffle_window=64)
    ds.load_state_dict(state)
    assert ds.remaining() == sum(COUNTS) - 4


def test_a_repacked_dataset_with_the_same_total_is_refused(tmp_path):
    url = write_dataset(tmp_path, COUNTS, name="a")
    state = saved(url)
    other = write_dataset(tmp_path, [50, 50], name="b")  # the same 100 samples in other shards
    with pytest.raises(ShardstreamError, match="fingerprint .* re-packed"):
        ShardDataset(other, decode=None, seed=5).load_state_dict(state)


def test_an_identical_repack_keeps_its_states(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    import shardstream as ss

    ss.pack(str(src), str(tmp_path / "ds"), samples_per_shard=7, workers=1, progress=False)
    state = saved(str(tmp_path / "ds"))
    # other creation info
    ss.pack(
        str(src),
        str(tmp_path / "ds"),
        samples_per_shard=7,
        workers=1,
        overwrite=True,
        progress=False,
    )
    ds = ShardDataset(str(tmp_path / "ds"), decode=None, seed=5)
    ds.load_state_dict(state)
    assert ds.remaining() == 26


def test_a_state_of_release_0_2_0_still_loads(url):
    state = saved(url)
    old = {k: v for k, v in state.items() if k not in ("shuffle", "window", "fingerprint")}
    # unknown in the old state: not checked
    ds = ShardDataset(url, decode=None, seed=5, shuffle=False)
    ds.load_state_dict(old)
    assert ds.remaining() == sum(COUNTS) - 4


@pytest.mark.parametrize(
    "bad", [{"segment": [[0, 10**9]]}, {"consumed": -1}, {"world_size": 0}, {"segment": "x"}]
)
def test_a_malformed_state_is_a_one_line_error(url, bad):
    state = {**saved(url), **bad}
    with pytest.raises(ShardstreamError, match="state_dict"):
        ShardDataset(url, decode=None, seed=5).load_state_dict(state)


# -- 13: fork ---------------------------------------------------------------------------------------


def test_a_dataset_made_in_a_forked_child_does_not_hang(url):
    script = textwrap.dedent(f"""
        import multiprocessing as mp
        from shardstream import ShardDataset

        def read(_):
            ds = ShardDataset({url!r}, decode=None, batch_size=4)
            return len(next(iter(ds))["__key__"])

        if __name__ == "__main__":
            assert read(0) == 4  # the parent has a dataset, and has read from it
            with mp.get_context("fork").Pool(2) as pool:
                print(pool.map(read, range(2)), flush=True)
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[4, 4]"


# -- 15: shuffle window, loader arguments, reader caches ------------------------------------------


def test_shuffle_window_0_permutes_shards_and_keeps_samples_in_order(url):
    ds = ShardDataset(url, decode=None, seed=3, shuffle_window=0)
    assert ds.window == 1
    got = [s["__key__"] for s in ds]
    starts = np.concatenate([[0], np.cumsum(COUNTS)[:-1]])
    runs = [[key_of(int(a) + i) for i in range(n)] for a, n in zip(starts, COUNTS)]
    assert sorted(got) == sorted(k for r in runs for k in r)
    pieces = []
    at = 0
    while at < len(got):
        (run,) = [r for r in runs if r[0] == got[at]]
        assert got[at : at + len(run)] == run
        pieces.append(run)
        at += len(run)
    assert pieces != runs  # shards are still permuted (seed 3)


@pytest.mark.parametrize("window", [-1, 2.5, "8", True])
def test_a_nonsensical_shuffle_window_is_refused(url, window):
    with pytest.raises(ValueError, match="shuffle_window"):
        ShardDataset(url, shuffle_window=window)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"drop_last": True}, "drop_last"),
        ({"drop_last": False}, "drop_last"),
        ({"in_order": False}, "in_order"),
    ],
)
def test_the_loader_refuses_arguments_that_break_order_or_length(url, kwargs, named):
    ds = ShardDataset(url, decode=None)
    with pytest.raises(ValueError, match=named):
        ds.loader(batch_size=4, num_workers=0, **kwargs)
    # the dataset is still free
    assert len(list(ds.loader(batch_size=4, num_workers=0, in_order=True))) == 25


def count_loads(monkeypatch) -> list[int]:
    loads: list[int] = []
    load = OpenShards._load

    def counting(self, shard):
        loads.append(shard)
        return load(self, shard)

    monkeypatch.setattr(OpenShards, "_load", counting)
    return loads


def test_a_window_wider_than_sixteen_shards_opens_each_shard_once(tmp_path, monkeypatch):
    url = write_dataset(tmp_path, [5] * 40)
    ds = ShardDataset(url, decode=None, shuffle_window=200, seed=1)
    loads = count_loads(monkeypatch)
    assert len([s["__key__"] for s in ds]) == 200
    assert sorted(loads) == list(range(40))


def test_local_compressed_shards_are_let_go_once_the_plan_has_passed_them(tmp_path, monkeypatch):
    url = write_dataset(tmp_path, [10] * 40, compression="zstd")
    ds = ShardDataset(url, decode=None, shuffle_window=20, seed=2)
    loads = count_loads(monkeypatch)
    most = 0
    for _ in ds:
        most = max(most, len(ds.open_shards()._open))
    assert sorted(loads) == list(range(40))  # none decompressed twice
    assert most <= 8  # a window spans at most 4 of these shards: 2 windows ahead, not 16 shards


def test_decompressed_shards_are_bounded_by_bytes_but_those_the_plan_needs_stay(tmp_path):
    url = write_dataset(tmp_path, [10] * 6, compression="zstd")
    ds = ShardDataset(url, decode=None)
    shards = OpenShards(ds.store, ds.manifest, max_owned=1)
    for s in range(4):
        shards.get(s)
    assert list(shards._open) == [3]  # over the limit: only the one in use stays
    shards.retain({3, 4, 5})
    for s in (4, 5, 0):
        shards.get(s)
    assert sorted(shards._open) == [0, 3, 4, 5] and shards.owned > 1


# -- local checksums -------------------------------------------------------------------------------


def test_verify_checksums_reaches_the_fetcher_and_holds_still_under_a_loader(url):
    ds = ShardDataset(url, decode=None)
    assert ds.open_shards().fetcher.verify_local is False
    ds.verify_checksums = True  # no loader yet: settable, and the next pass uses it
    assert ds.open_shards().fetcher.verify_local is True
    assert (
        ShardDataset(url, decode=None, verify_checksums=True).open_shards().fetcher.verify_local
        is True
    )
    loader = ds.loader(batch_size=4, num_workers=0)
    with pytest.raises(ShardstreamError, match="verify_checksums"):
        ds.verify_checksums = False
    del loader


def test_verify_checksums_refuses_a_local_shard_with_other_bytes(tmp_path):
    url = write_dataset(tmp_path, [4, 4])
    ds = ShardDataset(url, decode=None, shuffle=False)
    path = Path(ds.store.path(ds.manifest.paths[0]))
    data = bytearray(path.read_bytes())
    at = data.index(b"text 1")
    data[at : at + 6] = b"TEXT 1"  # same size, other payload
    path.write_bytes(bytes(data))
    # by default the value is checked against its checksum in the sample index as it is read
    with pytest.raises(CorruptShardError, match=r"sample 's0001' .*: field 'txt' differs"):
        list(ShardDataset(url, decode=None, shuffle=False))
    # verify_checksums: the whole shard's sha256 first, once per host
    with pytest.raises(CorruptShardError, match="sha256 differs from the manifest's"):
        list(ShardDataset(url, decode=None, shuffle=False, verify_checksums=True))


def test_the_default_window_over_remote_shards_is_bounded_by_bytes():
    """A remote epoch's first batch waits for its window's shards: at most 1 GiB of them (four at least)."""
    import numpy as np

    from shardstream.dataset.state import REMOTE_WINDOW_BYTES, resolve_window

    counts = np.full(1000, 2_000, dtype=np.int64)  # 256 MB shards of 2,000 samples
    nbytes = np.full(1000, 256 << 20, dtype=np.int64)
    local = resolve_window(None, counts, nbytes, remote=False)
    remote = resolve_window(None, counts, nbytes, remote=True)
    assert local >= 60 * 2_000  # many shards mixed: random access into mapped files is cheap
    assert 4 * 2_000 <= remote <= max(4 * 2_000, REMOTE_WINDOW_BYTES // (256 << 20) * 2_000 + 2_000)
    # 1 MB shards: the byte cap allows the full width
    small = np.full(1000, 1 << 20, dtype=np.int64)
    assert resolve_window(None, counts, small, remote=True) == local
    assert resolve_window(17, counts, nbytes, remote=True) == 17  # an explicit window is the user's


def test_iterating_a_slice_reads_only_its_own_files(tmp_path):
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(b"hello world")
    second.write_bytes(b"other file")
    values = MappedBytes(
        [str(first), str(second)],
        np.array([0, 0, 1], np.int32),
        np.array([0, 6, 0]),
        np.array([5, 5, 5]),
    )
    part = values.slice(0, 2)
    second.unlink()  # a file only the rest of the batch reads
    assert list(part) == [b"hello", b"world"]
    with pytest.raises(Exception, match="b.bin"):
        list(values)
