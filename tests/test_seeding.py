"""Per-worker, per-epoch seeds: draws inside a transform differ between workers, epochs and ranks,
repeat exactly with the same seed (fork or spawn), and the main process's generators are untouched."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from sample_datasets import write_dataset
from torch.utils.data import get_worker_info

from shardstream import ShardDataset
from shardstream.seeding import seed_worker, worker_seed

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [4, 4, 4, 4]
SEED = 5


def draw(sample: dict) -> dict:
    """A transform that records what an augmentation would draw, and which worker drew it."""
    info = get_worker_info()
    return {**sample, "py": random.random(), "np": float(np.random.rand()), "pt": float(torch.rand(())),
            "worker": -1 if info is None else info.id}


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("seeding"), COUNTS)


def draws(url: str, epochs=(0,), workers: int = 2, seed: int = SEED, **kwargs) -> list[list[tuple]]:
    """Per epoch, each sample's (key, worker, py, np, pt) draws, from one persistent-worker loader."""
    context = kwargs.pop("multiprocessing_context", None)
    ds = ShardDataset(url, seed=seed, transform=draw, decode=None, **kwargs)
    loader = ds.loader(batch_size=2, num_workers=workers, multiprocessing_context=context)
    out = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        out.append([(k, w, p, n, t) for b in loader for k, w, p, n, t in
                    zip(b["__key__"], b["worker"].tolist(), b["py"].tolist(), b["np"].tolist(), b["pt"].tolist())])
    return out


def first_draws(epoch_draws: list[tuple]) -> dict[int, tuple]:
    """Each worker's first (py, np, pt) draws of the pass."""
    found: dict[int, tuple] = {}
    for _, worker, *values in epoch_draws:
        found.setdefault(worker, tuple(values))
    return found


def expected_first(seed: int, epoch: int, rank: int, worker: int) -> tuple:
    """What ``draw`` gives first in a worker seeded by seed_worker."""
    seed_worker(seed, epoch, rank, worker)
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_worker_seed_is_stable_and_distinct():
    assert worker_seed(0, 0, 0, 0) == worker_seed(0, 0, 0, 0) == 8668861027912758289  # pinned: runs stay reproducible
    seeds = {worker_seed(s, e, r, w) for s in (0, 1, 2**40) for e in range(3) for r in range(3) for w in range(4)}
    assert len(seeds) == 3 * 3 * 3 * 4
    assert all(0 <= s < 2**64 for s in seeds)


def test_workers_and_epochs_draw_differently_and_reproducibly(url):
    epoch0, epoch1, epoch0_again = draws(url, epochs=(0, 1, 0))
    workers0 = first_draws(epoch0)
    assert set(workers0) == {0, 1}
    assert workers0[0] != workers0[1]  # every value differs: no two workers crop alike
    assert all(a != b for a, b in zip(workers0[0], workers0[1]))
    assert first_draws(epoch1)[0] != workers0[0]  # and again differently each epoch
    assert epoch0_again == epoch0  # an epoch revisited draws the same (persistent workers are reseeded)
    for worker in (0, 1):
        assert workers0[worker] == pytest.approx(expected_first(SEED, 0, 0, worker), abs=0, rel=1e-7)
    assert first_draws(epoch1)[1] == pytest.approx(expected_first(SEED, 1, 0, 1), abs=0, rel=1e-7)
    values = [v for d in epoch0 for v in d[2:]]
    assert len(set(values)) == len(values)  # no draw repeats within the epoch


def test_the_same_seed_gives_the_same_draws_in_another_run_and_another_seed_does_not(url):
    first = draws(url, epochs=(0, 1))
    assert draws(url, epochs=(0, 1)) == first
    other = draws(url, epochs=(0,), seed=SEED + 1)[0]
    assert first_draws(other)[0] != first_draws(first[0])[0]


def test_ranks_draw_differently(url):
    rank0 = first_draws(draws(url, rank=0, world_size=2)[0])
    rank1 = first_draws(draws(url, rank=1, world_size=2)[0])
    assert rank0[0] != rank1[0] and rank0[1] != rank1[1]
    assert rank1[0] == pytest.approx(expected_first(SEED, 0, 1, 0), abs=0, rel=1e-7)


def test_spawned_workers_draw_what_forked_ones_do(url):
    forked = draws(url, workers=1, multiprocessing_context="fork")[0]
    spawned = draws(url, workers=1, multiprocessing_context="spawn")[0]
    assert spawned == forked


def test_seed_workers_false_leaves_seeding_to_torch(url):
    ds = ShardDataset(url, seed=SEED, transform=draw, decode=None)
    loader = ds.loader(batch_size=2, num_workers=2, seed_workers=False)
    assert ds.seed_workers is False
    got = first_draws([(k, w, p, n, t) for b in loader for k, w, p, n, t in
                       zip(b["__key__"], b["worker"].tolist(), b["py"].tolist(), b["np"].tolist(), b["pt"].tolist())])
    assert got[0] != pytest.approx(expected_first(SEED, 0, 0, 0), abs=0, rel=1e-7)
    assert got[0] != got[1]  # torch's own per-worker seeds still differ


def rng_states() -> tuple:
    return random.getstate(), np.random.get_state()[1].tobytes(), torch.get_rng_state()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_main_process_generators_are_untouched(url, workers):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    before = rng_states()
    ds = ShardDataset(url, seed=SEED, decode=None)
    loader = ds.loader(batch_size=2, num_workers=workers)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert sum(len(b["__key__"]) for b in loader) == 16
    after = rng_states()
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def test_without_workers_a_transform_draws_from_the_main_process_generators(url):
    ds = ShardDataset(url, seed=SEED, transform=draw, decode=None, shuffle=False)
    loader = ds.loader(batch_size=2, num_workers=0)
    random.seed(3)
    expected = [random.random() for _ in range(16)]
    random.seed(3)
    assert [v for b in loader for v in b["py"].tolist()] == expected  # not reseeded: the user's own stream
