"""The default window mixes class-sorted packs (issue 11): batch diversity computed from the plan."""

from __future__ import annotations

import numpy as np
import pytest

from shardstream.plan import EpochOrder, batch_diversity, default_window


def sorted_labels(shards: int = 200, per_shard: int = 100, classes: int = 20):
    labels = np.repeat(np.arange(classes), shards * per_shard // classes)
    return [per_shard] * shards, np.split(labels, shards)


def test_the_default_window_gives_class_sorted_packs_iid_diversity():
    counts, labels = sorted_labels()
    default = EpochOrder.create(counts, seed=3, window=default_window(counts))
    seen, iid = batch_diversity(default, labels, 128)
    assert seen >= 0.9 * iid
    # 0.2.0's default: about four shards
    old = EpochOrder.create(counts, seed=3, window=max(1024, 4 * 100))
    seen_old, _ = batch_diversity(old, labels, 128)
    assert seen_old < 0.5 * iid


def test_default_window_spans_many_shards_within_the_bounds_and_balances_the_tail():
    assert default_window([200] * 7) >= 1347  # a small dataset: one window, the whole epoch
    counts = [2300] * 556  # ImageNet in 256 MB shards
    window = default_window(counts)
    assert 60 * 2300 <= window <= 64 * 2300
    total = sum(counts)
    # no short tail window
    assert total % window == 0 or total % window >= window - total // window - 1
    budget = default_window(counts, nbytes=[256 << 20] * 556, max_bytes=4 << 30)
    assert budget <= 16 * 2300
    assert default_window([10**6] * 10) <= 1 << 20


def test_batch_diversity_checks_its_input():
    order = EpochOrder.create([3, 3], seed=1)
    with pytest.raises(ValueError, match="labels cover 5"):
        batch_diversity(order, [np.zeros(3), np.zeros(2)], 2)
    with pytest.raises(ValueError, match="batch_size"):
        batch_diversity(order, [np.zeros(3), np.zeros(3)], 0)
