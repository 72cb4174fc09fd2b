"""A batch of a tar shard's samples located in its sample index at once: what a sampler's batch of random reads needs.

A map-style read of 64 random samples touches a few samples of each of many shards, so its cost is the
work per sample, not per byte. :class:`BatchEntries` keeps, per shard, one table of every sample's
numbers (where its member names lie, and each member's data offset, size and checksum) when every sample
has the same number of members, the usual case: a batch's rows are then one ``numpy`` gather and one
``tolist``. Each sample's key and fields come from its member names, checked as
:meth:`~shardstream.formats.tar_index.IndexedSamples.sample` checks them (one key, then a dot and a
distinct extension without a slash), by comparing the names with those of the shard's first such sample:
``key.jpg\\0key.cls`` is the key joined by the first sample's extensions, a few byte operations instead
of parsing each name. A sample whose names are not of that form is parsed on its own, with its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .tar_index import IndexedSamples, MemberNames

if TYPE_CHECKING:
    import numpy as np


@dataclass
class Gathered:
    """The index entries of a batch of samples: per sample its key, its fields' names in member order, and
    its numbers (``[_, _, offset, size, checksum, offset, size, checksum, ...]``: a member's data offset,
    size and checksum from position 2 on, three each; checksums are 0 in an index without them)."""

    keys: list[str]
    fields: list[list[str]]
    numbers: list[list[int]]


@dataclass(frozen=True)
class _Form:
    """The names of a shard's first sample of the common form: a key, then per member a dot and an
    extension; what joins another sample's key into its names (``parts``), and their length without it."""

    parts: list[bytes]
    fixed: int
    members: int
    fields: list[str]


class BatchEntries:
    """Batches of one shard's index entries (see the module)."""

    def __init__(self, indexed: IndexedSamples):
        self.indexed = indexed
        # the shard's table, or None when its samples differ in members; unset until first asked for
        # (one attribute: threads that share the shard see either none or the whole)
        self._table: np.ndarray | None | bool = False
        self._form: _Form | None = None

    def many(self, rows: list[int]) -> Gathered:
        """The entries of ``rows`` (each in ``range(len(indexed))``), in order."""
        table = self._table
        if table is False:
            table = self._table = self._build()
        if table is None:
            return self._general(rows)
        numbers = table[rows].tolist()
        text = self.indexed.index.names.text  # type: ignore[attr-defined]
        keys: list[str] = []
        fields: list[list[str]] = []
        form = self._form
        for i, row in zip(rows, numbers):
            run = text[row[0] : row[1]]
            found = _in_form(run, form) if form is not None else None
            if found is None:
                found = self._parse(i, run)
            keys.append(found[0])
            fields.append(found[1])
        return Gathered(keys, fields, numbers)

    def _build(self) -> np.ndarray | None:
        """The shard's table of numbers, if its samples have as many members each and its names are
        :class:`~shardstream.formats.tar_index.MemberNames` (an index read from a file); else None."""
        import numpy as np

        index = self.indexed.index
        first = index.first
        counts = np.diff(first)
        names = index.names
        if not (isinstance(names, MemberNames) and len(counts) and counts.min() == counts.max()):
            return None
        n, c = len(counts), int(counts[0])
        table = np.zeros((n, 2 + 3 * c), dtype=np.uint64)
        starts = first[:-1]
        table[:, 0] = names.begins[starts]
        table[:, 1] = names.stops[starts + c - 1]
        sums = index.checksums
        for j in range(c):
            table[:, 2 + 3 * j] = index.data_offsets[starts + j]
            table[:, 3 + 3 * j] = index.sizes[starts + j]
            if sums is not None:
                table[:, 4 + 3 * j] = sums[starts + j]
        return table

    def _parse(self, i: int, run: bytes) -> tuple[str, list[str]]:
        """Sample ``i``'s key and fields from its names ``run`` parsed on their own (the first of the common
        form sets the shard's form); raises as :meth:`IndexedSamples.sample` does for names of no sample."""
        members = run.decode("utf-8", "surrogateescape").split("\0")
        found = _split_names(members)
        if found is None:
            key, entry = self.indexed.sample(i)
            return key, list(entry)
        if self._form is None:
            self._form = _form_of(members, found)
        return found

    def _general(self, rows: list[int]) -> Gathered:
        """The entries of ``rows`` one sample at a time (samples with differing numbers of members)."""
        indexed = self.indexed
        sums = indexed.index.checksums
        keys, fields, numbers = [], [], []
        for i in rows:
            key, entry = indexed.sample(i)
            start = indexed.first[i]
            row = [0, 0]
            for j, (offset, size) in enumerate(entry.values()):
                row += (offset, size, int(sums[start + j]) if sums is not None else 0)
            keys.append(key)
            fields.append(list(entry))
            numbers.append(row)
        return Gathered(keys, fields, numbers)


def _form_of(members: list[str], found: tuple[str, list[str]]) -> _Form:
    """The form of a sample whose names ``members`` split into ``found`` (key, fields)."""
    key = found[0].encode("utf-8", "surrogateescape")
    exts = [m.encode("utf-8", "surrogateescape")[len(key) :] for m in members]
    parts = [b""] + [e + b"\0" for e in exts[:-1]] + [exts[-1]]
    return _Form(parts, sum(map(len, exts)) + len(exts) - 1, len(exts), found[1])


def _in_form(run: bytes, form: _Form) -> tuple[str, list[str]] | None:
    """The key and fields of the sample whose names are ``run``, if they are of ``form``: its key joined by
    the form's extensions, a key with no dot after its last slash and something after it; else None."""
    size, rest = divmod(len(run) - form.fixed, form.members)
    if rest or size <= 0:
        return None
    key = run[:size]
    if (
        key.join(form.parts) != run
        or key.endswith(b"/")
        or key.find(b".", key.rfind(b"/") + 1) >= 0
    ):
        return None
    return key.decode("utf-8", "surrogateescape"), form.fields


def _split_names(members: list[str]) -> tuple[str, list[str]] | None:
    """A sample's key and its fields' names (lower case, in member order) from its member names, if every
    member is the first's key, a dot and a distinct extension without a slash (what
    :meth:`~shardstream.formats.tar_index.IndexedSamples.sample` accepts of such names); None otherwise."""
    head = members[0]
    slash = head.rfind("/") + 1
    dot = head.find(".", slash)
    if dot <= slash or dot == len(head) - 1:
        return None
    prefix, k = head[: dot + 1], dot + 1
    exts = []
    for member in members:
        ext = member[k:]
        if not member.startswith(prefix) or not ext or "/" in ext:
            return None
        exts.append(ext.lower())
    if len(exts) > 1 and len(set(exts)) != len(exts):
        return None
    return head[:dot], exts


__all__ = ["BatchEntries", "Gathered"]
