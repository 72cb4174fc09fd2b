"""Conditional writes, the words: what a write expects to find, and the error when it does not.

A store's :meth:`~shardstream.storage.store.Store.read_tagged` gives an object's bytes with a tag of
their version; its :meth:`~shardstream.storage.store.Store.write_if` writes a name only if it still
holds nothing (``Expect(None)``) or that version (``Expect(tag)``), else raises
:class:`WriteConflict`. That is what makes a publish exclusive: of two writers that read the same
version, one writes and the other is refused. Each backend does it its own way:

- local folders (:mod:`.local_store`): the data goes to a temporary file beside the name (synced
  with ``fsync``); a new name is made by a hard link of it (atomic and exclusive on local and network
  file systems), a version is replaced by a check and rename under an exclusive ``flock`` on the
  folder (writers through these methods exclude each other). The tag is the sha256 of the bytes.
- S3 (:mod:`.s3_store`): one PUT with ``If-None-Match: *`` or ``If-Match: <ETag>``; the store answers
  412 when the condition fails. AWS S3, moto (5.2) and SeaweedFS (4.48) honour both;
  ``honours_conditions`` asks a store (one scratch object), because a server that does not know the
  headers just writes.
- other object stores (GCS, memory): no conditional writes here; ``write_if`` writes unconditionally
  and ``honours_conditions`` says ``False``, so that callers check afterwards instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StorageError


class WriteConflict(StorageError):
    """A conditional write found its name holding something other than it expected: another writer was first."""


@dataclass(frozen=True)
class Expect:
    """What a conditional write expects to replace: ``tag=None`` nothing (the name is free), else the version
    whose ``read_tagged`` tag this is."""

    tag: str | None = None

    def conflict(self, url: str, found: str | None = "") -> WriteConflict:
        """The error of a write to ``url`` that found ``found`` (``None``: nothing) instead."""
        held = (
            "already exists"
            if self.tag is None
            else "is gone"
            if found is None
            else "holds another version than expected"
        )
        return WriteConflict(f"cannot write {url}: it {held} (another writer was first)")


__all__ = ["Expect", "WriteConflict"]
