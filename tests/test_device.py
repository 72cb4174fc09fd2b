"""DeviceLoader on the CPU: the fallback path, nesting, conversions (exact, against a hand-written
reference), len, errors, and resume through it. The CUDA path is tested in tests/gpu."""

from __future__ import annotations

import collections
import contextlib
import gc
import io
import json
import types
import weakref

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream import DeviceLoader, ShardDataset
from shardstream.dataset.batches.collate import RaggedBytes, collate
from shardstream.device import map_tensors
from tests.sample_datasets import key_of, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

Pair = collections.namedtuple("Pair", ["image", "label"])
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def images(n: int = 3, h: int = 5, w: int = 7, seed: int = 0) -> torch.Tensor:
    """uint8 N x 3 x H x W, channels-last in memory (as shardstream collates decoded images)."""
    hwc = np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    return torch.from_numpy(hwc).permute(0, 3, 1, 2)


def reference(batch: torch.Tensor) -> np.ndarray:
    """(x / 255 - mean) / std in float32, channel by channel, written out with numpy."""
    x = batch.numpy().astype(np.float32) / np.float32(255)
    mean = np.array(MEAN, dtype=np.float32).reshape(3, 1, 1)
    std = np.array(STD, dtype=np.float32).reshape(3, 1, 1)
    return (x - mean) / std


def nested_batch() -> dict:
    (raw,) = collate([{"raw": b"ab"}, {"raw": b"c"}, {"raw": b""}]).values()
    return {
        "image": images(),
        "label": torch.tensor([1, 2, 3]),
        "__key__": ["a", "b", "c"],
        "raw": raw,
        "meta": {
            "boxes": [torch.ones(2, 4), torch.zeros(0, 4)],
            "pair": Pair(torch.arange(3), "x"),
        },
        "extra": (torch.full((2,), 7.0), 5),
    }


def test_without_cuda_batches_pass_through_unchanged(monkeypatch):
    from shardstream import device as device_module

    assert not torch.cuda.is_available()  # this suite runs on CPU; tests/gpu covers the CUDA path
    monkeypatch.setattr(device_module, "_warned_cpu_fallback", False)
    batch = nested_batch()
    with pytest.warns(RuntimeWarning):
        loader = DeviceLoader([batch], "cuda")
    assert loader.device == torch.device("cpu") and not loader.cuda
    (out,) = list(loader)
    assert out["image"] is batch["image"] and out["label"] is batch["label"]  # no copies on the CPU
    assert out["__key__"] is batch["__key__"] and out["raw"] is batch["raw"]
    assert out["meta"]["boxes"][0] is batch["meta"]["boxes"][0]
    assert (
        isinstance(out["meta"]["pair"], Pair)
        and out["meta"]["pair"].image is batch["meta"]["pair"].image
    )
    assert isinstance(out["extra"], tuple) and out["extra"][1] == 5


