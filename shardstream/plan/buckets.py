"""A whole epoch of bucketed batches planned up front, from each sample's bucket alone.

When every sample's bucket is known before anything is read (image sizes recorded at pack time), the
epoch's batches are a pure function of the buckets, the seed and the epoch: the samples are shuffled,
grouped by bucket (each bucket's samples in shuffled order), each bucket cut into batches of at most
``batch_size``, and the batches shuffled. This list does not depend on the world size or the number of
workers.

Ranks deal it out: rank ``r`` of ``W`` takes batches ``r, r + W, r + 2W, ...``. To give every rank the
same number of batches the list is made a multiple of ``W`` by halving its largest batches (within their
bucket, :func:`~shardstream.plan.bins.cut_largest`); only where fewer samples are left than ranks
are batches of the epoch's start repeated. A resume state is the batches each rank has consumed (and on what world
size): on any world size the consumed prefix (``consumed × W_saved`` batches of the list as the saving
world size cut it) is left out and the rest dealt anew, so each sample is read exactly once.
"""

from __future__ import annotations

import numpy as np

from .bins import bucket_batches, cut_largest


def epoch_batches(
    buckets: np.ndarray, batch_size: int, seed: int, epoch: int, shuffle: bool = True
) -> list[np.ndarray]:
    """The epoch's batches of sample indices (into ``buckets``), each of one bucket, in the epoch's order."""
    buckets = np.asarray(buckets, dtype=np.int64)
    if not shuffle:
        return bucket_batches(buckets, batch_size)
    words = [
        k % (1 << 64) for k in (seed, epoch, 0x6275636B)
    ]  # "buck": apart from the order's draws
    rng = np.random.default_rng(
        np.random.SeedSequence([w >> s & 0xFFFFFFFF for w in words for s in (0, 32)])
    )
    order = rng.permutation(len(buckets))
    batches = [order[b] for b in bucket_batches(buckets[order], batch_size)]
    return [batches[i] for i in rng.permutation(len(batches)).tolist()]


def equal_shares(batches: list[np.ndarray], world_size: int) -> list[np.ndarray]:
    """``batches`` made a multiple of ``world_size`` long: the largest halved, else the first repeated."""
    if not batches or world_size == 1:
        return list(batches)
    target = -(-len(batches) // world_size) * world_size
    out = cut_largest(batches, target)
    while len(out) % world_size:  # fewer samples than ranks: repeat the first (documented)
        out.append(out[len(out) % max(len(batches), 1)])
    return out


def rank_batches(
    batches: list[np.ndarray],
    world_size: int,
    rank: int,
    consumed: list[tuple[int, int]] | None = None,
) -> list[np.ndarray]:
    """Rank ``rank``'s batches of the epoch, what was ``consumed`` left out: what it reads next, as many
    as every other rank's. ``consumed`` lists, per stretch of the epoch read on one world size, (batches
    each rank read, that world size), in order (one entry per resume on another world size)."""
    rest = list(batches)
    for done, world in consumed or []:
        dealt = equal_shares(rest, world)
        rest = dealt[min(done * world, len(dealt)) :]
    return equal_shares(rest, world_size)[rank::world_size]


__all__ = ["epoch_batches", "equal_shares", "rank_batches"]
