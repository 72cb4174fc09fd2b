"""DeviceLoader on a real GPU: results equal a plain ``.to(device)``, conversions equal the CPU
path, no memory is reused while the training loop's kernels still read it (device or host side),
copies overlap compute, and resume through it is exact. Skipped without CUDA."""

from __future__ import annotations

import collections
import sys

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from shardstream import DeviceLoader, ShardDataset
from tests.sample_datasets import key_of, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

CUDA = torch.device("cuda", torch.cuda.current_device())
Pair = collections.namedtuple("Pair", ["image", "label"])
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def images(n: int = 4, h: int = 32, w: int = 48, seed: int = 0) -> torch.Tensor:
    hwc = torch.from_numpy(
        np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    )
    return hwc.permute(0, 3, 1, 2)  # channels-last in memory, as shardstream collates images


def nested(seed: int) -> dict:
    return {
        "image": images(seed=seed),
        "pinned": torch.arange(1000, dtype=torch.float32).pin_memory(),
        "strided": torch.arange(60).view(6, 10).t(),  # not contiguous
        "keys": ["a", "b"],
        "inner": {"boxes": [torch.rand(3, 4), torch.rand(0, 4)], "pair": Pair(torch.rand(2, 2), 7)},
        "tuple": (torch.tensor([seed]), "s"),
    }


def leaves(batch) -> list:
    if isinstance(batch, dict):
        return [x for v in batch.values() for x in leaves(v)]
    if isinstance(batch, (list, tuple)):
        return [x for v in batch for x in leaves(v)]
    return [batch]


