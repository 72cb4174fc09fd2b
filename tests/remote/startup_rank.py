"""One rank of a job reading an epoch through a loader with workers (to its end, so that no download is
left half done when it exits).

Run as ``python startup_rank.py URL STORAGE_OPTIONS_JSON CACHE_DIR WORKERS``, with ``RANK`` and
``WORLD_SIZE`` in the environment (as torchrun sets them); prints its first batch's keys as JSON.
"""

from __future__ import annotations

import json
import sys

from shardstream import ShardDataset


def main() -> None:
    url, options, cache, workers = (
        sys.argv[1],
        json.loads(sys.argv[2]),
        sys.argv[3],
        int(sys.argv[4]),
    )
    ds = ShardDataset(url, decode=None, seed=5, storage_options=options, cache_dir=cache)
    batches = list(ds.loader(batch_size=8, num_workers=workers, workers="processes"))
    print(json.dumps(list(batches[0]["__key__"])))


if __name__ == "__main__":
    main()
