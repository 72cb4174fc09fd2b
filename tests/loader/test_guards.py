"""Guards: a too small /dev/shm (faked by patching the free-space probe, and for real in a private
mount namespace when the tests run as root), unpicklable parts for spawn workers, and tensors a
worker returns that are not in CPU memory ("meta" tensors stand in for CUDA ones: the check
refuses any non-CPU device, and this machine has no CUDA)."""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream import ShardDataset, ShardWriter
from shardstream.dataset.batches.collate import collate, ragged_fields
from shardstream.loader import guards
from shardstream.loader.guards import SharedMemoryError, WorkerDeviceError, WorkerPickleError
from tests.sample_datasets import key_of, write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

MB = 10**6


def big_sample(i: int) -> dict:
    return {"__key__": key_of(i), "npy": np.full(250_000, i, dtype=np.uint8), "cls": i}


def png_of_zeros(i: int) -> dict:
    """A 256 x 256 PNG of one colour: ~1 KB stored, 196 KB decoded (the manifest underestimates)."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((256, 256, 3), dtype=np.uint8)).save(buf, format="PNG")
    return {"__key__": key_of(i), "png": buf.getvalue(), "cls": i}


@pytest.fixture(scope="module")
def big_url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("big"), [8, 8], make=big_sample)


@pytest.fixture(scope="module")
def png_url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("png"), [8, 8], make=png_of_zeros)


@pytest.fixture(scope="module")
def small_url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("small"), [4, 3])


def fake_shm(monkeypatch, free: int) -> None:
    monkeypatch.setattr(guards, "shm_free_bytes", lambda path=guards.SHM_PATH: free)


# -- shared memory ------------------------------------------------------------------------------


def test_check_shm_raises_with_the_numbers_and_the_fix():
    with pytest.raises(SharedMemoryError) as info:
        guards.check_shm(40 * MB, num_workers=8, batches_per_worker=2, free=64 * MB)
    message = str(info.value)
    assert (
        "64.0 MB free" in message and "640.0 MB" in message and "8 workers x 2 batches" in message
    )
    assert "--shm-size=1g" in message and "--ipc=host" in message and "file_system" in message
    # fits
    assert guards.check_shm(4 * MB, num_workers=8, batches_per_worker=2, free=64 * MB) == 64 * MB
    # no workers
    assert guards.check_shm(40 * MB, num_workers=0, batches_per_worker=2, free=MB) == 0
    assert guards.check_shm(40 * MB, 8, 2, free=MB, action="off") == 640 * MB
    with pytest.warns(RuntimeWarning, match="Bus error"):
        guards.check_shm(40 * MB, 8, 2, free=MB, action="warn")
    with pytest.raises(ValueError):
        guards.check_shm(1, 1, 1, action="maybe")


def test_local_ranks_share_shared_memory(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert guards.check_shm(MB, 2, 2, free=100 * MB, action="off") == 32 * MB
    with pytest.raises(SharedMemoryError, match="8 local ranks"):
        guards.check_shm(MB, 2, 2, free=30 * MB)


def test_shm_free_bytes_is_statvfs(tmp_path):
    st = os.statvfs(tmp_path)
    assert abs(guards.shm_free_bytes(str(tmp_path)) - st.f_bavail * st.f_frsize) < 64 * MB
    assert guards.shm_free_bytes(str(tmp_path / "missing")) is None


def test_batch_nbytes_counts_tensors_only():
    (raw,) = ragged_fields([[b"abc", b"de"]])
    batch = {
        "x": torch.zeros(10, dtype=torch.float32),
        "keys": ["a", "b"],
        "raw": raw,
        "nested": [torch.zeros(3, dtype=torch.uint8), (torch.zeros(2, dtype=torch.int64), "s")],
    }
    assert guards.batch_nbytes(batch) == 40 + (5 + 3 * 8) + 3 + 16


def test_a_small_shm_is_refused_before_workers_start(big_url, monkeypatch):
    # 4 samples of 250 KB per batch, 2 workers x 4 ring arenas: about 10 MB
    fake_shm(monkeypatch, 20 * MB)
    ds = ShardDataset(big_url, decode=None)
    ds.loader(batch_size=4, num_workers=2, shm_check="off")  # fine when asked not to check
    with pytest.raises(SharedMemoryError, match="manifest"):
        ShardDataset(big_url, decode="torch").loader(batch_size=16, num_workers=2)
    ds = ShardDataset(big_url, decode="torch")
    with pytest.raises(SharedMemoryError):
        ds.loader(batch_size=16, num_workers=2, prefetch_factor=4)
    # a refused loader leaves the dataset free; no workers, no shm
    loader = ds.loader(batch_size=16, num_workers=0)
    assert len(list(loader)) == 1


def test_a_small_shm_is_refused_at_the_first_batch_when_decoding_grows_it(png_url, monkeypatch):
    fake_shm(monkeypatch, 3 * MB)  # stored: ~1 KB per sample; decoded: 196 KB, 4 per batch
    loader = ShardDataset(png_url).loader(batch_size=4, num_workers=2)  # the manifest says it fits
    with pytest.raises(SharedMemoryError, match="measured on the first batch"):
        list(loader)
    warned = ShardDataset(png_url).loader(batch_size=4, num_workers=2, shm_check="warn")
    with pytest.warns(RuntimeWarning, match="shm-size"):
        assert sum(len(b["__key__"]) for b in warned) == 16
    fake_shm(monkeypatch, 64 * MB)
    assert (
        sum(len(b["__key__"]) for b in ShardDataset(png_url).loader(batch_size=4, num_workers=2))
        == 16
    )


SUBPROCESS = """
import sys
from shardstream import ShardDataset, ShardWriter
from shardstream.loader.guards import SharedMemoryError
ds = ShardDataset(sys.argv[1])
try:
    for batch in ds.loader(batch_size=8, num_workers=2, prefetch_factor=2):
        pass
