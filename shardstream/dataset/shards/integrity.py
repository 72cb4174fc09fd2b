"""Datasets whose shards have no per-sample checksums (packed by 0.5.0 or earlier, tars indexed by then or
packed with ``--no-index``): read as before, unchecked, with one warning per dataset and process that
says so and how to add them."""

from __future__ import annotations

import logging
import threading

from ...formats.checksums import NAME

log = logging.getLogger("shardstream")

_WARNED: set[str] = set()  # datasets this process warned of
_LOCK = threading.Lock()


def unchecked(url: str, what: str = "its shards have") -> None:
    """Warn, once per process, that the dataset at ``url`` is read without per-sample checksums."""
    with _LOCK:
        if url in _WARNED:
            return
        _WARNED.add(url)
    log.warning(
        "%s: %s no per-sample checksums (%s; packed by shardstream 0.5.0 or earlier, indexed by it, or "
        "packed with --no-index), so damage inside a sample is not noticed as it is read; "
        "'shardstream upgrade %s' adds them",
        url,
        what,
        NAME,
        url,
    )


__all__ = ["unchecked"]
