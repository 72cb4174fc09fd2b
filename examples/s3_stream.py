"""Streaming from an S3-compatible store: start one, pack into a bucket, train from it through the cache.

    python examples/s3_stream.py                                   # starts a moto S3 server on 127.0.0.1
    python examples/s3_stream.py --endpoint-url http://127.0.0.1:9000 --bucket my-bucket   # your MinIO, ...

With no ``--endpoint-url`` the script starts moto's S3 server (``pip install 'moto[server]'``) in this
process, with made-up keys; against your own store (MinIO, SeaweedFS, Ceph, R2) set
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` to its keys first. It packs a small image folder
straight into the bucket (shards, sample indexes, the manifest last), reads it back with a
``ShardDataset`` that downloads whole shards into a private local cache (checked against their
sha256), trains a few steps, and reads a second epoch from the warm cache.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import shardstream as ss


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[object, str]:
    """moto's S3 server on a free local port, with made-up keys (moto accepts any)."""
    from moto.server import ThreadedMotoServer

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "example-key"),
        ("AWS_SECRET_ACCESS_KEY", "example-secret"),
    ):
        if not os.environ.get(name):
            os.environ[name] = value
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def make_images(root: Path, classes: int = 2, per_class: int = 48) -> None:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = np.full((32, 32, 3), 60 + 120 * c, np.int16) + rng.integers(
                -30, 30, (32, 32, 3)
            )
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(
                root / f"class_{c}/{i:03d}.jpg"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--endpoint-url", help="an S3-compatible store (default: start moto's server)"
    )
    parser.add_argument("--bucket", default="shardstream-example")
    parser.add_argument(
        "--work", help="a local folder for the images and the cache (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    server = None
    endpoint = args.endpoint_url
    if endpoint is None:
        server, endpoint = start_moto()
    work = Path(args.work or tempfile.mkdtemp(prefix="shardstream-s3-example-"))
    try:
        import s3fs  # the s3 extra: pip install 'shardstream[s3]'

        options = {"endpoint_url": endpoint}  # plus "key" / "secret" if not in the environment
        bucket = s3fs.S3FileSystem(**options)
        if not bucket.exists(args.bucket):
            bucket.mkdir(args.bucket)
        make_images(work / "images")
        url = f"s3://{args.bucket}/train"
        result = ss.pack(
            work / "images", url, shard_size="64KB", storage_options=options, overwrite=True
        )
        print(result.summary())

        ds = ss.ShardDataset(url, storage_options=options, cache_dir=work / "cache", decode="torch")
        loader = ds.loader(batch_size=16, num_workers=2)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(ds.epoch, 2):
            started = time.perf_counter()
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(
                    model(batch["jpg"].float() / 255), batch["cls"]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
            stats = loader.stats()
            print(
                f"epoch {epoch}: {time.perf_counter() - started:.2f} s, loss {loss.item():.3f}, "
                f"{stats.storage_bytes / 1e3:.0f} KB from storage, {stats.cache_hits} cache hits so far"
            )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
