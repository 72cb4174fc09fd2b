"""StorageSettings: a dataset's storage settings as one object, also accepted as keywords."""

from __future__ import annotations

import uuid

import pytest

from shardstream import ShardDataset, StorageSettings
from shardstream.packing.writer import ShardWriter
from shardstream.storage import DiskCache, RetryPolicy


@pytest.fixture
def remote_url() -> str:
    url = f"memory://settings-{uuid.uuid4().hex}/ds"
    with ShardWriter(url, samples_per_shard=3) as w:
        for i in range(7):
            w.write({"__key__": f"{i:03d}", "txt": f"sample {i}"})
    return url


def test_defaults():
    s = StorageSettings()
    assert (s.options, s.cache_dir, s.cache_limit, s.prefetch_bytes) == (
        {},
        None,
        None,
        512 * 10**6,
    )
    assert s.retry == RetryPolicy(5, 60.0)


def test_keywords_that_were_given_replace_the_fields_of_the_object():
    base = StorageSettings(prefetch="1MB", retries=2, timeout=None)
    s = StorageSettings.combine(base, retries=7)
    assert (s.prefetch_bytes, s.retries, s.timeout) == (10**6, 7, None)
    # None is a value, not "not given"
    assert StorageSettings.combine(None, timeout=None).timeout is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prefetch", -1, "prefetch must be 0 or more"),
        ("retries", -1, "retries must be 0 or more"),
        ("timeout", 0, "timeout must be positive"),
        ("prefetch", "lots", "is not a size"),
    ],
)
def test_bad_values_are_refused_at_once(field, value, message):
    with pytest.raises(Exception, match=message):
        StorageSettings(**{field: value})


def test_a_dataset_reads_through_the_cache_its_settings_name(remote_url, tmp_path):
    settings = StorageSettings(
        cache_dir=tmp_path / "cache", cache_limit="10MB", retries=1, prefetch=0
    )
    ds = ShardDataset(remote_url, decode=None, storage=settings)
    assert ds.storage == settings and ds.store.retry == RetryPolicy(1, 60.0)
    assert isinstance(ds.disk_cache, DiskCache) and ds.disk_cache.limit == 10**7
    assert sorted(s["__key__"] for s in ds) == [f"{i:03d}" for i in range(7)]
    assert len(list((tmp_path / "cache").glob("*.shard"))) == 3


def test_keywords_alone_still_work_as_before(remote_url, tmp_path):
    ds = ShardDataset(
        remote_url, decode=None, cache_dir=tmp_path, retries=3, timeout=5.0, prefetch="1MB"
    )
    assert ds.storage == StorageSettings(cache_dir=tmp_path, retries=3, timeout=5.0, prefetch="1MB")
    assert ds.store.retry == RetryPolicy(3, 5.0)


def test_a_keyword_overrides_the_settings_object(remote_url, tmp_path):
    ds = ShardDataset(
        remote_url, decode=None, storage=StorageSettings(cache_dir=tmp_path, retries=1), retries=4
    )
    assert ds.storage.retries == 4 and ds.storage.cache_dir == tmp_path


@pytest.mark.parametrize("value", [0, "0", "0MB", " 0 ", "0.0GiB"])
def test_prefetch_zero_as_a_string_is_accepted_like_the_number(remote_url, tmp_path, value):
    assert StorageSettings(prefetch=value).prefetch_bytes == 0
    ds = ShardDataset(remote_url, decode=None, cache_dir=tmp_path, prefetch=value)
    assert sorted(s["__key__"] for s in ds) == [f"{i:03d}" for i in range(7)]


def test_prefetch_zero_with_a_unit_that_is_none_is_refused():
    with pytest.raises(Exception, match="prefetch '0lots' is not a size"):
        StorageSettings(prefetch="0lots")
