"""Tar shards in the WebDataset convention, written and parsed without ``tarfile``.

A sample is the members ``KEY.EXT`` sharing ``KEY`` (the member name up to the first dot of its base
name); the reader sees the whole shard, so a key's members need not be next to each other. Members
are written as plain POSIX ustar entries with fixed metadata (mode 0644, owner 0, mtime 0), so the
same samples always give the same bytes; a PAX header is added only for a name that ustar cannot
hold. The reader walks headers by offset over a buffer (bytes or a memory map) and hands out slices
(:mod:`.tar_headers` reads the headers)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptShardError
from .tar_headers import (
    LINK,
    MAX_SPARSE_SIZE,
    REGULAR,
    SPARSE,
    Listing,
    Scan,
    fast_listing,
    listing,
)
from .tar_index import index_bytes
from .tar_writer import (  # noqa: F401 - the writing side, under the names it had here
    BLOCK,
    END_OF_ARCHIVE,
    ZERO_BLOCK,
    TarShardWriter,
    member_header,
    member_size,
    padding,
    plain_header,
    sample_size,
)

# field names a manifest cannot hold: control characters, slashes, backslashes, bytes that are not UTF-8
_ODD_FIELD = re.compile(r"[\x00-\x1f\x7f-\x9f/\\\ud800-\udfff]")
_EXAMPLES = 3  # names a warning quotes


def iter_members(buf, name: str = "shard", check: bool = True) -> Iterator[tuple[str, int, int]]:
    """(member name, data offset, data size) of every regular file in the tar ``buf``, as tarfile reads them.

    Raises :class:`CorruptShardError` naming ``name`` and the byte offset for anything but a well-formed
    tar (bad checksums unless ``check=False``, odd numbers, truncation, data after the end, an empty file,
    what readers disagree on) and for a sparse member (its bytes are not in one piece: :func:`read_samples`
    reads it). Checksums are checked in batches: a consumer that stops early may have been handed members
    whose header is unchecked; one that reads to the end has had every header checked."""
    for kind, member, offset, size, _ in Scan(memoryview(buf), name, check).entries():
        if kind == REGULAR:
            yield member, offset, size
        elif kind == SPARSE:
            raise CorruptShardError(
                f"{name}: member {member!r} is a sparse file, whose bytes are not in one piece"
            )


def _index_plain(buf, name: str) -> tuple[list[str], list[int], list[int]] | None:
    """(names, data offsets, sizes) of a tar of plain ustar regular files (and folders), found with numpy;
    None when it has anything else (see :func:`.tar_headers.fast_listing`)."""
    found = fast_listing(buf, name)
    return None if found is None else (found.names, found.offsets, found.sizes)


def split_name(member: str) -> tuple[str, str] | None:
    """(key, lower-cased extension) of a member name, as WebDataset splits it; None without an extension."""
    slash = member.rfind("/") + 1
    dot = member.find(".", slash)
    if dot <= slash or dot == len(member) - 1:
        return None
    return member[:dot], member[dot + 1 :].lower()


@dataclass
class TarSamples:
    """The samples of one tar: per sample its key and ``{extension: (offset, size)}`` in :attr:`data`
    (the tar itself; with sparse members, a copy of it followed by their expanded bytes), and the members
    left out of every sample, by reason."""

    data: Any
    keys: list[str] = field(default_factory=list)
    fields: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    unkeyed: list[str] = field(default_factory=list)  # no KEY.EXT name
    reserved: list[str] = field(default_factory=list)  # keys starting with "__" (metadata)
    odd: list[str] = field(default_factory=list)  # field names a manifest cannot hold
    links: list[str] = field(
        default_factory=list
    )  # symbolic links, hard links to no earlier member
    scattered: list[str] = field(default_factory=list)  # keys whose members were apart
    sparse: int = 0  # sparse members, expanded

    def notes(self, where: str) -> list[str]:
        """One warning line per kind of member left out or regrouped, naming the shard ``where``."""
        out = []
        if self.scattered:
            out.append(
                f"{where}: the members of {_some(self.scattered, 'sample')} are not next to each "
                "other (the tar was written in folder order); they are grouped by key. Write tars "
                "with 'tar --sort=name' to keep each sample's members together"
            )
        reasons = (
            (self.links, "symbolic links, or hard links to no earlier member of the tar"),
            (
                self.odd,
                "an extension no field name can be (a backslash, a control character, bytes "
                "that are not UTF-8)",
            ),
            (self.reserved, "a key starting with '__' (metadata, such as __meta__/)"),
        )
        out += [
            f"{where}: {_some(names, 'member')} left out of every sample: {why}"
            for names, why in reasons
            if names
        ]
        return out


def _some(names: list[str], what: str) -> str:
    """'3 members (e.g. 'a', 'b', 'c')' with the names escaped."""
    shown = ", ".join(ascii(n) for n in names[:_EXAMPLES])
    more = ", ..." if len(names) > _EXAMPLES else ""
    return f"{len(names)} {what}{'s' if len(names) != 1 else ''} ({shown}{more})"


def _resolve(found: Listing, buf, where: str) -> tuple[list[tuple[str, int, int]], TarSamples]:
    """The members that hold a file, hard links resolved to their target's bytes and sparse members
    expanded (after a copy of ``buf``); symbolic links and links to no earlier member left out."""
    out = TarSamples(buf)
    members = list(zip(found.names, found.offsets, found.sizes))
    if not found.special:
        return members, out
    seen: dict[str, tuple[int, int]] = {}
    expanded: list[bytes] = []
    at = len(buf)
    kept = []
    for i, (member, offset, size) in enumerate(members):
        kind, detail = found.special.get(i, (REGULAR, None))
        if kind == SPARSE:
            if at - len(buf) + size > MAX_SPARSE_SIZE:
                raise CorruptShardError(
                    f"{where}: its sparse members expand to more than {MAX_SPARSE_SIZE} bytes in all"
                )
            piece = detail.expand(buf)  # type: ignore[union-attr]
            offset, at = at, at + len(piece)
            expanded.append(piece)
        elif kind == LINK:
            target = seen.get(detail) or seen.get(_plain_path(detail))  # type: ignore[arg-type]
            if target is None:
                out.links.append(member)
                continue
            offset, size = target
        elif kind != REGULAR:
            out.links.append(member)
            continue
        seen[member] = seen[_plain_path(member)] = (offset, size)
        kept.append((member, offset, size))
    if expanded:
        out.data, out.sparse = b"".join([bytes(buf), *expanded]), len(expanded)
    return kept, out


def _plain_path(path: str) -> str:
    """A member path without leading ``./`` (GNU tar keeps what it was given: ``./a`` or ``a``)."""
    while path.startswith("./"):
        path = path[2:]
    return path


def _group(members: Iterable[tuple[str, int, int]], name: str, out: TarSamples) -> TarSamples:
    """Members into samples by key, in the order of each key's first member: a member joins the latest
    sample of its key, wherever it is, unless that sample has its extension (then, after other keys, it
    starts a sample of its own, as streaming readers read it; right after, it is an error)."""
    numbers: dict[str, int] = {}
    keys, fields = out.keys, out.fields
    last = None
    for member, offset, size in members:
        slash = member.rfind("/") + 1  # split_name, inline: this loop runs once per member
        dot = member.find(".", slash)
        if dot <= slash or dot == len(member) - 1:
            out.unkeyed.append(member)
            continue
        key, ext = member[:dot], member[dot + 1 :].lower()
        if key.startswith("__"):
            out.reserved.append(member)
            continue
        if _ODD_FIELD.search(ext):
            out.odd.append(member)
            continue
        i = numbers.get(key)
        if i is not None and ext in fields[i]:
            if key == last:
                raise CorruptShardError(f"{name}: sample {key!r} has the member {member!r} twice")
            i = None  # the key again, after others, with a field it has: a sample of its own
        if i is None:
            numbers[key] = len(keys)
            keys.append(key)
            fields.append({ext: (offset, size)})
        else:
            fields[i][ext] = (offset, size)
            if key != last and (not out.scattered or out.scattered[-1] != key):
                out.scattered.append(key)
        last = key
    if out.scattered:
        out.scattered = list(dict.fromkeys(out.scattered))
    return out


def read_samples(buf, name: str = "shard", check: bool = True) -> TarSamples:
    """The samples of the tar ``buf`` (see :class:`TarSamples`): every header read (by the numpy path when
    the tar allows it), members grouped by key, hard links and sparse members resolved."""
    members, out = _resolve(listing(buf, name, check), buf, name)
    return _group(members, name, out)


def _in_place(found: TarSamples, name: str) -> TarSamples:
    if found.sparse:
        raise CorruptShardError(
            f"{name}: {found.sparse} sparse member(s), whose bytes are not in one piece of the tar; "
            "read the shard with read_samples"
        )
    return found


def iter_samples(
    buf, name: str = "shard", check: bool = True, unkeyed: list[str] | None = None
) -> Iterator[tuple[str, dict[str, tuple[int, int]]]]:
    """(key, {extension: (offset, size)}) for each sample of the tar ``buf`` (offsets in ``buf``), as
    :func:`read_samples` groups them. Members without ``KEY.EXT`` form are skipped and, when ``unkeyed``
    is given, appended to it."""
    found = _in_place(read_samples(buf, name, check), name)
    if unkeyed is not None:
        unkeyed += found.unkeyed
    return iter(list(zip(found.keys, found.fields)))


def index_samples(buf, name: str = "shard") -> tuple[list[str], list[dict[str, tuple[int, int]]]]:
    """Keys and per-field (offset, size) in ``buf`` of every sample, as :func:`read_samples` gives them."""
    found = _in_place(read_samples(buf, name), name)
    return found.keys, found.fields


def build_index(
    buf,
    name: str = "shard",
    samples: TarSamples | None = None,
    checked: bool = False,
    compressed: bool = False,
) -> bytes | None:
    """The sample index (:mod:`.tar_index`) of the tar ``buf`` (uncompressed), from its own headers read
    strictly: for a tar packed without one (another tool's, or ``--no-index``). A tar whose samples are
    no runs of members (members apart, hard links) gets a version 2 index; one with sparse members, whose
    bytes are not in the tar as they are read, none (``None``). ``samples``: what :func:`read_samples`
    gave, if the caller read the tar already. ``checked``: version 3, with each member's checksum of its
    bytes as they are now (``shardstream index``, whose manifest vouches for them by their sha256);
    ``compressed``: ``buf`` is the tar of a compressed shard (version 3, offsets in ``buf``)."""
    found = samples if samples is not None else read_samples(buf, name)
    if found.sparse:
        return None
    return index_bytes(buf, list(zip(found.keys, found.fields)), checked, compressed)
