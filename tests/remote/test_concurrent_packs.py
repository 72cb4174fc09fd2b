"""Two packs with different sources racing into one S3 prefix (moto on 127.0.0.1; issue 32), and the
conditional writes that make the publish exclusive, on moto and on SeaweedFS.

The judgement is that of ``tests/packing/test_concurrent_packs.py`` (harness: :mod:`tests.packing.races`):
after both end, exactly one run published its own shards (``verify`` passes, checksums of a clean pack of
its source) and only it reported success, or none published; a watcher reading the prefix during the race
never finds a published manifest whose shards do not match it.
"""

from __future__ import annotations

import os
import zlib

import pytest

from shardstream import ShardWriter
from shardstream.manifest import dataset_store, load_manifest
from shardstream.manifest.files import write_manifest
from shardstream.packing.destination import DestinationLost
from shardstream.storage import Store
from shardstream.storage.conditional import Expect, WriteConflict
from tests.packing.races import Runner, run_races, summary

from .data import image_folder, parquet_table

RACES = int(os.environ.get("SHARDSTREAM_RACES", "12"))  # per variant


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[str, str]]:
    root = tmp_path_factory.mktemp("race-sources")
    image_folder(root / "a", seed=1)
    image_folder(root / "b", seed=2)
    parquet_table(root / "a.parquet", rows=24, seed=1)
    parquet_table(root / "b.parquet", rows=24, seed=2)
    return {
        "folder": (str(root / "a"), str(root / "b")),
        "table": (str(root / "a.parquet"), str(root / "b.parquet")),
    }


@pytest.fixture(scope="module")
def pairs(moto_server):
    """Two pairs of warm runners (started after the environment's dummy credentials are set): two races at once."""
    made = [(Runner(), Runner()) for _ in range(2)]
    yield made
    for a, b in made:
        a.close()
        b.close()


def clean_packs(
    runner: Runner, sources: tuple[str, str], bucket, options: dict
) -> tuple[dict, float]:
    """The sha256 column of a clean pack of each source, and the seconds of the second (a warm runner's)."""
    clean, seconds = {}, 0.0
    for name, source in zip("AB", sources):
        url = bucket.url(f"clean-{name}")
        answer = runner.pack(source, url, **options)
        assert answer["ok"], answer["error"]
        clean[name] = list(load_manifest(dataset_store(url, bucket.storage_options)).sha256)
        seconds = answer["seconds"]
    return clean, seconds


VARIANTS = {
    "s3-tar": ("folder", {"samples_per_shard": 7, "workers": 2}),
    "s3-arrow": ("table", {"samples_per_shard": 12, "workers": 2}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_packs_into_one_prefix_publish_one_whole_dataset_or_none(
    variant, sources, pairs, s3_bucket
):
    kind, options = VARIANTS[variant]
    options = {**options, "storage_options": s3_bucket.storage_options}
    clean, seconds = clean_packs(pairs[0][0], sources[kind], s3_bucket, options)
    assert clean["A"] != clean["B"]
    races = run_races(
        pairs,
        RACES,
        sources[kind],
        lambda i, k: s3_bucket.url(f"race-{i}"),
        options,
        clean,
        spread=seconds,
        seed=zlib.crc32(variant.encode()),
        storage_options=s3_bucket.storage_options,
    )
    print(f"{variant}: {summary(races)}")
    # the loser removed its files
    assert not [r for r in races if r.problems or r.leftovers], summary(races)
    assert {r.published for r in races} & {
        "A",
        "B",
    }  # the races did publish (not all ended in two failures)


def test_two_overwrites_of_a_dataset_in_a_bucket_leave_it_whole(
    sources, pairs, s3_bucket, tmp_path
):
    """Both runs replace the dataset there (the one the previous race left, at first another one): one replaces
    it, both do one after the other, or neither does and it stays; readers meanwhile always find a whole
    dataset (the old one until the new manifest is there)."""
    options = {"samples_per_shard": 7, "workers": 2, "storage_options": s3_bucket.storage_options}
    image_folder(tmp_path / "before", seed=3)
    before = str(tmp_path / "before")
    clean, seconds = clean_packs(pairs[0][0], sources["folder"], s3_bucket, options)
    assert pairs[0][0].pack(before, s3_bucket.url("clean-before"), **options)["ok"]
    clean["before"] = list(
        load_manifest(
            dataset_store(s3_bucket.url("clean-before"), s3_bucket.storage_options)
        ).sha256
    )

    def publish_before(dest: str, by: Runner) -> None:
        if not s3_bucket.keys(dest.split("/", 3)[3] + "/_manifest.json"):
            answer = by.pack(before, dest, **options)
            assert answer["ok"], answer["error"]

    races = run_races(
        pairs,
        RACES,
        sources["folder"],
        lambda i, k: s3_bucket.url(f"chain-{k}"),
        {**options, "overwrite": True},
        clean,
        spread=seconds,
        seed=11,
        storage_options=s3_bucket.storage_options,
        prepare=publish_before,
    )
    print(f"s3-overwrite: {summary(races)}")
    # the loser removed its files
    assert not [r for r in races if r.problems or r.leftovers], summary(races)
    assert {r.published for r in races} >= {"A", "B"}


# -- the conditional writes the publish relies on, on each S3 server --------------------------------------------------


def check_conditional_writes(store: Store) -> None:
    """The store refuses a second create and a replace of a version that is no longer there."""
    assert store.honours_conditions(".probe") and not store.exists(".probe")
    store.write_if("m.json", b"one", Expect(None))
    with pytest.raises(WriteConflict, match="m.json: it already exists"):
        store.write_if("m.json", b"two", Expect(None))
    data, tag = store.read_tagged("m.json")
    assert data == b"one"
    store.write_if("m.json", b"three", Expect(tag))
    with pytest.raises(WriteConflict, match="holds another version than expected"):
        store.write_if("m.json", b"four", Expect(tag))
    assert store.read_tagged("m.json")[0] == b"three"


def test_moto_honours_if_none_match_and_if_match(s3_bucket):
    check_conditional_writes(Store(s3_bucket.url("cond"), s3_bucket.storage_options))


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    from tests.docker.seaweed import SeaweedS3

    with SeaweedS3(tmp_path_factory.mktemp("weed")) as server:  # about 1 s to start
        yield server


def test_seaweedfs_honours_if_none_match_and_if_match(seaweed):
    options = {
        "endpoint_url": seaweed.endpoint,
        "key": seaweed.access_key,
        "secret": seaweed.secret_key,
    }
    check_conditional_writes(Store(f"s3://{seaweed.new_bucket()}/cond", options))


def test_a_run_that_loses_the_publish_in_a_bucket_removes_its_objects(s3_bucket, tmp_path):
    url, options = s3_bucket.url("ds"), s3_bucket.storage_options
    writer = ShardWriter(url, samples_per_shard=1, storage_options=options)
    for i in range(3):
        writer.write({"__key__": f"k{i}", "txt": f"sample {i}"})
    writer.finish()
    with ShardWriter(str(tmp_path / "other")) as other:
        other.write({"__key__": "o", "txt": "other"})
    write_manifest(Store(url, options), other.manifest)  # published by someone else meanwhile
    with pytest.raises(
        DestinationLost,
        match=r"\(_manifest.json appeared\); this run's shards were not published "
        r"and its 6 files were removed",
    ) as info:  # 3 shards and their sample indexes
        writer.close()
    assert "\n" not in str(info.value)
    assert s3_bucket.keys("ds") == [
        "ds/_manifest.json"
    ]  # the other's manifest, and nothing of this run
