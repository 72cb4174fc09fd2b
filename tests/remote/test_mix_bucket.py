"""A mix of sources in a bucket: the same order as the same sources on disk, their shards fetched ahead."""

from __future__ import annotations

import shardstream
from shardstream.dataset import MixedDataset, ShardDataset

from .data import image_folder


def test_a_mix_of_bucket_sources_reads_as_the_local_mix(s3_bucket, tmp_path):
    options = s3_bucket.storage_options
    for name in ("a", "b"):
        image_folder(tmp_path / f"src-{name}")
        shardstream.pack(
            tmp_path / f"src-{name}", tmp_path / name, samples_per_shard=3, progress=False
        )
        shardstream.pack(
            tmp_path / f"src-{name}",
            s3_bucket.url(name),
            storage_options=options,
            samples_per_shard=3,
            progress=False,
        )

    def mix(remote: bool) -> MixedDataset:
        sources = [
            ShardDataset(
                s3_bucket.url(n) if remote else str(tmp_path / n),
                decode=None,
                seed=k,
                **(
                    {"storage_options": options, "cache_dir": str(tmp_path / "cache")}
                    if remote
                    else {}
                ),
            )
            for k, n in enumerate("ab")
        ]
        return MixedDataset(sources, [0.7, 0.3], samples_per_epoch=40)

    local = [k for b in mix(False).loader(4, 0) for k in b["__key__"]]
    loader = mix(True).loader(4, 2)
    remote = [k for b in loader for k in b["__key__"]]
    assert remote == local and len(remote) == 40
    stats = loader.stats()
    # every shard of both sources downloaded once (5 + 5 shards of 3 images)
    assert stats.cache_misses == 10
