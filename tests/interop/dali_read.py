"""Read tar shards with NVIDIA DALI's webdataset reader on the CPU (no GPU needed) and print each sample as
a JSON line: ``{"__key__", "jpg", "cls"}`` (the raw bytes in base64). Runs in DALI's own environment
(``make dali-test`` builds ``.venv-dali``); shardstream is not imported::

    .venv-dali/bin/python tests/interop/dali_read.py [--index-dir DIR] [--shards N] SHARD...

``--index-dir``: index the shards first with DALI's own ``wds2idx`` into DIR (never beside the shards)
and read through those indexes. ``--shards N``: read as N DALI shards (ranks), one after the other.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys

import numpy as np
from nvidia.dali import fn, pipeline_def


def read(paths: list[str], index_paths: list[str], shard_id: int, num_shards: int):
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        jpg, cls = fn.readers.webdataset(
            paths=paths,
            index_paths=index_paths,
            ext=["jpg", "cls"],
            missing_component_behavior="error",
            random_shuffle=False,
            shard_id=shard_id,
            num_shards=num_shards,
            pad_last_batch=False,
            name="reader",
        )
        return jpg, cls, fn.get_property(jpg, key="source_info")

    p = pipe()
    p.build()
    meta = p.reader_meta("reader")
    # this DALI shard's samples: the epoch split as DALI splits it
    size = meta["epoch_size"]
    count = (size * (shard_id + 1)) // num_shards - (size * shard_id) // num_shards
    for _ in range(count):
        jpg, cls, info = p.run()
        # source_info: "<tar path>:<offset>:<member name>"; the key: the name to its file name's first dot
        member = bytes(np.array(info[0])).decode().rsplit(":", 1)[-1]
        folder, _, name = member.rpartition("/")
        yield {
            "__key__": folder + "/" * bool(folder) + name.split(".", 1)[0],
            "jpg": base64.b64encode(bytes(np.array(jpg[0]))).decode(),
            "cls": base64.b64encode(bytes(np.array(cls[0]))).decode(),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index-dir")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    index_paths = []
    if args.index_dir:
        wds2idx = os.path.join(os.path.dirname(sys.executable), "wds2idx")
        for i, path in enumerate(args.paths):
            out = os.path.join(args.index_dir, f"{i:06d}.idx")
            subprocess.run([wds2idx, path, out], check=True, capture_output=True)
            index_paths.append(out)
    for shard_id in range(args.shards):
        for sample in read(args.paths, index_paths, shard_id, args.shards):
            print(json.dumps(sample), flush=True)


if __name__ == "__main__":
    main()
