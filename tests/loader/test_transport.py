"""Batches through reused shared-memory arenas: copies out right, reuses, grows, never blocks."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import shardstream.loader.transport as transport
from shardstream import ShardDataset, ShardWriter
from shardstream.dataset.batches.collate import MappedBytes, RaggedBytes, collate
from shardstream.loader.transport import ArenaRef, Receiver, Ring, Shipment


def image_samples(n: int, value: int, size: int = 8) -> list[dict]:
    return [
        {
            "__key__": f"k{value}-{i}",
            "cls": i,
            "jpg": torch.from_numpy(np.full((size, size, 3), value + i, dtype=np.uint8)).permute(
                2, 0, 1
            ),
            "raw": bytes([value]) * (i + 1),
        }
        for i in range(n)
    ]


def send(ring: Ring, samples: list[dict]) -> Shipment:
    with ring.batch() as ship:
        return ship(collate(samples))


def test_a_shipped_batch_holds_only_locations_and_arrives_equal():
    released = released_table(2)
    ring, receiver = Ring(released, 0, slots=2), Receiver(released)
    ring._want = 1 << 16
    samples = image_samples(3, 10)
    shipment = send(ring, samples)
    assert isinstance(shipment.batch["jpg"], ArenaRef) and isinstance(
        shipment.batch["cls"], ArenaRef
    )
    assert isinstance(shipment.batch["raw"].data, ArenaRef)
    assert len(shipment.new_arenas) == 1
    batch = receiver.receive(shipment)
    expected = collate(samples)
    assert torch.equal(batch["jpg"], expected["jpg"]) and batch["jpg"].is_contiguous(
        memory_format=torch.channels_last
    )
    assert batch["cls"].tolist() == [0, 1, 2] and batch["__key__"] == expected["__key__"]
    assert isinstance(batch["raw"], RaggedBytes) and list(batch["raw"]) == [
        b"\n",
        b"\n\n",
        b"\n\n\n",
    ]
    assert int(released[0, 0]) == -1  # its tensors are alive: the arena is still held
    del batch
    gc.collect()
    assert int(released[0, 0]) == 0  # let go once the last tensor of the batch is gone


def released_table(slots: int) -> torch.Tensor:
    return torch.full((1, slots), -1, dtype=torch.int64)


def test_an_arena_is_reused_only_after_its_batch_is_gone_and_a_held_one_is_never_overwritten(
    monkeypatch,
):
    monkeypatch.setattr(transport, "_WAIT_S", 0.01)
    released = released_table(2)
    ring, receiver = Ring(released, 0, slots=2), Receiver(released)
    ring._want = 1 << 16
    first = receiver.receive(send(ring, image_samples(2, 1)))
    second = receiver.receive(send(ring, image_samples(2, 2)))
    view = first["jpg"][1]  # a view alone keeps the batch held
    del first
    gc.collect()
    third = send(ring, image_samples(2, 3))  # slot 0: still held through the view, so a new arena
    assert third.batch["jpg"].arena != 1 and 1 not in third.live
    receiver.receive(third)
    assert int(view[0, 0, 0]) == 2 and int(second["jpg"][0, 0, 0, 0]) == 2  # nothing overwritten
    del view, third
    gc.collect()
    fourth = send(ring, image_samples(2, 4))  # slot 1: the second batch, still held
    assert fourth.new_arenas  # a new arena again
    del second
    gc.collect()
    receiver.receive(fourth)
    fifth = send(ring, image_samples(2, 5))  # slot 0 holds the third batch, which is gone now
    assert fifth.new_arenas == {}  # reused


def test_a_batch_that_does_not_fit_goes_the_slow_way_and_the_arena_grows():
    released = released_table(2)
    ring, receiver = Ring(released, 0, slots=2), Receiver(released)
    ring._want = 64
    big = send(ring, image_samples(4, 5, size=32))
    assert isinstance(big.batch["jpg"], torch.Tensor)  # did not fit: PyTorch's own path
    assert torch.equal(receiver.receive(big)["jpg"], collate(image_samples(4, 5, size=32))["jpg"])
    later = send(ring, image_samples(4, 6, size=32))
    assert isinstance(later.batch["jpg"], ArenaRef)  # a bigger arena now


@pytest.fixture
def images(tmp_path):
    url = str(tmp_path / "ds")
    with ShardWriter(url, samples_per_shard=7) as w:
        for i in range(40):
            w.write(
                {"__key__": f"s{i:03d}", "npy": np.full((4, 4, 3), i, dtype=np.uint8), "cls": i}
            )
    return url


def test_the_loader_ships_through_arenas_across_epochs_and_after_an_early_stop(images):
    ds = ShardDataset(images, shuffle=True, seed=3, decode="numpy")
    loader = ds.loader(batch_size=4, num_workers=2)
    assert ds.setup.sender is not None  # the loader gave its dataset a transport
    reference = ShardDataset(images, shuffle=True, seed=3, decode="numpy", batch_size=4)
    for epoch in range(3):
        ds.set_epoch(epoch)
        reference.set_epoch(epoch)
        got = [(b["__key__"], b["npy"].clone(), b["cls"].tolist()) for b in loader]
        # the workers report to the loader's table
        assert ds.setup.sender.args[0] is loader._receiver.released
        want = [(b["__key__"], b["npy"], b["cls"].tolist()) for b in reference]
        assert [g[0] for g in got] == [w[0] for w in want] and [g[2] for g in got] == [
            w[2] for w in want
        ]
        assert all(torch.equal(g[1], w[1]) for g, w in zip(got, want))
        if epoch == 1:  # stop early: the workers' in-flight batches are never received
            ds.set_epoch(1)
            for i, _ in enumerate(loader):
                if i == 1:
                    break
    assert int(loader._receiver.released.max()) > 0


def _keyed(i: int) -> dict:
    return {"__key__": f"s{i:03d}", "npy": np.full((4, 4, 3), i, dtype=np.uint8), "cls": i}


@pytest.fixture
def keyed(tmp_path):
    url = str(tmp_path / "keyed")
    with ShardWriter(url, samples_per_shard=6) as w:
        for i in range(40):
            w.write(_keyed(i))
    return url


def _intact(batch) -> bool:
    wanted = [int(k[1:]) for k in batch["__key__"]]
    return batch["cls"].tolist() == wanted and [int(x[0, 0, 0]) for x in batch["npy"]] == wanted


@pytest.mark.parametrize("persistent", [True, False])
def test_batches_a_user_keeps_stay_intact_across_epochs(keyed, persistent):
    ds = ShardDataset(keyed, seed=1, decode="numpy")
    loader = ds.loader(batch_size=4, num_workers=1, persistent_workers=persistent)
    kept = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        kept += list(loader)  # every batch held: workers must take new arenas, never reuse these
        assert all(_intact(b) for b in kept)


def test_the_main_process_keeps_only_the_workers_live_arenas_after_early_stops(keyed):
    ds = ShardDataset(keyed, seed=1, decode="numpy")
    loader = ds.loader(batch_size=4, num_workers=2)
    for epoch in range(8):
        ds.set_epoch(epoch)
        for i, _ in enumerate(loader):
            if i == 2:
                break
    assert len(loader._receiver.arenas) <= 2 * loader.ring_slots


def test_a_second_live_loader_on_one_dataset_is_refused(keyed):
    from shardstream.errors import ShardstreamError

    ds = ShardDataset(keyed, seed=1, decode="numpy")
    first = ds.loader(batch_size=4, num_workers=0)
    with pytest.raises(ShardstreamError, match="another ShardDataset"):
        ds.loader(batch_size=8, num_workers=0)
    del first
    gc.collect()
    assert len(list(ds.loader(batch_size=8, num_workers=0))) == 5  # the first one is gone: fine


def test_raw_batches_with_a_field_some_samples_lack_cross_from_workers_as_bytes(tmp_path):
    url = str(tmp_path / "ragged")
    with ShardWriter(url, samples_per_shard=5, compression="zstd") as w:
        for i in range(20):
            w.write(
                {"__key__": f"s{i:03d}", "bin": bytes([i]), **({"txt": f"t{i}"} if i != 7 else {})}
            )
    ds = ShardDataset(url, shuffle=False, decode=None)
    batches = list(ds.loader(batch_size=4, num_workers=2, timeout=60))
    assert [k for b in batches for k in b["__key__"]] == [f"s{i:03d}" for i in range(20)]
    texts = [t for b in batches for t in b["txt"]]
    assert (
        texts[7] is None
        and texts[8] == b"t8"
        and all(isinstance(t, bytes) for t in texts if t is not None)
    )


def test_pin_memory_keeps_located_bytes_as_they_are():
    from torch.utils.data._utils.pin_memory import pin_memory

    located = MappedBytes(
        ["/nonexistent"], np.zeros(2, np.int32), np.zeros(2, np.int64), np.ones(2, np.int64)
    )
    assert pin_memory({"bin": located})["bin"] is located