def test_asking_for_cuda_without_it_warns_once_naming_the_cpu_fallback(monkeypatch):
    import warnings

    from shardstream import device as device_module

    monkeypatch.setattr(device_module, "_warned_cpu_fallback", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as a broken driver makes it
    with pytest.warns(
        RuntimeWarning,
        match=r"device 'cuda' asked for, but CUDA is not available.*on the CPU.*"
        r"device='cpu'",
    ):
        DeviceLoader([1], "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DeviceLoader([1], "cuda:0")  # once per process
        DeviceLoader([1], "cpu")


def test_batches_move_to_the_given_device_with_their_structure():
    batch = nested_batch()
    # a device without data: every tensor must have moved
    (out,) = list(DeviceLoader([batch], "meta"))
    assert out["image"].device.type == "meta" and out["image"].shape == batch["image"].shape
    assert out["meta"]["boxes"][1].device.type == "meta" and out["meta"]["boxes"][1].shape == (0, 4)
    assert isinstance(out["meta"]["pair"], Pair) and out["meta"]["pair"].image.device.type == "meta"
    assert out["meta"]["pair"].label == "x" and out["extra"][1] == 5
    assert out["__key__"] == ["a", "b", "c"]
    assert isinstance(out["raw"], RaggedBytes) and list(out["raw"]) == [
        b"ab",
        b"c",
        b"",
    ]  # bytes stay on the host
    assert out["label"].device.type == "meta"


def test_map_tensors_keeps_container_types():
    ordered = collections.OrderedDict(a=torch.zeros(1), b=[torch.ones(1), "s"])
    out = map_tensors(lambda t: t + 1, ordered)
    assert type(out) is collections.OrderedDict and out["a"].item() == 1 and out["b"][0].item() == 2
    assert out["b"][1] == "s"
    default = collections.defaultdict(list, x=torch.zeros(1))
    assert map_tensors(lambda t: t + 1, default)["x"].item() == 1
    strings = ["a", "b"]
    assert map_tensors(lambda t: t, strings) is strings


def test_conversion_equals_a_hand_written_reference():
    batch = {
        "image": images(n=4, h=6, w=9),
        "label": torch.tensor([0, 1, 2, 3]),
        "mask": torch.zeros(4, 6, 9, dtype=torch.uint8),
    }
    loader = DeviceLoader(
        [batch], "cpu", dtype=torch.float32, normalize=(MEAN, STD), channels_last=True
    )
    (out,) = list(loader)
    assert out["image"].dtype == torch.float32
    assert np.array_equal(out["image"].numpy(), reference(batch["image"]))  # bit for bit
    assert out["image"].is_contiguous(memory_format=torch.channels_last)
    # not image batches: untouched
    assert out["label"] is batch["label"] and out["mask"] is batch["mask"]
    assert batch["image"].dtype == torch.uint8  # the input is not changed


def test_conversion_without_normalize_scales_uint8_to_unit_range():
    batch = images()
    (out,) = list(DeviceLoader([batch], "cpu", dtype=torch.float16))
    assert out.dtype == torch.float16
    assert torch.equal(out, batch.to(torch.float16).div_(255))
    (unscaled,) = list(DeviceLoader([batch], "cpu", dtype=torch.float32, scale=False))
    assert torch.equal(unscaled, batch.float())


def test_fields_by_key_position_and_predicate():
    image, other = images(), images(seed=1)
    batch = {"left": image, "right": other, "n": torch.tensor([1, 2, 3])}
    (out,) = list(DeviceLoader([batch], "cpu", normalize=(MEAN, STD), fields=["left"]))
    assert np.array_equal(out["left"].numpy(), reference(image)) and out["right"] is other
    (pair,) = list(
        DeviceLoader(
            [Pair(image, torch.tensor([1, 2, 3]))], "cpu", normalize=(MEAN, STD), fields=[0]
        )
    )
    assert isinstance(pair, Pair) and np.array_equal(pair.image.numpy(), reference(image))
    assert pair.label.dtype == torch.int64
    chw = image[0]  # a single 3-d image is no image batch by default
    (same,) = list(DeviceLoader([chw], "cpu", dtype=torch.float32))
    assert same is chw
    (converted,) = list(
        DeviceLoader([chw], "cpu", dtype=torch.float32, fields=lambda t: t.dtype == torch.uint8)
    )
    assert torch.equal(converted, chw.float() / 255)


def test_normalize_does_not_change_a_float_input_in_place():
    x = torch.rand(2, 3, 4, 4)
    before = x.clone()
    (out,) = list(DeviceLoader([{"x": x}], "cpu", normalize=(MEAN, STD), fields=["x"]))
    assert torch.equal(x, before)
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    assert torch.equal(out["x"], (before - mean) / std)


def test_bad_arguments():
    with pytest.raises(ValueError, match="prefetch"):
        DeviceLoader([], "cpu", prefetch=0)
    with pytest.raises(ValueError, match="floating"):
        DeviceLoader([], "cpu", dtype=torch.int32, normalize=(0.5, 0.5))
    with pytest.raises(ValueError, match="std"):
        DeviceLoader([], "cpu", normalize=(0.5, 0.0))


def test_len_follows_the_wrapped_iterable():
    assert len(DeviceLoader([1, 2, 3], "cpu")) == 3
    loader = DeviceLoader((torch.zeros(1) for _ in range(4)), "cpu")
    with pytest.raises(TypeError):
        len(loader)
    assert len(list(loader)) == 4


@pytest.mark.filterwarnings("ignore:DeviceLoader. device .cuda. asked for")
def test_an_error_of_the_wrapped_loader_comes_after_the_batches_before_it():
    def batches():
        yield torch.zeros(1)
        yield torch.ones(1)
        raise RuntimeError("shard 3 is corrupt")

    got = []
    with pytest.raises(RuntimeError, match="shard 3"):
        for b in DeviceLoader(batches(), "cuda"):
            got.append(b.item())
    assert got == [0.0, 1.0]


# -- with ShardLoader -------------------------------------------------------------------------------


def png_sample(i: int) -> dict:
    rgb = np.random.default_rng(i).integers(0, 256, (8, 10, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return {"__key__": key_of(i), "png": buf.getvalue(), "cls": i}


@pytest.fixture(scope="module")
def image_url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("device"), [5, 7, 4], make=png_sample)


def test_shard_loader_batches_through_device_loader_with_workers(image_url):
    plain = [b for b in ShardDataset(image_url, seed=3).loader(batch_size=4, num_workers=0)]
    loader = ShardDataset(image_url, seed=3).loader(batch_size=4, num_workers=2)
    device = DeviceLoader(loader, "cuda", normalize=(MEAN, STD))
    assert len(device) == len(loader) == 4
    got = list(device)
    assert [b["__key__"] for b in got] == [b["__key__"] for b in plain]
    for b, p in zip(got, plain):
        assert np.array_equal(b["png"].numpy(), reference(p["png"]))
        assert torch.equal(b["cls"], p["cls"])


def test_resume_through_device_loader(image_url):
    first = DeviceLoader(
        ShardDataset(image_url, seed=3).loader(batch_size=3, num_workers=1), "cuda"
    )
    it = iter(first)
    before = [k for _ in range(2) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["consumed"] == 6
    second = DeviceLoader(
        ShardDataset(image_url, seed=3).loader(batch_size=3, num_workers=2), "cuda"
    )
    second.load_state_dict(state)
    after = [k for b in second for k in b["__key__"]]
    expected = [
        k
        for b in ShardDataset(image_url, seed=3).loader(batch_size=3, num_workers=0)
        for k in b["__key__"]
    ]
    assert before + after == expected


def test_state_of_a_foreign_loader_with_batches_copied_ahead_warns():
    class Stateful(list):
        def state_dict(self):
            return {"at": 7}

    loader = DeviceLoader(Stateful([torch.zeros(1)]), "cpu")
    assert loader.state_dict() == {"at": 7}  # nothing in flight on the CPU path
    # what the CUDA path counts while it holds copies ahead (tests/gpu runs it for real)
    loader._in_flight = 2
    with pytest.warns(RuntimeWarning, match="2 batches"):
        assert loader.state_dict() == {"at": 7}
    with pytest.raises(AttributeError):
        DeviceLoader([1], "cpu").state_dict()


# -- the CUDA path's bookkeeping, with CUDA faked ----------------------------------------------------
# Streams and events are fakes that record what happens to them, and "copies" go to the meta device;
# what is real is DeviceLoader's own logic: how far ahead it copies, which event the training loop
# waits for, how long host tensors stay referenced, resume counts. tests/gpu runs the real thing.


class FakeEvent:
    def __init__(self):
        self.done = False
        self.synchronized = False

    def record(self, stream):
        self.stream = stream

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized = self.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        return 0.5  # milliseconds


class FakeStream:
    def __init__(self):
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event)

    def wait_stream(self, other) -> None:  # pragma: no cover - only for batches already on the GPU
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    consumer = FakeStream()
    events: list[FakeEvent] = []

    def event(enable_timing: bool = False):  # two per batch: its copy's start, then its end
        events.append(FakeEvent())
        return events[-1]

    monkeypatch.setattr(torch.cuda, "Event", event)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)

    def make(loader, prefetch: int = 2) -> DeviceLoader:
        device = DeviceLoader(loader, "cpu", prefetch=prefetch, pin=False)
        device.cuda, device.device, device._stream = True, torch.device("meta"), FakeStream()
        return device

    return types.SimpleNamespace(make=make, consumer=consumer, events=events)


def test_cuda_path_copies_prefetch_batches_ahead_and_waits_for_each_batch_s_own_copy(fake_cuda):
    pulled: list[int] = []

    def source():
        for i in range(5):
            pulled.append(i)
            yield {"x": torch.full((2,), i), "i": i}

    loader = fake_cuda.make(source(), prefetch=2)
    got = []
    for batch in loader:
        i = batch["i"]
        got.append(i)
        assert batch["x"].device.type == "meta"
        assert pulled == list(range(min(i + 3, 5)))  # this batch and two more already sent
        # exactly this batch's copy
        assert fake_cuda.consumer.waited[-1] is fake_cuda.events[2 * i + 1]
        assert loader._in_flight == min(2, 4 - i)
    assert got == [0, 1, 2, 3, 4] and len(fake_cuda.consumer.waited) == 5


def test_cuda_path_keeps_host_tensors_until_their_copy_is_done(fake_cuda):
    hosts: list[weakref.ref] = []

    def source():
        for i in range(6):
            x = torch.full((4,), i)
            hosts.append(weakref.ref(x))
            yield {"x": x}
            del x

    it = iter(fake_cuda.make(source(), prefetch=1))
    next(it)
    next(it)
    gc.collect()
    # no copy has finished: every source is still referenced
    assert all(h() is not None for h in hosts)
    fake_cuda.events[1].done = True
    next(it)
    gc.collect()
    # let go once its own copy is done, not before
    assert hosts[0]() is None and hosts[1]() is not None
    it.close()
    # an early stop waits for the copies in flight
    assert all(e.synchronized for e in fake_cuda.events[3::2])


def test_cuda_path_state_counts_batches_copied_ahead_as_not_consumed(fake_cuda, image_url):
    loader = fake_cuda.make(
        ShardDataset(image_url, seed=3, decode=None).loader(batch_size=3, num_workers=0)
    )
    it = iter(loader)
    before = [k for _ in range(2) for k in next(it)["__key__"]]
    assert loader._in_flight == 2
    state = loader.state_dict()
    assert state["consumed"] == 6  # 2 received; the 2 copied ahead are read again after a resume
    resumed = ShardDataset(image_url, seed=3, decode=None).loader(batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    expected = [
        k for b in ShardDataset(image_url, seed=3, decode=None).loader(3, 0) for k in b["__key__"]
    ]
    assert before + [k for b in resumed for k in b["__key__"]] == expected


def test_cuda_path_state_after_a_break_still_counts_batches_copied_ahead(fake_cuda, image_url):
    loader = fake_cuda.make(
        ShardDataset(image_url, seed=3, decode=None).loader(batch_size=3, num_workers=0)
    )
    before = []
    for batch in loader:  # train two steps, then stop (the loop's iterator is closed)
        before += batch["__key__"]
        if len(before) == 6:
            break
    state = loader.state_dict()
    assert state["consumed"] == 6
    resumed = ShardDataset(image_url, seed=3, decode=None).loader(batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    expected = [
        k for b in ShardDataset(image_url, seed=3, decode=None).loader(3, 0) for k in b["__key__"]
    ]
    assert before + [k for b in resumed for k in b["__key__"]] == expected


def test_nested_mappings_that_are_not_dicts_are_moved_too():
    from collections import UserDict

    batch = UserDict({"x": torch.ones(2), "y": [torch.zeros(1)]})
    # reaches every one
    out = next(iter(DeviceLoader([batch], "cpu", dtype=torch.float64, fields=lambda t: True)))
    assert (
        isinstance(out, UserDict)
        and out["x"].dtype == torch.float64
        and out["y"][0].dtype == torch.float64
    )


def test_cuda_path_raises_an_error_after_the_batches_before_it(fake_cuda):
    def source():
        yield torch.zeros(1)
        yield torch.ones(1)
        raise RuntimeError("shard 3 is corrupt")

    got = []
    with pytest.raises(RuntimeError, match="shard 3"):
        for b in fake_cuda.make(source(), prefetch=3):
            got.append(b.shape)
    assert len(got) == 2


# -- stats: the training loop's wait for data against its step, and the copies ------------------


def test_device_stats_count_every_step_and_carry_the_loader_s(image_url):
    device = DeviceLoader(
        ShardDataset(image_url, seed=3).loader(batch_size=4, num_workers=0), "cpu"
    )
    assert device.stats().verdict() == "no batches yet"
    batches = list(device)
    s = device.stats()
    assert s.steps == len(batches) == len(s.history) == 4
    assert s.loader is not None and s.loader.samples == 16 and s.loader.decode_s > 0
    assert s.h2d_bytes == 0  # already where it goes
    assert 0 <= s.data_wait_fraction <= 1 and s.wait_s > 0 and s.compute_s >= 0
    d = s.as_dict()
    assert d["steps"] == 4 and d["samples"] == 16 and d["verdict"] == s.verdict()
    assert "history" not in d and "verdict" not in s.scalars() and s.scalars()["h2d_bytes"] == 0.0


def test_device_stats_count_the_bytes_copied_and_report_every_n_steps():
    batches = [
        {"x": torch.zeros(4, 8, dtype=torch.float32), "y": torch.ones(4, dtype=torch.int64)}
    ] * 5
    device = DeviceLoader(batches, "cpu", pin=False)
    device.device = torch.device("meta")  # a device other than the batches': every tensor crosses
    got: list[dict[str, float]] = []
    device.report_stats(every=2, callback=got.append)
    list(device)
    s = device.stats()
    assert s.h2d_bytes == 5 * (4 * 8 * 4 + 4 * 8) and s.loader is None
    assert [d["steps"] for d in got] == [2.0, 4.0]
    assert s.verdict().split(":")[0] in ("input-bound", "compute-bound")


def test_device_stats_data_wait_fraction_and_verdict_from_known_times():
    from shardstream.loader.stats import DeviceStats, LoaderStats

    inner = LoaderStats(batches=10, decode_s=8.0, read_s=1.0)
    s = DeviceStats(
        loader=inner, steps=10, wait_s=3.0, compute_s=1.0, copy_s=0.1, h2d_bytes=0, history=[]
    )
    assert s.data_wait_fraction == 0.75
    assert s.verdict().startswith(
        "input-bound: 75% of step time waiting for data; decode dominates; try more workers"
    )
    quiet = DeviceStats(
        loader=inner, steps=10, wait_s=0.01, compute_s=1.0, copy_s=0.1, h2d_bytes=0, history=[]
    )
    assert (
        quiet.verdict()
        == "compute-bound: 1% of step time waiting for data; the input pipeline keeps up"
    )


def test_cuda_path_times_each_copy_with_its_events(fake_cuda):
    loader = fake_cuda.make([{"x": torch.zeros(3)} for _ in range(4)], prefetch=2)
    list(loader)
    s = loader.stats()
    # every copy counted once, when done
    assert s.steps == 4 and s.copy_s == pytest.approx(4 * 0.5e-3)
    assert s.h2d_bytes == 4 * 3 * 4