def gpu_sleep_cycles(ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that take about ``ms`` on this GPU."""
    cycles = 1_000_000
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # warm up
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    return int(cycles * ms / start.elapsed_time(stop))


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_nested_batches_equal_a_plain_to(prefetch):
    batches = [nested(i) for i in range(6)]
    got = list(DeviceLoader(batches, "cuda", prefetch=prefetch))
    assert len(got) == 6
    for out, batch in zip(got, batches):
        assert type(out["inner"]["pair"]) is Pair and out["inner"]["pair"].label == 7
        assert out["keys"] == ["a", "b"] and out["tuple"][1] == "s"
        assert len(leaves(out)) == len(leaves(batch))  # nothing dropped or added
        for a, b in zip(leaves(out), leaves(batch)):
            if isinstance(b, torch.Tensor):
                assert a.device == CUDA and a.dtype == b.dtype and a.shape == b.shape
                assert torch.equal(a, b.to(CUDA))
            else:
                assert a == b


def test_conversions_match_the_cpu_path():
    batches = [{"image": images(seed=i), "label": torch.tensor([i])} for i in range(4)]
    options = {"normalize": (MEAN, STD), "channels_last": True}
    on_gpu = list(DeviceLoader(batches, "cuda", **options))
    on_cpu = list(DeviceLoader(batches, "cpu", **options))
    for g, c in zip(on_gpu, on_cpu):
        assert g["image"].device == CUDA and g["image"].dtype == torch.float32
        assert g["image"].is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(g["image"].cpu(), c["image"], rtol=1e-6, atol=1e-6)
        assert g["label"].dtype == torch.int64 and torch.equal(g["label"].cpu(), c["label"])
    half = next(iter(DeviceLoader(batches, "cuda", dtype=torch.float16)))["image"]
    torch.testing.assert_close(half.cpu(), batches[0]["image"].to(torch.float16) / 255)


def test_batches_already_on_the_gpu_and_another_consumer_stream():
    on_gpu = [
        {"x": torch.full((1000,), i, device=CUDA, dtype=torch.uint8).view(10, 1, 10, 10)}
        for i in range(5)
    ]
    torch.cuda.synchronize()  # made on the default stream; the loop below runs on another
    side = torch.cuda.Stream()
    # the training loop on a stream of its own: it must wait, not the default one
    with torch.cuda.stream(side):
        sums = [
            b["x"].sum().item()
            for b in DeviceLoader(on_gpu, "cuda", dtype=torch.float32, scale=False)
        ]
    assert sums == [1000.0 * i for i in range(5)]


def test_no_use_after_free_on_the_gpu_under_pressure():
    """The training loop's kernels read each batch late (after a sleep) and the batch is deleted at once:
    without record_stream the next copies (on the side stream) would take its memory and overwrite it."""
    n, numel = 120, 4 << 20
    cycles = gpu_sleep_cycles(2.0)

    def batches():
        for i in range(n):
            yield {"x": torch.full((numel,), i % 251, dtype=torch.uint8).pin_memory(), "i": i}

    sums = torch.zeros(n, dtype=torch.int64, device=CUDA)
    for batch in DeviceLoader(batches(), "cuda", prefetch=3):
        i = batch["i"]
        torch.cuda._sleep(cycles)  # the read below runs well after the loader has moved on
        sums[i] = batch["x"].sum(dtype=torch.int64)
        del batch
        garbage = torch.empty(numel, dtype=torch.uint8, device=CUDA).fill_(255)
        del garbage
        if i % 20 == 19:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    expected = torch.tensor([(i % 251) * numel for i in range(n)], dtype=torch.int64)
    assert torch.equal(sums.cpu(), expected)


def test_host_memory_is_not_let_go_before_its_copy_is_done():
    """A producer that refills a pinned buffer as soon as nobody else references it (as a ring of
    reused buffers does) must not get its buffer back while a copy from it is still queued. Each
    batch carries a small GPU tensor, so the side stream waits for the training loop's stream and
    the copies queue up behind its sleeps: a buffer let go early would be refilled before its copy."""
    n, numel = 60, 16 << 20
    pool = [torch.empty(numel, dtype=torch.uint8).pin_memory() for _ in range(2)]
    cycles = gpu_sleep_cycles(3.0)

    def holders(buf: torch.Tensor) -> int:
        return sys.getrefcount(buf)

    # nobody holds them yet: the pool and this comprehension only
    unheld = max([holders(b) for b in pool])

    def producer():
        for i in range(n):
            free = [b for b in pool if holders(b) <= unheld]  # the same expression as the baseline
            buf = free[0] if free else None
            del free
            if buf is None:
                pool.append(torch.empty(numel, dtype=torch.uint8).pin_memory())
                buf = pool[-1]
            buf.fill_(i % 251)
            yield {"x": buf, "i": i, "on_gpu": torch.zeros(1, device=CUDA)}
            del buf

    sums = torch.zeros(n, dtype=torch.int64, device=CUDA)
    for batch in DeviceLoader(producer(), "cuda", prefetch=4):
        # keeps the training loop's stream busy; the next copies wait for it
        torch.cuda._sleep(cycles)
        sums[batch["i"]] = batch["x"].sum(dtype=torch.int64)
    torch.cuda.synchronize()
    assert torch.equal(
        sums.cpu(), torch.tensor([(i % 251) * numel for i in range(n)], dtype=torch.int64)
    )
    assert len(pool) > 2  # buffers were really held while their copies waited


def test_copies_overlap_compute():
    n, numel = 20, 64 << 20
    src = torch.full((numel,), 3, dtype=torch.uint8).pin_memory()
    dst = torch.empty(numel, dtype=torch.uint8, device=CUDA)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dst.copy_(src, non_blocking=True)
    start.record()
    for _ in range(n):
        dst.copy_(src, non_blocking=True)
    stop.record()
    stop.synchronize()
    copy_ms = start.elapsed_time(stop) / n
    cycles = gpu_sleep_cycles(copy_ms)  # compute as long as a copy: perfect overlap halves the time

    def run() -> float:
        torch.cuda.synchronize()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        for batch in DeviceLoader((src for _ in range(n)), "cuda", prefetch=2):
            torch.cuda._sleep(cycles)
            batch.add_(1)  # reads the copy
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    run()  # warm up (allocator, pinned pool)
    total = min(run() for _ in range(3))
    serial = n * 2 * copy_ms
    assert total < 0.8 * serial, (
        f"{total:.1f} ms for {n} steps; copy {copy_ms:.2f} ms, serial {serial:.1f} ms"
    )


def test_shard_loader_through_device_loader_resumes_exactly(tmp_path):
    url = write_dataset(
        tmp_path,
        [5, 7, 4],
        make=lambda i: {
            "__key__": key_of(i),
            "cls": i,
            "npy": np.full((3, 8, 8), i, dtype=np.uint8),
        },
    )
    expected = [k for b in ShardDataset(url, seed=3).loader(3, 0) for k in b["__key__"]]
    first = DeviceLoader(
        ShardDataset(url, seed=3).loader(batch_size=3, num_workers=2), "cuda", prefetch=2
    )
    it = iter(first)
    before = []
    for _ in range(2):
        batch = next(it)
        assert batch["cls"].device == CUDA and batch["npy"].device == CUDA
        assert torch.equal(batch["npy"][:, 0, 0, 0].cpu(), batch["cls"].cpu().to(torch.uint8))
        before += batch["__key__"]
    state = first.state_dict()
    assert state["consumed"] == 6  # the two batches copied ahead are not counted
    second = DeviceLoader(ShardDataset(url, seed=3).loader(batch_size=3, num_workers=1), "cuda")
    second.load_state_dict(state)
    assert before + [k for b in second for k in b["__key__"]] == expected
