"""What the tools' readers share: where a remote run reads, and the labelled list of images to convert."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from _data import ImageSet


@dataclass(frozen=True)
class RemoteSource:
    """Where a remote run reads (``--remote``): an S3 endpoint (moto or a proxy to it), a bucket, and an
    empty scratch folder of this run for the tools' local caches, removed after the run."""

    endpoint: str
    bucket: str
    scratch: Path

    def url(self, prefix: str, name: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}" + (f"/{name}" if name else "")


def labelled_files(images: ImageSet) -> list[tuple[str, int]]:
    """(path, class index) of every image, in sorted (class, name) order, as shardstream packs them."""
    index = {name: i for i, name in enumerate(images.classes)}
    return [(str(p), index[p.parent.name]) for p in images.files()]