except SharedMemoryError as exc:
    print("REFUSED", exc)
else:
    print("READ ALL")
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare to mount a small /dev/shm in a private mount namespace",
)
def test_a_real_small_shm_gives_the_error_instead_of_a_hang(png_url, tmp_path):
    # 8 x 196 KB per batch, 2 workers x 4 arenas x 1.25: about 16 MB in flight, in a 4 MB /dev/shm
    script = tmp_path / "read.py"
    script.write_text(textwrap.dedent(SUBPROCESS))
    command = (
        f"mount -t tmpfs -o size=4m tmpfs /dev/shm && exec {sys.executable} {script} {png_url}"
    )
    try:
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the loader hung in a small /dev/shm")
    if "mount:" in done.stderr or "unshare:" in done.stderr:
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()[:200]}")
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert "--shm-size" in done.stdout and "/dev/shm has 4." in done.stdout
    assert "measured on the first batch" in done.stdout


# -- pickling for spawn workers ------------------------------------------------------------------


def module_level_transform(sample: dict) -> dict:
    return sample


class Logging:
    """A transform that opened a file in __init__: fine in forked workers' eyes, fatal for spawn."""

    def __init__(self, path: Path):
        self.log = open(path, "a")  # noqa: SIM115 - the trap under test

    def __call__(self, sample: dict) -> dict:
        return sample


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, sample: dict) -> dict:
        for t in self.transforms:
            sample = t(sample)
        return sample


class WithHandle(ShardDataset):
    """A dataset subclass with an open file of its own."""


class HoldsLock:
    """A transform with a multiprocessing lock, which spawned workers receive fine."""

    def __init__(self) -> None:
        import multiprocessing

        self.lock = multiprocessing.get_context("spawn").Lock()

    def __call__(self, sample):
        return sample


def test_multiprocessing_locks_pass_the_pickle_check(small_url):
    from shardstream.loader.guards import _picklable

    assert _picklable(HoldsLock()) is None  # plain pickle refuses it; a spawned worker gets it


def test_a_lambda_transform_is_named_for_spawn_workers(small_url):
    line = sys._getframe().f_lineno + 1
    ds = ShardDataset(small_url, transform=lambda s: s)
    with pytest.raises(WorkerPickleError) as info:
        ds.loader(batch_size=2, num_workers=2, multiprocessing_context="spawn")
    message = str(info.value)
    assert message.startswith("the transform ") and "<lambda>" in message
    assert (
        f"test_guards.py:{line}" in message
        and "'spawn'" in message
        and "def at module level" in message
    )


def test_a_local_function_is_named_for_forkserver_workers(small_url):
    def local(sample):
        return sample

    ds = ShardDataset(small_url, transform=Compose([module_level_transform, local]))
    with pytest.raises(WorkerPickleError) as info:
        ds.loader(batch_size=2, num_workers=2, multiprocessing_context="forkserver")
    message = str(info.value)
    assert "the transform Compose object (its part transforms[1]: " in message
    assert "local.<locals>.local" not in message and "<locals>.local defined at" in message
    assert "inside another one" in message and "'forkserver'" in message


