"""Writers and ``gc`` on one living dataset at once, in an S3 bucket (moto on 127.0.0.1; issue 38): the
counterparts of ``tests/packing/test_living_races.py``. On object storage a writer checks its claim and then
publishes by a second request, with no lock between them: the windows those leave are held open here at every
point (:class:`~tests.packing.living_races.Interleave`), then raced between processes at random offsets, ``gc``
through a link 50 ms slower than the writers' (``SHARDSTREAM_RACES`` of each).
"""

from __future__ import annotations

import os

import pytest

import shardstream.packing.destination as destination
from shardstream.manifest.files import manifest_files
from shardstream.packing.destination import DestinationLost
from tests.packing.living_races import (
    Interleave,
    append_and_gc_races,
    each_point,
    judge_overwrite_race,
    overwrite_and_append_races,
)
from tests.packing.races import Runner
from tests.packing.test_living_races import Living, an_append_in_gc, gc_in_an_append, judge

RACES = int(os.environ.get("SHARDSTREAM_RACES", "12"))  # per variant (each about 5 s here)


def test_gc_at_every_point_of_an_append_s_publish_in_a_bucket_spares_what_it_publishes(
    s3_bucket, monkeypatch
):
    """With a shard table, named by its content, not by the run (from 10,000 shards; here from 1)."""
    monkeypatch.setattr(destination, "manifest_files", lambda m: manifest_files(m, 1))
    living = Living(s3_bucket.url("ds"), s3_bucket.storage_options, spp=3)
    assert each_point(lambda k: gc_in_an_append(living, k, f"t{k}")) > 10
    judge(living, living.keys, "after every point")


def test_an_append_s_publish_at_every_point_of_gc_in_a_bucket_stays_published(s3_bucket):
    living = Living(s3_bucket.url("ds"), s3_bucket.storage_options, spp=3)
    assert each_point(lambda k: an_append_in_gc(living, k, f"g{k}", claimed_before=True)) > 5
    judge(living, living.keys, "after every point")


def an_append_claiming_in_an_overwrite(living: Living, k: int, tag: str) -> bool:
    """An append claims the dataset and writes its shards before the ``k``-th storage call of an overwrite's
    publish (between the overwrite's last check of its claim and its publish, among others), and publishes
    after it."""
    over = living.writer(overwrite=True)
    replacing = Living.add(over, f"o-{tag}", 3)
    appended: set[str] = set()

    def claim():
        writer = living.writer(append=True)
        appended.update(Living.add(writer, tag, 3))
        return writer

    with Interleave(k, claim) as point:
        try:
            over.close()
            published = (over.manifest.version, over.manifest.fingerprint)
        except DestinationLost:
            published = None
    assert point.error is None, f"the append's claim at call {k}: {point.error}"
    writer = point.result if point.fired else claim()
    try:
        writer.close()
        appended_as = (writer.manifest.version, writer.manifest.fingerprint)
    except DestinationLost:
        appended_as = None
    living.keys, problems = judge_overwrite_race(
        living.store, living.keys, published, replacing, appended_as, appended, read=False
    )
    assert not problems, f"an append claiming at call {k} of an overwrite: {problems[0]}"
    return point.fired


def test_an_append_that_claims_during_an_overwrite_s_publish_is_refused_or_builds_on_it(s3_bucket):
    living = Living(s3_bucket.url("ds"), s3_bucket.storage_options, spp=3)
    assert each_point(lambda k: an_append_claiming_in_an_overwrite(living, k, f"x{k}")) > 10
    judge(living, living.keys, "after every point")


# -- the same races between processes, at random offsets ------------------------------------------------------


@pytest.fixture(scope="module")
def runners(moto_server):
    """Two warm runner processes (started after the environment's dummy credentials are set)."""
    made = (Runner(), Runner())
    yield made
    for runner in made:
        runner.close()


def test_appends_and_gc_over_a_slower_link_at_random_offsets_lose_nothing(
    runners, s3_bucket, proxied, tmp_path
):
    slow = proxied(s3_bucket)
    slow.proxy.inject("delay", seconds=0.05)
    options = {"samples_per_shard": 2, "workers": 1, "storage_options": s3_bucket.storage_options}
    problems = append_and_gc_races(
        *runners,
        tmp_path,
        s3_bucket.url("ds"),
        options,
        {"storage_options": slow.storage_options},
        RACES,
        38,
    )
    assert not problems, problems[:3]


def test_appends_and_overwrites_in_a_bucket_at_random_offsets(runners, s3_bucket, tmp_path):
    options = {"samples_per_shard": 2, "workers": 1, "storage_options": s3_bucket.storage_options}
    problems, ends = overwrite_and_append_races(
        *runners, tmp_path, s3_bucket.url("ds"), options, RACES, 39
    )
    print(f"S3 overwrite and append races: {ends}")
    assert not problems, problems[:3]
