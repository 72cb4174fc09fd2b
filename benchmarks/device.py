"""DeviceLoader benchmark: host-to-device bandwidth and step time with a fixed GPU compute time.

Run it from the repository root on a machine with a CUDA GPU::

    .venv/bin/python benchmarks/device.py                   # 64 MB batches, 40 per measurement
    .venv/bin/python benchmarks/device.py --batch-mb 16 --batches 100 --repeat 5

Without CUDA it says so and exits 0: there is nothing to measure, and no number is made up.

What is measured, all in the same run (best of ``--repeat``):

1. **Bandwidth.** ``DeviceLoader`` over pinned uint8 batches (nothing else done with them)
   against a raw loop of ``dst.copy_(src, non_blocking=True)`` from pinned memory on one
   stream: GB/s of each and their ratio (target: DeviceLoader >= 90% of the raw copy).
2. **Step time.** A synthetic training step of fixed GPU time (``torch.cuda._sleep``,
   calibrated) fed by ``DeviceLoader``, for compute at 0.5x, 1x and 2x the copy time of
   one batch; the step time against max(compute, data), where data is the raw copy time
   per batch (target: within 5%). For contrast, the same step with a plain blocking
   ``.to("cuda")`` from pageable memory, which costs compute + copy.
3. **uint8 on the wire.** Image batches copied as uint8 and converted to normalized
   float32 on the GPU (``DeviceLoader(normalize=...)``) against float32 batches of the
   same images copied as they are.

This is a benchmark, not a test: timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch

from shardstream import DeviceLoader


def best(fn: Callable[[], float], repeat: int) -> float:
    fn()  # warm up: allocator, pinned pool, stream creation
    return min(fn() for _ in range(repeat))


def timed(body: Callable[[], None]) -> float:
    """Wall-clock seconds of ``body`` with the GPU idle before and drained after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    body()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def sleep_cycles_per_ms() -> float:
    cycles = 2_000_000
    torch.cuda._sleep(cycles)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    return cycles / start.elapsed_time(stop)


def fed_steps(
    pinned: list[torch.Tensor], n: int, device: torch.device, prefetch: int, cycles: int
) -> float:
    """Seconds for ``n`` steps of ``cycles`` GPU sleep, each fed its batch by DeviceLoader."""

    def body() -> None:
        for batch in DeviceLoader(
            (pinned[i % len(pinned)] for i in range(n)), device, prefetch=prefetch
        ):
            torch.cuda._sleep(cycles)
            batch[:1].add_(1)  # the step reads its batch

    return timed(body)


def naive_steps(pageable: list[torch.Tensor], n: int, device: torch.device, cycles: int) -> float:
    """The same steps with a blocking ``.to(device)`` from pageable memory."""

    def body() -> None:
        for i in range(n):
            batch = pageable[i % len(pageable)].to(device)
            torch.cuda._sleep(cycles)
            batch[:1].add_(1)

    return timed(body)


def drain(batch: torch.Tensor, n: int, device: torch.device, **options) -> float:
    """Seconds to move ``n`` copies of ``batch`` through DeviceLoader, doing nothing with them."""

    def body() -> None:
        for out in DeviceLoader((batch for _ in range(n)), device, **options):
            del out

    return timed(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-mb", type=float, default=64, help="bytes per batch, in MB (10^6)")
    parser.add_argument("--batches", type=int, default=40, help="batches per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="measurements; the best is shown")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--images", type=int, default=256, help="images per batch in part 3")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU is present: nothing measured (this benchmark needs one)")
        return 0

    device = torch.device("cuda", torch.cuda.current_device())
    n, numel = args.batches, int(args.batch_mb * 1e6)
    print(
        f"GPU: {torch.cuda.get_device_name(device)}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"Python {platform.python_version()}"
    )
    print(
        f"{n} batches of {numel / 1e6:.0f} MB per measurement, prefetch {args.prefetch}, best of {args.repeat}\n"
    )
    pinned = [torch.randint(0, 256, (numel,), dtype=torch.uint8).pin_memory() for _ in range(4)]
    gigabytes = n * numel / 1e9

    # 1. bandwidth ------------------------------------------------------------------------------
    dst = torch.empty(numel, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)

    def raw() -> float:
        def body() -> None:
            with torch.cuda.stream(stream):
                for i in range(n):
                    dst.copy_(pinned[i % 4], non_blocking=True)

        return timed(body)

    def through_loader() -> float:
        def body() -> None:
            for batch in DeviceLoader(
                (pinned[i % 4] for i in range(n)), device, prefetch=args.prefetch
            ):
                del batch

        return timed(body)

    raw_s, loader_s = best(raw, args.repeat), best(through_loader, args.repeat)
    raw_bw, loader_bw = gigabytes / raw_s, gigabytes / loader_s
    print("1. host-to-device bandwidth")
    print(f"   raw pinned copy_:  {raw_bw:6.2f} GB/s")
    print(
        f"   DeviceLoader:      {loader_bw:6.2f} GB/s  = {loader_bw / raw_bw:.1%} of the raw copy (target >= 90%)\n"
    )

    # 2. step time ------------------------------------------------------------------------------
    copy_ms = raw_s / n * 1e3
    per_ms = sleep_cycles_per_ms()
    pageable = [p.clone() for p in pinned]  # the same bytes, not pinned
    print(f"2. synthetic step (data = raw copy time per batch, {copy_ms:.2f} ms)")
    for factor in (0.5, 1.0, 2.0):
        compute_ms = factor * copy_ms
        cycles = int(compute_ms * per_ms)
        step_ms = (
            best(lambda c=cycles: fed_steps(pinned, n, device, args.prefetch, c), args.repeat)
            / n
            * 1e3
        )
        naive_ms = best(lambda c=cycles: naive_steps(pageable, n, device, c), args.repeat) / n * 1e3
        bound = max(compute_ms, copy_ms)
        print(
            f"   compute {compute_ms:6.2f} ms: DeviceLoader {step_ms:6.2f} ms/step = {step_ms / bound:.3f} x "
            f"max(compute, data) (target <= 1.05); blocking .to() from pageable memory {naive_ms:6.2f} ms/step"
        )

    # 3. uint8 on the wire -------------------------------------------------------------------------
    shape = (args.images, 3, 224, 224)
    as_uint8 = torch.randint(0, 256, shape, dtype=torch.uint8).pin_memory()
    as_float = (as_uint8.float() / 255).pin_memory()
    normalize = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    u8_ms = best(lambda: drain(as_uint8, n, device, normalize=normalize), args.repeat) / n * 1e3
    f32_ms = best(lambda: drain(as_float, n, device), args.repeat) / n * 1e3
    print(
        f"\n3. {args.images} RGB images of 224x224 ({as_uint8.numel() / 1e6:.1f} MB as uint8, "
        f"{as_float.numel() * 4 / 1e6:.1f} MB as float32) to normalized float32 on the GPU"
    )
    print(f"   uint8 copied, converted on the GPU: {u8_ms:6.2f} ms per batch")
    print(
        f"   float32 copied as it is:            {f32_ms:6.2f} ms per batch ({f32_ms / u8_ms:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
