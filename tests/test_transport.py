"""Batches through reused shared-memory arenas: copies out right, reuses, grows, never blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shardstream.transport as transport
from shardstream import ShardDataset, ShardWriter
from shardstream.collate import RaggedBytes, collate
from shardstream.transport import ArenaRef, Receiver, Ring, Shipment


def image_samples(n: int, value: int, size: int = 8) -> list[dict]:
    return [{"__key__": f"k{value}-{i}", "cls": i,
             "jpg": torch.from_numpy(np.full((size, size, 3), value + i, dtype=np.uint8)).permute(2, 0, 1),
             "raw": bytes([value]) * (i + 1)} for i in range(n)]


def send(ring: Ring, samples: list[dict]) -> Shipment:
    with ring.batch() as ship:
        return ship(collate(samples))


def test_a_shipped_batch_holds_only_locations_and_copies_out_equal():
    released = torch.zeros(1, dtype=torch.int64)
    ring, receiver = Ring(released, 0, slots=2), Receiver(released)
    ring._want = 1 << 16
    samples = image_samples(3, 10)
    shipment = send(ring, samples)
    assert isinstance(shipment.batch["jpg"], ArenaRef) and isinstance(shipment.batch["cls"], ArenaRef)
    assert isinstance(shipment.batch["raw"].data, ArenaRef)
    assert len(shipment.new_arenas) == 1
    batch = receiver.receive(shipment)
    expected = collate(samples)
    assert torch.equal(batch["jpg"], expected["jpg"]) and batch["jpg"].is_contiguous(memory_format=torch.channels_last)
    assert batch["cls"].tolist() == [0, 1, 2] and batch["__key__"] == expected["__key__"]
    assert isinstance(batch["raw"], RaggedBytes) and list(batch["raw"]) == [b"\n", b"\n\n", b"\n\n\n"]
    assert int(released[0]) == 1


def test_arenas_are_reused_once_released_and_the_copy_survives_reuse():
    released = torch.zeros(1, dtype=torch.int64)
    ring, receiver = Ring(released, 0, slots=2), Receiver(released)
    ring._want = 1 << 16
    first = receiver.receive(send(ring, image_samples(2, 1)))
    second = receiver.receive(send(ring, image_samples(2, 2)))
    third = send(ring, image_samples(2, 3))  # slot 0 again: the first batch's arena
    assert third.new_arenas == {} and third.batch["jpg"].arena == 1
    receiver.receive(third)
    assert int(first["jpg"][0, 0, 0, 0]) == 1 and int(second["jpg"][0, 0, 0, 0]) == 2  # copies, untouched


def test_a_batch_that_does_not_fit_goes_the_slow_way_and_the_arena_grows():
    released = torch.zeros(1, dtype=torch.int64)
    ring, receiver = Ring(released, 0, slots=2), Receiver(released)
    ring._want = 64
    big = send(ring, image_samples(4, 5, size=32))
    assert isinstance(big.batch["jpg"], torch.Tensor)  # did not fit: PyTorch's own path
    assert torch.equal(receiver.receive(big)["jpg"], collate(image_samples(4, 5, size=32))["jpg"])
    later = send(ring, image_samples(4, 6, size=32))
    assert isinstance(later.batch["jpg"], ArenaRef)  # a bigger arena now


def test_an_unreleased_arena_is_never_overwritten(monkeypatch):
    monkeypatch.setattr(transport, "_WAIT_S", 0.05)
    released = torch.zeros(1, dtype=torch.int64)
    ring, receiver = Ring(released, 0, slots=1), Receiver(released)
    ring._want = 1 << 16
    held = send(ring, image_samples(2, 7))  # never received: the consumer stopped
    again = send(ring, image_samples(2, 8))
    assert again.batch["jpg"].arena != held.batch["jpg"].arena and again.retired == [held.batch["jpg"].arena]
    receiver.receive(Shipment(0, held.seq, {}, held.new_arenas))  # the old arena, never reused, still reads 7
    assert int(receiver._copy_out(held.batch["jpg"], 0)[0, 0, 0, 0]) == 7
    batch = receiver.receive(again)
    assert int(batch["jpg"][1, 0, 0, 0]) == 9 and (0, held.batch["jpg"].arena) not in receiver.arenas


@pytest.fixture
def images(tmp_path):
    url = str(tmp_path / "ds")
    with ShardWriter(url, samples_per_shard=7) as w:
        for i in range(40):
            w.write({"__key__": f"s{i:03d}", "npy": np.full((4, 4, 3), i, dtype=np.uint8), "cls": i})
    return url


def test_the_loader_ships_through_arenas_across_epochs_and_after_an_early_stop(images):
    ds = ShardDataset(images, shuffle=True, seed=3, decode="numpy")
    loader = ds.loader(batch_size=4, num_workers=2)
    assert ds._released is not None
    reference = ShardDataset(images, shuffle=True, seed=3, decode="numpy", batch_size=4)
    for epoch in range(3):
        ds.set_epoch(epoch)
        reference.set_epoch(epoch)
        got = [(b["__key__"], b["npy"].clone(), b["cls"].tolist()) for b in loader]
        want = [(b["__key__"], b["npy"], b["cls"].tolist()) for b in reference]
        assert [g[0] for g in got] == [w[0] for w in want] and [g[2] for g in got] == [w[2] for w in want]
        assert all(torch.equal(g[1], w[1]) for g, w in zip(got, want))
        if epoch == 1:  # stop early: the workers' in-flight batches are never received
            ds.set_epoch(1)
            for i, _ in enumerate(loader):
                if i == 1:
                    break
    assert int(ds._released.sum()) > 0
