"""``PackResult``: what a pack produced, and how fast."""

from __future__ import annotations

from dataclasses import dataclass

from ..manifest import Manifest
from ..sizes import count, format_size


@dataclass
class PackResult:
    """What a pack produced, and how fast.

    Args:
        url: where the dataset was written.
        manifest: its manifest (``samples``, ``shards``, ``nbytes`` and ``fingerprint`` read it).
        seconds: how long the pack took.
        skipped_hidden: hidden files and folders (leading ``.``) left out.
        source_bytes: a folder's file bytes (what the progress bar counts), or None.
    """

    url: str
    manifest: Manifest
    seconds: float
    skipped_hidden: int = 0
    source_bytes: int | None = None  # a folder's file bytes: what the progress bar counts

    @property
    def fingerprint(self) -> str:
        """sha256 of the dataset's contents (shards, counts, fields, classes), not of its creation info:
        equal for two packs of the same source, whose manifests differ in their creation time."""
        return self.manifest.fingerprint

    @property
    def samples(self) -> int:
        return self.manifest.num_samples

    @property
    def shards(self) -> int:
        return self.manifest.num_shards

    @property
    def nbytes(self) -> int:
        return self.manifest.total_bytes

    def summary(self) -> str:
        if self.manifest.shard_format == "tokens":  # documents and tokens, not samples
            return token_summary(self.url, self.manifest, self.seconds)
        created = self.manifest.created or {}
        shard = self.manifest.shard_format + " shard"
        files = (
            ""
            if self.source_bytes is None
            else f" (from {format_size(self.source_bytes)} of files)"
        )
        if created.get("operation") == "append" and "appended_shards" in created:
            # what this run wrote, then the version it made: the dataset's shards and this run's
            nbytes = int(created["appended_bytes"])
            line = (
                f"appended {count(int(created['appended_samples']), 'sample')} in "
                f"{count(int(created['appended_shards']), shard)}, {format_size(nbytes)}{files} in "
                f"{self.seconds:.2f} s ({_rate(nbytes, self.seconds)}) -> {self.url} (version "
                f"{self.manifest.version}: {count(self.samples, 'sample')} in "
                f"{count(self.shards, 'shard')}, {format_size(self.nbytes)})"
            )
        else:
            line = (
                f"packed {count(self.samples, 'sample')} into {count(self.shards, shard)}, "
                f"{format_size(self.nbytes)}{files} in {self.seconds:.2f} s "
                f"({_rate(self.nbytes, self.seconds)}) -> {self.url}"
            )
        layout = (self.manifest.created or {}).get("layout")
        classes = self.manifest.classes
        if layout:
            line += f"; layout {layout}" + (
                "" if classes is None else f", {count(len(classes), 'class', 'classes')}"
            )
        if self.skipped_hidden:
            line += f" (skipped {self.skipped_hidden} hidden files and folders)"
        return line


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6 if seconds > 0 else float('inf'):.1f} MB/s"


def token_summary(url: str, manifest: Manifest, seconds: float) -> str:
    """A token pack's result line: documents, tokens, shards and rate."""
    t, m = manifest.tokens or {}, manifest
    rate = t.get("total", 0) / seconds if seconds > 0 else float("inf")
    return (
        f"packed {count(m.num_samples, 'document')}, {count(t.get('total', 0), str(t.get('dtype')) + ' token')} "
        f"into {count(m.num_shards, 'token shard')}, {format_size(m.total_bytes)} in "
        f"{seconds:.2f} s ({rate:,.0f} tokens/s) -> {url}"
    )


__all__ = ["PackResult", "token_summary"]
