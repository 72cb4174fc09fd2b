"""A loader the training loop drops is freed at once, its worker processes stopped with it.

Were it held until a garbage collection (an error's traceback kept in a reference cycle holds every frame
of the call that opened the dataset, the caller's loader among them), its workers would be stopped at
an arbitrary later moment: inside the next loader's first batch (torch joins each with a 5 s timeout), or
in a worker process forked meanwhile, where torch's shutdown fails ("can only test a child process").
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.sample_datasets import write_dataset

SCRIPT = textwrap.dedent(
    """
    import gc, sys, weakref
    import shardstream as ss
    ss.ShardDataset, ss.ShardMap  # imported before: import-time garbage is no concern of this test
    gc.collect()
    gc.disable()  # what is freed below is freed by reference counting alone

    def train(url, workers, whole):
        ds = ss.ShardDataset(url, decode=None)
        loader = ds.loader(batch_size=4, num_workers=1, workers=workers)
        batches = iter(loader)
        next(batches)
        if whole:
            for _ in batches:
                pass
        procs = [w for w in getattr(loader._iterator, "_workers", [])]
        return weakref.ref(loader), procs

    url, workers, whole = sys.argv[1], sys.argv[2], sys.argv[3] == "whole"
    gone, procs = train(url, workers, whole)
    print("freed" if gone() is None else "held")
    print("workers", len(procs), "alive", sum(p.is_alive() for p in procs))
    """
)


@pytest.mark.parametrize("workers", ["processes", "threads"])
@pytest.mark.parametrize("whole", ["whole", "part"])
def test_a_dropped_loader_is_freed_at_once_with_its_workers(tmp_path, workers, whole):
    url = write_dataset(tmp_path, [30, 30])
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, workers, whole],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("\n")
    assert lines[0] == "freed", run.stdout + run.stderr
    expected = 1 if workers == "processes" else 0
    assert lines[1] == f"workers {expected} alive 0", run.stdout
    assert "can only test a child process" not in run.stderr
