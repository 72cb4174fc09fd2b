"""The private parts of torch (and accelerate) that shardstream/loader/torch_adapter.py relies on, each
pinned: when a torch release changes one, its test fails saying which part and what the adapter needs."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from shardstream.loader import torch_adapter

ROOT = Path(__file__).resolve().parents[2]
CHANGED = (
    f"torch {torch.__version__} changed a private part shardstream/loader/torch_adapter.py uses: "
)


class Numbers(IterableDataset):
    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def test_the_infinite_sampler_is_torchs_and_yields_none_forever():
    from torch.utils.data import dataloader

    assert hasattr(dataloader, "_InfiniteConstantSampler"), (
        CHANGED + "torch.utils.data.dataloader._InfiniteConstantSampler is gone"
    )
    loader = DataLoader(Numbers(3), batch_size=None)
    assert isinstance(loader.sampler, dataloader._InfiniteConstantSampler), (
        CHANGED + "an IterableDataset's loader no longer gets _InfiniteConstantSampler"
    )
    it = iter(torch_adapter.InfiniteSampler())
    assert [next(it) for _ in range(3)] == [None] * 3


def test_torch_refuses_a_sampler_after_init_and_set_sampler_gives_one():
    loader = torch_adapter.AdaptedDataLoader(Numbers(3), batch_size=None)
    with pytest.raises(ValueError, match="sampler"):
        loader.sampler = torch_adapter.InfiniteSampler()
    mine = torch_adapter.InfiniteSampler()
    loader.set_sampler(mine)
    assert loader.sampler is mine, CHANGED + "DataLoader.sampler is no longer a plain attribute"
    assert list(loader) == [0, 1, 2]


def test_get_iterator_is_the_hook_every_pass_goes_through():
    calls = []

    class Counting(torch_adapter.AdaptedDataLoader):
        def new_iterator(self):
            calls.append(1)
            return self.torch_iterator()

    loader = Counting(Numbers(3), batch_size=None)
    assert list(loader) == [0, 1, 2] and list(loader) == [0, 1, 2]
    assert calls == [1, 1], (
        CHANGED + "DataLoader.__iter__ no longer makes its iterator by _get_iterator()"
    )


def test_the_single_process_iterator_reads_what_its_fetcher_is_given():
    loader = torch_adapter.AdaptedDataLoader(Numbers(3), batch_size=None)
    it = loader.torch_iterator()
    fetcher = getattr(it, "_dataset_fetcher", None)
    assert fetcher is not None and hasattr(fetcher, "dataset_iter"), (
        CHANGED + "_SingleProcessDataLoaderIter._dataset_fetcher.dataset_iter is gone"
    )
    assert list(torch_adapter.read_from(it, ["a", "b"])) == ["a", "b"]


def test_persistent_workers_are_seen_and_stopped():
    loader = torch_adapter.AdaptedDataLoader(
        Numbers(4), batch_size=None, num_workers=1, persistent_workers=True
    )
    assert not loader.has_workers_running()
    assert sorted(loader) == [0, 1, 2, 3]
    assert loader.has_workers_running(), (
        CHANGED + "DataLoader._iterator no longer keeps persistent workers"
    )
    it = loader.__dict__["_iterator"]
    assert callable(getattr(it, "_shutdown_workers", None)), (
        CHANGED + "_MultiProcessingDataLoaderIter._shutdown_workers is gone"
    )
    loader.stop_workers()
    assert not loader.has_workers_running()
    assert all(not w.is_alive() for w in it._workers)


def test_the_worker_loop_wraps_errors_with_its_module_global():
    module = importlib.import_module(torch_adapter.WORKER_LOOP)
    assert getattr(module, "ExceptionWrapper", None) is torch_adapter.ExceptionWrapper, (
        CHANGED + f"{torch_adapter.WORKER_LOOP} no longer wraps a worker's errors with its global "
        "ExceptionWrapper"
    )
    source = Path(module.__file__).read_text()
    assert "ExceptionWrapper(" in source
    wrapped = torch_adapter.ExceptionWrapper(
        (KeyError, KeyError("k"), None), where="in DataLoader worker process 0"
    )
    assert {"exc_type", "exc_msg", "where"} <= set(vars(wrapped)), (
        CHANGED + "ExceptionWrapper's fields (exc_type, exc_msg, where)"
    )
    with pytest.raises(KeyError):
        wrapped.reraise()


def test_accelerate_returns_a_loader_marked_prepared_unchanged():
    accelerate = pytest.importorskip("accelerate")
    source = Path(importlib.import_module("accelerate.accelerator").__file__).read_text()
    assert 'getattr(data_loader, "_is_accelerate_prepared"' in source, (
        f"accelerate {accelerate.__version__} no longer honours _is_accelerate_prepared, which the "
        "loader sets (shardstream/loader/torch_adapter.py)"
    )


def test_no_other_module_touches_a_private_part_of_torch():
    """Only the adapter imports torch's private names or calls the DataLoader's private hooks."""
    bad = []
    for path in sorted((ROOT / "shardstream").rglob("*.py")):
        if path.name == "torch_adapter.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or "._" in node.module or node.module.startswith("torch._"):
                    bad.append(f"{path.name}:{node.lineno} from {node.module} import {private}")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("torch.")
                and "._" in node.value
            ):
                bad.append(f"{path.name}:{node.lineno} names {node.value}")
            if isinstance(node, ast.Attribute) and node.attr in (
                "_get_iterator",
                "_dataset_fetcher",
                "_shutdown_workers",
                "_iterator",
                "_is_accelerate_prepared",
            ):
                bad.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not bad, f"torch's private parts outside loader/torch_adapter.py: {bad}"
