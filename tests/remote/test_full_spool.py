"""Uploads to S3 spool through the temporary folder; when it is full, the upload fails naming the object and
nothing cut is uploaded. The temporary folder is a small tmpfs filled to an exact number of free pages
(mounting needs root; skipped otherwise)."""

from __future__ import annotations

import json
import random

import pytest

import shardstream
from shardstream.errors import StorageError
from shardstream.manifest import MANIFEST_NAME
from shardstream.manifest.files import write_durably
from shardstream.storage import Store
from tests.oslimits import leave_free, tiny_tmpfs
from tests.sample_datasets import make_files


def test_a_full_spool_uploads_nothing_cut(s3_bucket, tmp_path, monkeypatch):
    """The function that writes shard tables, sample indexes and manifests: 20 kB to upload, one free page
    in the spool folder (before: 4 kB uploaded as the whole object, no error)."""
    store = Store(s3_bucket.url("ds"), s3_bucket.storage_options)
    data = json.dumps({"x": "y" * 20_000}).encode()
    with tiny_tmpfs(tmp_path / "spool", "256k") as spool:
        monkeypatch.setattr("tempfile.tempdir", str(spool))
        leave_free(spool, 4096)
        with pytest.raises(StorageError) as caught:
            write_durably(store, ".shardstream/shards-0123456789abcdef.arrow", data)
    assert s3_bucket.url("ds/.shardstream/shards-0123456789abcdef.arrow") in str(caught.value)
    assert "no space" in str(caught.value)
    assert s3_bucket.keys() == []


def test_a_pack_to_s3_with_a_full_spool_fails_on_one_line_and_publishes_nothing(
    s3_bucket, tmp_path, monkeypatch
):
    rng = random.Random(4)
    src = make_files(tmp_path / "src", {f"{i:02d}.bin": rng.randbytes(20_000) for i in range(8)})
    url = s3_bucket.url("ds")
    with tiny_tmpfs(tmp_path / "spool", "256k") as spool:
        monkeypatch.setattr("tempfile.tempdir", str(spool))
        leave_free(spool, 8192)
        with pytest.raises(StorageError) as caught:
            shardstream.pack(
                src, url, storage_options=s3_bucket.storage_options, workers=1, progress=False
            )
    message = str(caught.value)
    assert "\n" not in message and f"{url}/shard-" in message and "no space" in message
    published = s3_bucket.keys("ds")
    assert not [k for k in published if k.endswith(MANIFEST_NAME)], published
