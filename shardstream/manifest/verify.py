"""``verify``: every shard present, of the right size and checksum, and every sample parses."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardstreamError
from ..formats import count_samples
from ..storage import Store
from .files import dataset_store, load_manifest
from .schema import Manifest


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`: one problem line per damaged shard."""

    url: str
    manifest: Manifest
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_shard(store: Store, manifest: Manifest, i: int) -> str | None:
    """A description of what is wrong with shard ``i``, or None if it is sound."""
    name = manifest.paths[i]
    where = store.url_of(name)
    try:
        data = store.read_bytes(name)
        size = len(data)
        if size != manifest.nbytes[i]:
            return f"{where}: {size} bytes, the manifest says {manifest.nbytes[i]} (truncated or replaced)"
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest.sha256[i]:
            expected = manifest.sha256[i]
            return f"{where}: checksum mismatch (sha256 {digest[:16]}..., the manifest says {expected[:16]}...)"
        count = count_samples(manifest.shard_format, data, where)
    except ShardstreamError as exc:
        return str(exc)
    if count != manifest.samples[i]:
        return f"{where}: {count} samples, the manifest says {manifest.samples[i]}"
    return None


def verify(
    url: str,
    storage_options: dict[str, Any] | None = None,
    workers: int = 4,
    on_shard: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check every shard of the dataset at ``url`` against its manifest.

    ``on_shard(nbytes)`` is called as each shard is done (for progress).
    """
    store = dataset_store(url, storage_options)
    manifest = load_manifest(store)
    report = VerifyReport(store.url, manifest)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        results = pool.map(lambda i: check_shard(store, manifest, i), range(manifest.num_shards))
        for i, problem in enumerate(results):
            if problem:
                report.problems.append(problem)
            if on_shard:
                on_shard(int(manifest.nbytes[i]))
    return report
