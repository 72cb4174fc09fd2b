"""webdataset: reads shardstream's tars (they are WebDataset tars, so both read identical bytes).

Shuffle: ``shardshuffle`` plus ``.shuffle(1000)``. Decoding (pillow, fast) in its ``map_tuple``.

Remote: the same tars as ``s3://`` URLs, opened through an fsspec (s3fs) handler registered in
``webdataset.gopen_schemes["s3"]`` (webdataset 1.0.2 has none of its own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import BATCH_SIZE, WORKERS
from ..decoding import image_decoder
from .base import RemoteSource

DATA = "shardstream"  # the conversion it reads: shardstream's tars
WDS_SHUFFLE_BUFFER = 1000
SHUFFLE = f"shardshuffle + .shuffle({WDS_SHUFFLE_BUFFER})"


class FsspecOpener:
    """A ``webdataset.gopen_schemes`` handler for ``s3://`` URLs through fsspec (s3fs) at ``endpoint``.

    webdataset 1.0.2 has no ``s3://`` handler of its own; this is what its users register.
    """

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kwargs: Any) -> Any:
        import fsspec

        return fsspec.open(url, mode, endpoint_url=self.endpoint).open()


def loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("*.tar"))
    if remote is not None:  # the same tars, in the bucket
        wds.gopen_schemes["s3"] = FsspecOpener(remote.endpoint)
        urls = [remote.url("shardstream", Path(u).name) for u in urls]
    # a worker may get no shard
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
    dataset = dataset.shuffle(WDS_SHUFFLE_BUFFER).to_tuple("jpg", "cls")
    decode = image_decoder(mode)
    if decode is not None:
        dataset = dataset.map_tuple(decode, int)
    return wds.WebLoader(dataset.batched(BATCH_SIZE), batch_size=None, num_workers=WORKERS)