def test_an_open_file_in_a_transform_is_named(small_url, tmp_path):
    ds = ShardDataset(small_url, transform=Logging(tmp_path / "log.txt"))
    with pytest.raises(WorkerPickleError) as info:
        ds.loader(
            batch_size=2,
            num_workers=1,
            multiprocessing_context=multiprocessing.get_context("spawn"),
        )
    message = str(info.value)
    assert (
        "its part log: an open file" in message
        and "log.txt" in message
        and "open the file in the worker" in message
    )
    ds.transform.log.close()


def test_collate_worker_init_decoder_and_dataset_attributes_are_checked(small_url, tmp_path):
    spawn = {"num_workers": 1, "multiprocessing_context": "spawn"}
    with pytest.raises(WorkerPickleError, match="the collate_fn "):
        ShardDataset(small_url).loader(batch_size=2, collate_fn=lambda b: b, **spawn)
    with pytest.raises(WorkerPickleError, match="the worker_init_fn "):
        ShardDataset(small_url).loader(batch_size=2, worker_init_fn=lambda i: None, **spawn)
    with pytest.raises(WorkerPickleError, match="the decoder of field 'txt' "):
        ShardDataset(small_url, decode={"txt": lambda b: b.decode()}).loader(batch_size=2, **spawn)
    with pytest.raises(WorkerPickleError, match="the dataset's collate_fn "):
        ShardDataset(small_url, collate_fn=lambda s: collate(s)).loader(batch_size=2, **spawn)
    ds = WithHandle(small_url)
    ds.handle = open(tmp_path / "x", "w")  # noqa: SIM115 - the trap under test
    with pytest.raises(WorkerPickleError, match="the dataset's attribute 'handle', an open file"):
        ds.loader(batch_size=2, **spawn)
    ds.handle.close()


def test_forked_workers_take_lambdas_and_are_warned_about_open_files(small_url, tmp_path):
    ds = ShardDataset(small_url, shuffle=False, transform=lambda s: {**s, "twice": 2 * s["cls"]})
    batches = list(ds.loader(batch_size=4, num_workers=1, multiprocessing_context="fork"))
    assert [v for b in batches for v in b["twice"].tolist()] == [0, 2, 4, 6, 8, 10, 12]
    logging = Logging(tmp_path / "log.txt")
    with pytest.warns(RuntimeWarning, match="share its file position"):
        ShardDataset(small_url, transform=logging).loader(
            batch_size=2, num_workers=1, multiprocessing_context="fork"
        )
    logging.log.close()


def test_a_function_of_an_interactive_session_is_refused_for_spawn(small_url, monkeypatch):
    interactive = types.ModuleType("__main__")  # a notebook's __main__ has no __file__
    monkeypatch.setitem(sys.modules, "__main__", interactive)

    def augment(sample):
        return sample

    augment.__module__ = "__main__"
    augment.__qualname__ = "augment"
    interactive.augment = augment
    ds = ShardDataset(small_url, transform=augment)
    with pytest.raises(WorkerPickleError, match="interactive session"):
        ds.loader(batch_size=2, num_workers=1, multiprocessing_context="spawn")


def test_start_method():
    assert guards.start_method("spawn") == "spawn"
    assert guards.start_method(multiprocessing.get_context("forkserver")) == "forkserver"
    before = multiprocessing.get_start_method(allow_none=True)
    assert guards.start_method() in multiprocessing.get_all_start_methods()
    # the default is not fixed as a side effect
    assert multiprocessing.get_start_method(allow_none=True) == before


# -- tensors from workers -------------------------------------------------------------------------


def meta_collate(samples: list) -> dict:
    """Stands in for a collate_fn that moves batches to CUDA inside the worker."""
    batch = collate(samples)
    batch["cls"] = batch["cls"].to("meta")
    return batch


