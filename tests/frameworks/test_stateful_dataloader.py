"""torchdata's StatefulDataLoader over a ShardDataset: the dataset-level state_dict it calls in the
main process and in each worker resumes mid-epoch exactly, also for ranks restored from rank 0's state."""

from __future__ import annotations

from collections import Counter

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.dataset import ShardDataset
from shardstream.errors import ShardstreamError
from tests.sample_datasets import key_of, write_dataset

pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create", "ignore:'set_vital' is deprecated"
)

COUNTS = [16, 16, 16, 16, 16, 16]  # 96 samples
N = sum(COUNTS)
B = 8


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(
        tmp_path_factory.mktemp("sdl"), COUNTS, make=lambda i: {"__key__": key_of(i), "cls": i}
    )


def make(url: str, **kwargs) -> ShardDataset:
    return ShardDataset(url, seed=3, decode=None, **kwargs)


def keys(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def take(it, k: int) -> list[str]:
    return keys(next(it) for _ in range(k))


def assert_exactly_once(seen: list[str], n: int = N) -> None:
    counts = Counter(seen)
    assert sorted(counts) == [key_of(i) for i in range(n)], "missing samples"
    assert max(counts.values()) == 1, f"repeated: {[k for k, c in counts.items() if c > 1][:8]}"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mid_epoch_state_resumes_exactly(url, workers):
    dl = StatefulDataLoader(make(url), batch_size=B, num_workers=workers)
    it = iter(dl)
    first = take(it, 5)
    state = dl.state_dict()
    del it, dl
    again = StatefulDataLoader(make(url), batch_size=B, num_workers=workers)
    again.load_state_dict(state)
    assert len(again) == N // B  # torch's convention: the whole epoch
    assert_exactly_once(first + keys(again))


def test_a_state_after_the_last_batch_resumes_the_next_epoch_whole(url):
    dl = StatefulDataLoader(make(url), batch_size=B, num_workers=2, persistent_workers=True)
    epoch0 = keys(dl)
    assert_exactly_once(epoch0)
    state = dl.state_dict()
    again = StatefulDataLoader(make(url), batch_size=B, num_workers=2, persistent_workers=True)
    again.load_state_dict(state)
    epoch1 = keys(again)
    assert_exactly_once(epoch1)
    assert epoch1 != epoch0  # the next epoch's order, not epoch 0 again
    ds = make(url)
    ds.set_epoch(1)
    assert epoch1 == keys(StatefulDataLoader(ds, batch_size=B, num_workers=2))


def test_both_ranks_resume_from_rank_0s_state(url):
    seen, states = [], []
    for rank in (0, 1):
        dl = StatefulDataLoader(make(url, rank=rank, world_size=2), batch_size=B, num_workers=2)
        it = iter(dl)
        seen += take(it, 3)
        states.append(dl.state_dict())
        del it, dl
    for rank in (0, 1):  # a checkpoint holds rank 0's state only (Lightning, accelerate)
        dl = StatefulDataLoader(make(url, rank=rank, world_size=2), batch_size=B, num_workers=2)
        dl.load_state_dict(states[0])
        seen += keys(dl)
    assert_exactly_once(seen)


def test_a_worker_state_refuses_another_worker_count(url):
    dl = StatefulDataLoader(make(url), batch_size=B, num_workers=2)
    it = iter(dl)
    take(it, 3)
    worker_state = dl.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    del it, dl
    with pytest.raises(ShardstreamError, match="one DataLoader worker's state"):
        make(url).load_state_dict(worker_state)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dataset_a_shardloader_reads_refuses_another_dataloader(url, workers):
    ds = make(url)
    own = ds.loader(batch_size=B, num_workers=1)
    with pytest.raises(ShardstreamError, match="another DataLoader.*Pass the ShardLoader itself"):
        next(iter(StatefulDataLoader(ds, batch_size=None, num_workers=workers)))
    assert len(keys(own)) == N  # the loader itself still reads


def test_spawned_workers_inherit_the_rank_of_a_process_without_rank_in_its_environment(
    url, tmp_path
):
    """Lightning's launcher sets LOCAL_RANK and WORLD_SIZE, not RANK; a spawned DataLoader worker has no
    process group, so it used to fail with "rank is not known yet". It now inherits the rank its
    process had when the worker was started, and the two ranks read the epoch exactly once."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from tests.frameworks.common import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.frameworks.spawn_worker_rank",
                url,
                str(tmp_path / f"{r}.json"),
            ],
            env={**env, "LOCAL_RANK": str(r)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == N // 2
    assert_exactly_once(seen[0] + seen[1])
