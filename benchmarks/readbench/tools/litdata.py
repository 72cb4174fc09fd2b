"""litdata: ``optimize`` writes the data, ``StreamingDataset`` and ``StreamingDataLoader`` read it.

Conversion: ``optimize`` with the same two fields (``jpg`` bytes, ``cls``), ``chunk_bytes`` 64 MB. Shuffle:
``shuffle=True`` (chunk order plus in-chunk blocks). Decoding (pillow, fast) in its ``transform``.

Remote: ``StreamingDataset("s3://BUCKET/litdata", storage_options={"endpoint_url": ...})``; litdata
0.2.76 cannot read a plain-http endpoint (its obstore client refuses the scheme), which is tried once
and reported as such, not as a failure (:func:`remote_limitation`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _data import ImageSet

from ..config import BATCH_SIZE, SHARD_SIZE, WORKERS
from ..decoding import DecodeSample, image_decoder
from .base import RemoteSource, labelled_files

DATA = "litdata"  # the conversion it reads
SHUFFLE = "shuffle=True (chunk order + in-chunk blocks)"


def litdata_sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label}


def write(images: ImageSet, out: Path) -> None:
    from litdata import optimize

    optimize(
        fn=litdata_sample,
        inputs=labelled_files(images),
        output_dir=str(out),
        chunk_bytes=SHARD_SIZE,
        num_workers=WORKERS,
        reorder_files=False,
        verbose=False,
    )


def loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    decode = image_decoder(mode)
    transform = None if decode is None else DecodeSample(decode)
    if remote is None:
        dataset = StreamingDataset(input_dir=str(data), shuffle=True, seed=0, transform=transform)
    else:
        dataset = StreamingDataset(
            input_dir=remote.url("litdata"),
            cache_dir=str(remote.scratch / "litdata"),
            storage_options={"endpoint_url": remote.endpoint},
            shuffle=True,
            seed=0,
            transform=transform,
        )
    return StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS)


def remote_limitation(output: str) -> str | None:
    """The known limitation behind a failed remote run, if its output shows it."""
    if "BadScheme" in output:
        return "cannot read a plain-http S3 endpoint (its obstore client refuses the scheme: BadScheme)"
    return None
