"""An error of shardstream's own raised in a loader's worker reaches the caller as its one line: the same
type, exactly the worker's message, a traceback of a few lines; errors from the user's code keep torch's
whole worker traceback; ``worker_tracebacks=True`` (and ``exc.worker_traceback``) keep the worker's."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import numpy as np
import pytest

import shardstream as ss
from shardstream.dataset.samples.decode import DecodeError
from shardstream.errors import CorruptShardError, ShardstreamError, TransformError, UsageError
from shardstream.loader import SharedMemoryError, guards
from shardstream.loader.worker_errors import WorkerTraceback, _portable, is_ours
from shardstream.storage.retry import DamagedRead
from tests.sample_datasets import key_of, write_dataset
from tests.token_corpus import pack_positions

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

ROOT = Path(__file__).resolve().parents[2]
WORKER_TEXT = "in DataLoader worker process"


def damage(path: Path) -> None:
    assert path.name.startswith("shard-000001")
    data = bytearray(path.read_bytes())
    data[600:700] = b"\xff" * 100
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("worker-errors")
    made = {
        "corrupt": write_dataset(
            root, [4, 4, 4], make=lambda i: {"__key__": key_of(i), "cls": i}, name="corrupt"
        ),
        "decode": write_dataset(
            root,
            [4, 4],
            make=lambda i: {"__key__": key_of(i), "json": b"{oops", "cls": i},
            name="decode",
        ),
        "plain": write_dataset(
            root,
            [4, 4, 4],
            make=lambda i: {"__key__": key_of(i), "cls": i, "txt": "t"},
            name="plain",
        ),
        "arrays": write_dataset(
            root,
            [4, 4],
            make=lambda i: {"__key__": key_of(i), "npy": np.zeros(4096, "f4")},
            name="arrays",
        ),
        "other": write_dataset(
            root, [4, 4], make=lambda i: {"__key__": key_of(i), "cls": i}, name="other"
        ),
        "tokens": pack_positions(root, [50] * 20, name="tokens")[0],
    }
    for name in ("corrupt", "tokens"):
        # the second shard, whatever packing names it
        damage(sorted(Path(made[name]).glob("shard-*[!.idx]"))[1])
    return made


def reading(urls: dict[str, str], kind: str) -> ss.ShardDataset:
    """A dataset whose first pass raises an error of shardstream's own in whoever reads it."""
    if kind == "corrupt":
        return ss.ShardDataset(
            urls["corrupt"], decode="torch", shuffle=False, verify_checksums=True
        )
    if kind == "decode":
        return ss.ShardDataset(urls["decode"], decode="torch", shuffle=False)
    # a mix whose sources give different fields: refused in the worker that collates
    if kind == "usage":
        return ss.MixedDataset(
            [
                ss.ShardDataset(urls["plain"], decode="torch"),
                ss.ShardDataset(urls["other"], decode="torch"),
            ]
        )
    assert kind == "tokens"
    return ss.TokenDataset(urls["tokens"], seq_len=8, shuffle=False, verify_checksums=True)


EXPECTED = {
    "corrupt": CorruptShardError,
    "decode": DecodeError,
    "usage": UsageError,
    "tokens": CorruptShardError,
}


def raised(dataset: ss.ShardDataset, num_workers: int, **kwargs) -> BaseException:
    """The error that reading ``dataset`` through a loader raises (caught without pytest.raises, whose
    ExceptionInfo in this frame would keep the loader in a reference cycle with the error: its workers
    would stop only when the garbage collector breaks it, after torch's 5 s join timeouts)."""
    try:
        for _ in dataset.loader(batch_size=2, num_workers=num_workers, **kwargs):
            pass
    except Exception as exc:
        return exc
    raise AssertionError("reading raised nothing")


def printed(exc: BaseException) -> list[str]:
    """The lines Python prints for ``exc`` (its traceback runs from this module's frames)."""
    return "".join(traceback.format_exception(exc)).rstrip("\n").split("\n")


