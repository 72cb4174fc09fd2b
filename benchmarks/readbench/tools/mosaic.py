"""mosaicml-streaming: ``MDSWriter`` writes the data, ``StreamingDataset`` reads it.

Conversion: ``MDSWriter`` with columns ``jpg: bytes``, ``cls: int`` and ``size_limit`` 64 MB. Shuffle:
``shuffle=True`` (its default ``py1e`` algorithm). Decoding (pillow, fast) in ``get_item``.

Remote: ``StreamingDataset(remote="s3://BUCKET/mosaic", local=<scratch>)``, its boto3 client pointed at
the endpoint by ``S3_ENDPOINT_URL``; the client its constructor used (for ``index.json``) is dropped
before the DataLoader forks, because streaming 0.13.0 lets forked workers share its kept-alive
connection (crossed responses: 60 s stalls and corrupt shards through the proxy; moto itself closes
every connection, so direct reads never show it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from _data import ImageSet

from ..config import BATCH_SIZE, SHARD_BYTES, WORKERS
from ..decoding import image_decoder
from .base import RemoteSource, labelled_files

DATA = "mosaic"  # the conversion it reads
SHUFFLE = "shuffle=True (py1e, default block size)"


def write(images: ImageSet, out: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(
        out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit=SHARD_BYTES
    ) as writer:
        for path, label in labelled_files(images):
            writer.write({"jpg": Path(path).read_bytes(), "cls": label})


def loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    decode = image_decoder(mode)

    class Decoded(StreamingDataset):
        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            sample = super().get_item(sample_id, retry)
            return (
                sample if decode is None else {"jpg": decode(sample["jpg"]), "cls": sample["cls"]}
            )

    if remote is None:
        dataset = Decoded(local=str(data), batch_size=BATCH_SIZE, shuffle=True, shuffle_seed=0)
    else:  # its boto3 client takes the endpoint from S3_ENDPOINT_URL; a fresh, empty local folder
        os.environ["S3_ENDPOINT_URL"] = remote.endpoint
        dataset = Decoded(
            remote=remote.url("mosaic"),
            local=str(remote.scratch / "mosaic"),
            batch_size=BATCH_SIZE,
            shuffle=True,
            shuffle_seed=0,
        )
        # streaming 0.13.0 keeps the boto3 client that fetched index.json here, and forked workers inherit it:
        # they share its kept-alive connection, their responses cross (a request waits out its 60 s timeout, or a
        # shard arrives corrupt). moto closes every connection, so only the proxy, like S3, shows it. Drop it.
        for stream in dataset.streams:
            stream._downloader.clean_up()
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS)
