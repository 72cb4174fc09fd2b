"""Two packs with different sources racing into one local folder (issue 32).

Each race starts two runner processes' packs at random offsets from a common start. After both end,
either exactly one run published, ``verify`` passes and the shards are exactly that run's (checksums of a
clean pack of its source), and only that run reported success; or none published and both said so. A
watcher reading the folder during the race never finds a published manifest whose shards do not match it.
Variants: folder to tar (the local process pool, and Ray where it is installed), folder to Arrow (ShardWriter),
table to Arrow (threads), and two overwrites of a published dataset. The S3 variants are in
``tests/remote/test_concurrent_packs.py``; the harness is :mod:`tests.packing.races`.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.manifest import load_manifest
from shardstream.storage import Store
from tests.packing.races import Runner, run_races, summary
from tests.sample_datasets import make_files

RACES = int(os.environ.get("SHARDSTREAM_RACES", "20"))  # per variant


def folder(root: Path, tag: str) -> str:
    """12 small samples, the same keys in both sources, other bytes."""
    return str(
        make_files(root, {f"s{i:03d}.txt": f"{tag} sample {i} ".encode() * 40 for i in range(12)})
    )


def table(path: Path, tag: str) -> str:
    pq.write_table(
        pa.table({"id": list(range(24)), "text": [f"{tag} row {i} " * 20 for i in range(24)]}), path
    )
    return str(path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[str, str]]:
    root = tmp_path_factory.mktemp("race-sources")
    return {
        "folder": (folder(root / "a", "A"), folder(root / "b", "B")),
        "table": (table(root / "a.parquet", "A"), table(root / "b.parquet", "B")),
    }


@pytest.fixture(scope="module")
def pairs():
    """Two pairs of warm runners: two races at once."""
    made = [(Runner(), Runner()) for _ in range(2)]
    yield made
    for a, b in made:
        a.close()
        b.close()


def clean_packs(
    runner: Runner, sources: tuple[str, str], root: Path, options: dict
) -> tuple[dict, float]:
    """The sha256 column of a clean pack of each source, and the seconds of the second (a warm runner's)."""
    clean, seconds = {}, 0.0
    for name, source in zip("AB", sources):
        dest = str(root / f"clean-{name}")
        answer = runner.pack(source, dest, **options)
        assert answer["ok"], answer["error"]
        clean[name] = list(load_manifest(Store(dest)).sha256)
        seconds = answer["seconds"]
    return clean, seconds


VARIANTS = {
    "local-tar": ("folder", {"samples_per_shard": 2, "workers": 1}),
    "local-arrow": ("folder", {"samples_per_shard": 2, "format": "arrow"}),
    "table-arrow": ("table", {"samples_per_shard": 4, "workers": 2}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_packs_into_one_folder_publish_one_whole_dataset_or_none(
    variant, sources, pairs, tmp_path
):
    kind, options = VARIANTS[variant]
    clean, seconds = clean_packs(pairs[0][0], sources[kind], tmp_path, options)
    assert clean["A"] != clean["B"]
    races = run_races(
        pairs,
        RACES,
        sources[kind],
        lambda i, k: str(tmp_path / f"race-{i}"),
        options,
        clean,
        spread=seconds,
        seed=zlib.crc32(variant.encode()),
    )
    print(f"{variant}: {summary(races)}")
    # the loser removed its files
    assert not [r for r in races if r.problems or r.leftovers], summary(races)
    assert {r.published for r in races} & {
        "A",
        "B",
    }  # the races did publish (not all ended in two failures)


def test_two_overwrites_of_a_dataset_leave_it_whole(sources, pairs, tmp_path):
    """Both runs replace the dataset there (the one the previous race left, at first another one): one replaces
    it, both do one after the other, or neither does and it stays; readers meanwhile always find a whole
    dataset (the old one until the new manifest is there)."""
    options = {"samples_per_shard": 2, "workers": 1}
    before = folder(tmp_path / "before-src", "C")
    clean, seconds = clean_packs(pairs[0][0], sources["folder"], tmp_path, options)
    assert pairs[0][0].pack(before, str(tmp_path / "clean-before"), **options)["ok"]
    clean["before"] = list(load_manifest(Store(str(tmp_path / "clean-before"))).sha256)

    def publish_before(dest: str, by: Runner) -> None:
        if not os.path.exists(os.path.join(dest, "_manifest.json")):
            answer = by.pack(before, dest, **options)
            assert answer["ok"], answer["error"]

    races = run_races(
        pairs,
        RACES,
        sources["folder"],
        lambda i, k: str(tmp_path / f"chain-{k}"),
        {**options, "overwrite": True},
        clean,
        spread=seconds,
        seed=7,
        prepare=publish_before,
    )
    print(f"overwrite: {summary(races)}")
    # the loser removed its files
    assert not [r for r in races if r.problems or r.leftovers], summary(races)
    assert {r.published for r in races} >= {"A", "B"}


@pytest.fixture(scope="module")
def ray_pair():
    """Two runners, each on a local Ray instance of its own (two jobs on two clusters)."""
    pytest.importorskip("ray")
    options = {
        "num_cpus": 1,
        "include_dashboard": False,
        "log_to_driver": False,
        "_node_ip_address": "127.0.0.1",
    }
    first, second = Runner(ray=options), Runner(ray=options)
    yield first, second
    second.close()
    first.close()


def test_two_ray_packs_into_one_folder_publish_one_whole_dataset_or_none(
    sources, ray_pair, tmp_path
):
    options = {"samples_per_shard": 4, "engine": "ray"}
    clean, seconds = clean_packs(ray_pair[0], sources["folder"], tmp_path, options)
    races = run_races(
        [ray_pair],
        RACES,
        sources["folder"],
        lambda i, k: str(tmp_path / f"race-{i}"),
        options,
        clean,
        spread=seconds,
        seed=5,
    )
    print(f"ray: {summary(races)}")
    # the loser removed its files
    assert not [r for r in races if r.problems or r.leftovers], summary(races)
