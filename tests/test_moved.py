"""Module paths of release 0.1 still import, with a warning that names the new home."""

from __future__ import annotations

import importlib
import sys

import pytest

import shardstream
from shardstream import _moved


@pytest.fixture
def fresh(monkeypatch):
    """Forget the old names (so that importing them goes through the import system again)."""
    for old in _moved.MOVED:
        monkeypatch.delitem(sys.modules, old, raising=False)
        parent, name = old.rsplit(".", 1)
        if name in vars(sys.modules[parent]):
            monkeypatch.delattr(sys.modules[parent], name)


@pytest.mark.parametrize("old", sorted(o for o, n in _moved.MOVED.items() if isinstance(n, str)))
def test_an_old_path_gives_the_new_module_itself(fresh, old):
    new = _moved.MOVED[old]
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new  # its own spec, not the alias's


@pytest.mark.parametrize(
    "old", sorted(o for o, n in _moved.MOVED.items() if not isinstance(n, str))
)
def test_an_old_module_split_in_several_finds_each_name(fresh, old):
    with pytest.warns(DeprecationWarning, match=f"{old} moved to"):
        module = importlib.import_module(old)
    homes = [importlib.import_module(h) for h in _moved.MOVED[old]]
    for home in homes:
        for name in getattr(home, "__all__", [n for n in vars(home) if not n.startswith("_")]):
            assert getattr(module, name) is getattr(home, name)
    with pytest.raises(AttributeError, match="moved to"):
        module.no_such_name  # noqa: B018


def test_from_imports_of_old_names_work(fresh):
    with pytest.warns(DeprecationWarning):
        from shardstream.collate import pad_sequences
        from shardstream.writer import IN_PROGRESS, ShardWriter, encode_field  # noqa: F401
    assert ShardWriter is shardstream.ShardWriter and pad_sequences is shardstream.pad_sequences


def test_old_names_as_attributes_of_the_package(fresh):
    with pytest.warns(
        DeprecationWarning, match="shardstream.transport moved to shardstream.loader.transport"
    ):
        assert shardstream.transport is importlib.import_module("shardstream.loader.transport")


def test_the_packages_that_kept_their_names_keep_their_public_names():
    from shardstream.dataset import ShardDataset, resolve_rank  # noqa: F401
    from shardstream.loader import ShardLoader, default_num_workers  # noqa: F401
    from shardstream.manifest import (  # noqa: F401
        MANIFEST_NAME,
        Manifest,
        dataset_store,
        load_manifest,
        write_manifest,
    )
    from shardstream.plan import EpochOrder, per_rank, rank_range, remaining, worker_chunks  # noqa: F401
    from shardstream.storage import (  # noqa: F401
        RetryPolicy,
        Store,
        connection_options,
        describe_os_error,
        is_url,
    )


def test_unknown_attributes_still_fail():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        shardstream.nothing  # noqa: B018
