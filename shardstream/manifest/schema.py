"""The manifest itself: one JSON file, written last, that makes a folder of shards a dataset.

Per-shard data is stored column by column (a list of paths, a list of counts, ...),
so a manifest of a million shards is a few flat JSON arrays and loads in about a
second. Nothing in it grows with the number of samples.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from ..errors import ManifestError

MANIFEST_NAME = "_manifest.json"
FORMAT_VERSION = 1
SHARD_FORMATS = ("tar", "tar.zst", "tar.gz", "arrow")


def shard_name(index: int, shard_format: str) -> str:
    """Deterministic shard file name: ``shard-000000.tar``."""
    return f"shard-{index:06d}.{shard_format}"


@dataclass
class Manifest:
    """What a dataset is: its shards (path, samples, bytes, sha256), fields and classes."""

    shard_format: str
    paths: list[str]
    samples: np.ndarray
    nbytes: np.ndarray
    sha256: list[str]
    fields: list[dict[str, Any]] = field(default_factory=list)
    classes: list[str] | None = None
    arrow_schema: str | None = None
    created: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import numpy as np  # on first use: the command line starts faster without it

        self.samples = np.asarray(self.samples, dtype=np.int64)
        self.nbytes = np.asarray(self.nbytes, dtype=np.int64)

    @property
    def num_shards(self) -> int:
        return len(self.paths)

    @property
    def num_samples(self) -> int:
        return int(self.samples.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, sample within shard) of the dataset's ``index``-th sample."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} is out of range: the dataset has {self.num_samples} samples")
        import numpy as np

        ends = np.cumsum(self.samples)
        shard = int(np.searchsorted(ends, index, side="right"))
        return shard, index - int(ends[shard] - self.samples[shard])

    def to_json(self) -> bytes:
        doc = {
            "shardstream_manifest": FORMAT_VERSION,
            "shard_format": self.shard_format,
            "num_shards": self.num_shards,
            "num_samples": self.num_samples,
            "total_bytes": self.total_bytes,
            "fields": self.fields,
            "classes": self.classes,
            "arrow_schema": self.arrow_schema,
            "created": self.created,
            "shards": {
                "path": self.paths,
                "samples": self.samples.tolist(),
                "bytes": self.nbytes.tolist(),
                "sha256": self.sha256,
            },
        }
        return (json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str, source: str = "manifest") -> Manifest:
        """Parse and check a manifest; ``source`` names it in errors."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{source} is not valid JSON ({exc}); re-create it with 'shardstream index'") from exc
        if not isinstance(doc, dict) or "shardstream_manifest" not in doc:
            raise ManifestError(f"{source} is not a shardstream manifest")
        version = doc["shardstream_manifest"]
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ManifestError(
                f"{source} has manifest version {version!r}; this shardstream reads up to "
                f"version {FORMAT_VERSION}, upgrade shardstream"
            )
        import numpy as np

        try:
            shards = doc["shards"]
            paths, sha = list(shards["path"]), list(shards["sha256"])
            samples = np.asarray(shards["samples"], dtype=np.int64)
            nbytes = np.asarray(shards["bytes"], dtype=np.int64)
            shard_format = doc["shard_format"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{source} is damaged: missing or malformed {exc}") from exc
        if shard_format not in SHARD_FORMATS:
            raise ManifestError(f"{source}: unknown shard format {shard_format!r}")
        if not len(paths) == len(sha) == len(samples) == len(nbytes):
            raise ManifestError(f"{source} is damaged: the shard columns have different lengths")
        if len(samples) and (samples.min() < 0 or nbytes.min() < 0):
            raise ManifestError(f"{source} is damaged: negative sample or byte counts")
        for total, actual in (("num_samples", int(samples.sum())), ("total_bytes", int(nbytes.sum())),
                              ("num_shards", len(paths))):
            if doc.get(total, actual) != actual:
                raise ManifestError(f"{source} is damaged: {total} does not agree with the shard list")
        return cls(
            shard_format=shard_format,
            paths=paths,
            samples=samples,
            nbytes=nbytes,
            sha256=sha,
            fields=list(doc.get("fields") or []),
            classes=doc.get("classes"),
            arrow_schema=doc.get("arrow_schema"),
            created=dict(doc.get("created") or {}),
        )


def creation_info(source: str | None = None, **extra: Any) -> dict[str, Any]:
    """Who made the dataset, when, from what."""
    from ..version import __version__

    info: dict[str, Any] = {
        "by": f"shardstream {__version__}",
        "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    if source is not None:
        info["source"] = source
    info.update(extra)
    return info