def test_foreign_tensors_are_found_anywhere_in_a_batch():
    (raw,) = ragged_fields([[b"x"]])
    batch = {
        "a": torch.zeros(1),
        "b": [torch.zeros(1), {"c": torch.zeros(2, device="meta")}],
        "raw": raw,
        "keys": ["k"],
    }
    assert guards.foreign_tensors(batch) == [("batch['b'][1]['c']", torch.device("meta"))]
    guards.check_worker_batch({"a": torch.zeros(1), "raw": raw})
    with pytest.raises(WorkerDeviceError, match=r"batch\['b'\]\[1\]\['c'\] on meta.*DeviceLoader"):
        guards.check_worker_batch(batch)


def test_a_worker_returning_device_tensors_gets_a_clear_error(small_url):
    ds = ShardDataset(small_url, collate_fn=meta_collate)
    with pytest.raises(WorkerDeviceError, match=r"batch\['cls'\] on meta.*main process"):
        list(ds.loader(batch_size=2, num_workers=1))
    in_main = ShardDataset(small_url, collate_fn=meta_collate).loader(batch_size=2, num_workers=0)
    # the main process may put batches anywhere
    assert next(iter(in_main))["cls"].device.type == "meta"


def as_view(sample: dict) -> dict:
    """A transform that returns a memoryview (which cannot be pickled)."""
    return {"__key__": sample["__key__"], "txt": memoryview(bytes(sample["txt"]))}


def test_a_batch_that_cannot_be_pickled_fails_in_its_worker_instead_of_hanging(small_url):
    ds = ShardDataset(small_url, decode=None, transform=as_view, collate_fn=list, shuffle=False)
    # a timeout: a regression fails the test instead of hanging it
    loader = ds.loader(batch_size=2, num_workers=2, timeout=120)
    with pytest.raises(guards.WorkerBatchError, match=r"cannot be sent.*memoryview"):
        list(loader)
    assert list(guards._unpicklable({"a": [b"x", 1], "b": np.zeros(3), "c": torch.zeros(2)})) == []
    assert [p for p, _ in guards._unpicklable({"v": [memoryview(b"x")]})] == ["batch['v'][0]"]


# -- images of different sizes -----------------------------------------------------------------------


def _jpeg(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (9, 8, 7)).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def mixed_sizes(tmp_path_factory) -> str:
    """12 JPEGs of three sizes, one after another, in 3 shards."""
    url = str(tmp_path_factory.mktemp("sizes") / "ds")
    sizes = [(8, 6), (6, 8), (8, 8)]
    with ShardWriter(url, samples_per_shard=4) as writer:
        for i in range(12):
            writer.write({"__key__": key_of(i), "jpg": _jpeg(*sizes[i % 3]), "cls": i})
    return url


@pytest.mark.parametrize("num_workers", [0, 2])
def test_images_of_different_sizes_are_warned_of_once_per_loader(mixed_sizes, num_workers):
    ds = ShardDataset(mixed_sizes, shuffle=False, decode="torch", rank=0, world_size=1)
    loader = ds.loader(batch_size=4, num_workers=num_workers)
    with pytest.warns(UserWarning, match=r"batch\['jpg'\] is a list of 4 tensors") as caught:
        for _ in range(2):  # two epochs, three batches each: one warning
            batches = list(loader)
    ragged = [w for w in caught if "is a list of" in str(w.message)]
    assert len(ragged) == 1
    message = str(ragged[0].message)
    assert "different sizes (C×H×W (3, 6, 8), (3, 8, 6), ...)" in message
    assert "transform=" in message and "ss.Bucketed(ds, key=ss.aspect_ratio('jpg')" in message
    assert isinstance(batches[0]["jpg"], list) and len(batches) == 3


def test_images_of_one_size_or_kept_as_lists_on_purpose_are_not_warned_of(mixed_sizes, recwarn):
    from shardstream import FieldCollate

    resized = ShardDataset(
        mixed_sizes, decode="torch", transform=lambda s: {**s, "jpg": s["jpg"][:, :6, :6]}
    )
    assert list(resized.loader(batch_size=4, num_workers=0))[0]["jpg"].shape == (4, 3, 6, 6)
    listed = ShardDataset(mixed_sizes, decode="torch", collate_fn=FieldCollate(lists=["jpg"]))
    assert isinstance(list(listed.loader(batch_size=4, num_workers=0))[0]["jpg"], list)
    assert not [w for w in recwarn if "is a list of" in str(w.message)]
    assert guards.ragged_images({"jpg": [torch.zeros(3, 2, 2), torch.zeros(3, 2, 2)]}) is None
    assert guards.ragged_images({"txt": [torch.zeros(3), torch.zeros(4)]}) is None  # no images