def last_line(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_an_error_of_ours_in_a_worker_is_its_one_line(urls, kind):
    main = raised(reading(urls, kind), num_workers=0)
    exc = raised(reading(urls, kind), num_workers=2, workers="processes")
    assert type(exc) is type(main) is EXPECTED[kind]
    assert str(exc) == str(main)  # exactly the message the dataset raises where it reads
    assert "Caught" not in str(exc) and WORKER_TEXT not in str(exc) and "Traceback" not in str(exc)
    # the worker's traceback stays on the exception: it ends with this very message
    assert exc.worker_traceback.startswith("In DataLoader worker process ")
    assert exc.worker_traceback.rstrip("\n").endswith(last_line(exc))
    assert "shardstream/dataset/" in exc.worker_traceback
    lines = printed(exc)
    assert lines[-1] == last_line(exc)
    assert len(lines) <= 8, "\n".join(lines)  # this test's frame, the loader's, the message
    assert exc.__cause__ is None and exc.__suppress_context__


def test_an_error_of_ours_read_in_the_main_process_is_its_one_line_too(urls):
    exc = raised(reading(urls, "decode"), num_workers=0)
    lines = printed(exc)
    assert lines[-1] == last_line(exc) and len(lines) <= 8, "\n".join(lines)
    assert (
        "JSONDecodeError" in exc.worker_traceback and "shardstream/dataset/" in exc.worker_traceback
    )


def test_shared_memory_checked_by_a_worker_or_by_the_main_process_is_one_line(urls, monkeypatch):
    # passes the estimate
    monkeypatch.setattr(ss.ShardDataset, "batch_bytes", lambda self, samples: 0)
    monkeypatch.setattr(guards, "shm_free_bytes", lambda path=guards.SHM_PATH: 1000)
    ds = ss.ShardDataset(urls["arrays"], decode="torch", shuffle=False)
    exc = raised(ds, num_workers=2, pin_memory=False)  # a worker's check of its first batch
    assert isinstance(exc, SharedMemoryError) and "measured on the first batch" in str(exc)
    assert WORKER_TEXT not in str(exc) and "check_first_batch" in exc.worker_traceback
    assert printed(exc)[-1] == last_line(exc) and len(printed(exc)) <= 8

    # only the main process checks
    monkeypatch.setattr(guards, "check_first_batch", lambda *args, **kwargs: None)
    ds = ss.ShardDataset(urls["arrays"], decode="torch", shuffle=False)
    exc = raised(ds, num_workers=2, pin_memory=False)
    assert isinstance(exc, SharedMemoryError) and "measured on the first batch" in str(exc)
    assert WORKER_TEXT not in exc.worker_traceback and "_check_shm" in exc.worker_traceback
    assert printed(exc)[-1] == last_line(exc) and len(printed(exc)) <= 8


def test_with_worker_tracebacks_the_workers_traceback_is_printed_above_the_same_message(urls):
    exc = raised(reading(urls, "corrupt"), num_workers=2, worker_tracebacks=True)
    assert type(exc) is CorruptShardError and "Caught" not in str(exc)
    assert str(exc) == str(raised(reading(urls, "corrupt"), num_workers=0))
    assert isinstance(exc.__cause__, WorkerTraceback) and str(
        exc.__cause__
    ) == exc.worker_traceback.rstrip("\n")
    text = "\n".join(printed(exc))
    assert (
        "In DataLoader worker process 0:" in text
        and "shardstream/dataset/samples/reader.py" in text
    )
    assert printed(exc)[-1] == last_line(exc)
    # untouched, causes and all
    main = raised(reading(urls, "corrupt"), num_workers=0, worker_tracebacks=True)
    assert len(printed(main)) > 20 and main.__traceback__ is not None


def fails(sample):
    return 1 / 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_the_users_transform_keeps_its_whole_traceback(urls, num_workers):
    ds = ss.ShardDataset(urls["plain"], decode="torch", shuffle=False, transform=fails)
    exc = raised(ds, num_workers=num_workers)
    assert isinstance(exc, TransformError)
    text = "\n".join(printed(exc))
    assert "ZeroDivisionError" in text and "return 1 / 0" in text  # the user's line, to fix it
    if num_workers:
        assert str(exc).startswith(f"Caught TransformError {WORKER_TEXT} 0.")  # torch's, as it was
    else:
        assert isinstance(exc.__cause__, ZeroDivisionError)


class FailsOnce:
    """A transform that raises while ``flag`` exists (in every worker: they read the file system)."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __call__(self, sample):
        if self.flag.exists():
            raise RuntimeError("failing while the flag is there")
        return sample


def test_a_pass_that_dies_of_an_error_stops_its_workers_and_the_next_pass_starts_new_ones(
    urls, tmp_path
):
    flag = tmp_path / "flag"
    flag.touch()
    pids = tmp_path / "pids"
    pids.mkdir()

    def note_pid(worker_id):
        (pids / str(os.getpid())).touch()

    ds = ss.ShardDataset(urls["plain"], decode="torch", shuffle=False, transform=FailsOnce(flag))
    loader = ds.loader(batch_size=2, num_workers=2, worker_init_fn=note_pid)
    with pytest.raises(TransformError):
        list(loader)
    first = {int(p.name) for p in pids.iterdir()}
    assert len(first) == 2
    assert not first & {
        p.pid for p in multiprocessing.active_children()
    }  # stopped, not left to the collector
    flag.unlink()
    assert [k for b in loader for k in b["__key__"]] == [key_of(i) for i in range(12)]
    assert len({int(p.name) for p in pids.iterdir()} - first) == 2


def test_an_error_of_ours_raised_through_the_users_code_keeps_its_whole_traceback(urls):
    def decode_json(data):  # the user's decoder: its own bug shows where it is
        raise ValueError("the user's decoder failed")

    ds = ss.ShardDataset(urls["decode"], decode={"json": decode_json, "*": None}, shuffle=False)
    exc = raised(ds, num_workers=2)
    assert isinstance(exc, DecodeError) and str(exc).startswith(
        f"Caught DecodeError {WORKER_TEXT} 0."
    )
    assert 'raise ValueError("the user\'s decoder failed")' in str(exc)


def test_is_ours_tells_the_users_code_from_shardstreams():
    assert not is_ours(ValueError("x")) and not is_ours(TransformError("x"))
    assert is_ours(CorruptShardError("x"))  # never raised: no frames of anyone's
    try:
        raise CorruptShardError("raised here, in a test: code of the user's")
    except CorruptShardError as exc:
        assert not is_ours(exc)
    try:
        ss.ShardDataset("/nonexistent/dataset/path")
    except ShardstreamError as exc:
        assert type(exc).__module__.startswith("shardstream")
        # without this test's frame: shardstream's alone
        exc.__traceback__ = exc.__traceback__.tb_next
        assert is_ours(exc)


def test_an_error_whose_class_takes_other_arguments_travels_as_the_nearest_class_that_takes_the_message():
    exc = DamagedRead("memory://ds/shard-000000.tar", "its sha256 differs", "re-pack it")
    again = pickle.loads(_portable(exc))
    assert type(again) is CorruptShardError and str(again) == str(exc)
    plain = pickle.loads(_portable(UsageError("a setting that cannot work")))
    assert type(plain) is UsageError and str(plain) == "a setting that cannot work"


SCRIPT = textwrap.dedent("""
    import sys
    import shardstream as ss

    def fails(sample):
        return 1 / 0

    url, kind = sys.argv[1], sys.argv[2]
    if kind == "user":
        ds = ss.ShardDataset(url, decode="torch", shuffle=False, transform=fails)
    else:
        ds = ss.ShardDataset(url, decode="torch", shuffle=False, verify_checksums=True)
    for batch in ds.loader(batch_size=2, num_workers=2, **({"worker_tracebacks": True} if kind == "full" else {})):
        pass
""")


@pytest.mark.parametrize("kind", ["ours", "full", "user"])
def test_what_a_script_that_dies_of_it_prints(urls, tmp_path, kind):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    url = urls["plain"] if kind == "user" else urls["corrupt"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script), url, kind],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 1
    lines = done.stderr.rstrip("\n").split("\n")
    if kind == "user":  # torch's whole worker traceback, down to the user's line
        assert (
            f"Caught TransformError {WORKER_TEXT} 0" in done.stderr
            and "return 1 / 0" in done.stderr
        )
        return
    message = str(raised(reading(urls, "corrupt"), num_workers=0))
    assert lines[-1] == f"shardstream.errors.CorruptShardError: {message}"
    assert "Caught" not in done.stderr
    if kind == "ours":
        assert len(lines) <= 8, done.stderr
        assert lines[0] == "Traceback (most recent call last):" and 'train.py", line' in lines[1]
    else:
        assert len(lines) > 20 and "In DataLoader worker process 0:" in done.stderr
