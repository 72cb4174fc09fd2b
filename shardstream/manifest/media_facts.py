"""Each sample's media facts (duration, frame rate, size, sample rate, ...), recorded at pack time in a
side file the manifest names, as :mod:`.image_sizes` records image sizes.

``pack`` reads every video field (``mp4``, ``webm``, ``mkv``, ``mov``, ``avi``) and audio field (``wav``,
``flac``, ``mp3``, ``ogg``, ``m4a``) **from its container headers** (:mod:`shardstream.formats.media_header`,
never decoding every frame) and writes the facts once per dataset to
``.shardstream/media-<16 hex>-<16 hex>.npy``; ``media`` in the manifest's head names it
(``{file, sha256, fields, kinds, codecs, samples}``). The file is a flat NumPy ``float64`` array: the
number of shards ``n``, the number of fields ``k``, each shard's sample count, then per field and per
column of :data:`COLUMNS` every sample's value (samples in manifest order). 0 means unknown (the sample
lacks the field, or its headers do not read); the ``codec`` column is 1 + the codec's place in the head's
``codecs``. Recorded only where PyAV is installed when packing; read by ``shardstream info`` and what
plans from durations, never by a plain read. The file is untrusted input, checked as image sizes are.

Media fields of more than one block (:data:`BLOCK`, 1 MiB) also get each block's blake2b-128 digest, in a
second side file ``.shardstream/media_blocks-<16 hex>-<16 hex>.npy`` the reference names under
``blocks`` (``{file, sha256}``): a reader that fetches only the blocks a clip needs from object storage
checks each against it (:mod:`shardstream.dataset.shards.media_ranges`), as a whole sample is checked
against its sha256. It is a flat NumPy ``uint64`` array: the block size, the number of samples ``t``,
the number of fields ``k``, then ``k * t + 1`` block numbers (field ``f``'s sample ``j`` has blocks
``starts[f * t + j]:starts[f * t + j + 1]``), then each block's 16-byte digest as two ``uint64``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ManifestError
from ..formats.media_header import MediaHeader, import_av, media_header, media_kind
from .side_arrays import encode_array, load_array
from .side_names import side_name_fits

MEDIA_PREFIX, MEDIA_SUFFIX = "media-", ".npy"
COLUMNS = ("duration", "fps", "frames", "width", "height", "sample_rate", "channels", "codec")
_KEYS = {"file", "sha256", "fields", "kinds", "codecs", "samples"}
BLOCKS_PREFIX, BLOCKS_SUFFIX = "media_blocks-", ".npy"
BLOCK = 1 << 20  # bytes per digested block of a large media field
DIGEST = 16  # blake2b-128


def block_digests(data: bytes | bytearray | memoryview, block: int = BLOCK) -> bytes:
    """The blake2b-128 digests of ``data``'s blocks of ``block`` bytes (the last may be shorter), joined."""
    view = memoryview(data).cast("B")
    return b"".join(
        hashlib.blake2b(view[a : a + block], digest_size=DIGEST).digest()
        for a in range(0, len(view), block)
    )


@functools.lru_cache(maxsize=1)
def _av_installed() -> bool:
    """Whether PyAV imports here (without it nothing is recorded: no side file of zeros)."""
    try:
        import_av()
    except ImportError:
        return False
    return True


class ShardMedia:
    """What a writer records of one shard: per media field, each sample's header facts."""

    def __init__(self) -> None:
        self.samples = 0
        self.found: dict[str, list[tuple[int, MediaHeader]]] = {}
        self.blocks: dict[str, dict[int, bytes]] = {}  # per field: sample -> its blocks' digests

    def record(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Record field ``name`` of the current sample, if it is video or audio (read at once)."""
        ext = name.rsplit(".", 1)[-1].lower()
        if media_kind(ext) is None or not _av_installed():
            return
        found = media_header(data, ext)
        if len(data) > BLOCK:  # read by the blocks a clip needs: each block checked on its own
            self.blocks.setdefault(name, {})[self.samples] = block_digests(data)
        self.found.setdefault(name, []).append(
            (self.samples, found or MediaHeader(media_kind(ext)))
        )

    def end_sample(self) -> None:
        self.samples += 1


@dataclass
class MediaFacts:
    """The media facts of a dataset: ``columns[field][column]`` per sample (manifest order, 0: unknown);
    ``kinds[field]`` is ``"video"`` or ``"audio"``; ``reference`` what the manifest's head holds; ``data``
    the side file's bytes while it is still to be written. ``blocks[field][j]``: the block digests of
    sample ``j``'s field (``b""``: none recorded), ``blocks_data`` their side file's bytes to write."""

    counts: np.ndarray
    fields: list[str]
    kinds: dict[str, str]
    codecs: list[str]
    columns: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    data: bytes | None = None
    blocks: dict[str, list[bytes]] = field(default_factory=dict)
    blocks_data: bytes | None = None

    def block_digests(self, name: str, row: int) -> bytes:
        """The recorded block digests of field ``name`` of sample ``row`` (manifest order); b"" if none."""
        found = self.blocks.get(name)
        return found[row] if found is not None and 0 <= row < len(found) else b""

    def codec_names(self, name: str) -> list[str]:
        """Field ``name``'s codec per sample, ``""`` where unknown."""
        names = ["", *self.codecs]
        return [names[int(c)] for c in self.columns[name]["codec"]]


def encode_media_facts(shards: Sequence[ShardMedia]) -> MediaFacts | None:
    """The side file of the shards' recorded facts (in manifest order); None when no shard has media."""
    fields = sorted({name for s in shards for name in s.found})
    if not fields:
        return None
    found = [h for s in shards for hs in s.found.values() for _, h in hs]
    codecs = sorted({h.codec for h in found if h.codec})
    place = {c: i + 1 for i, c in enumerate(codecs)}
    counts = np.array([s.samples for s in shards], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    table = np.zeros((len(fields), len(COLUMNS), int(counts.sum())), dtype=np.float64)
    kinds = {}
    blocks: dict[str, list[bytes]] = {}
    for f, name in enumerate(fields):
        kinds[name] = media_kind(name.rsplit(".", 1)[-1].lower()) or ""
        digests = [b""] * int(counts.sum())
        for s, shard in enumerate(shards):
            for i, h in shard.found.get(name, []):
                row = [getattr(h, c) for c in COLUMNS[:-1]] + [place.get(h.codec, 0)]
                table[f, :, starts[s] + i] = row
            for i, d in shard.blocks.get(name, {}).items():
                digests[starts[s] + i] = d
        blocks[name] = digests
    return _encoded(counts, fields, kinds, codecs, table, blocks)


def _encoded(
    counts: np.ndarray,
    fields: list[str],
    kinds: dict[str, str],
    codecs: list[str],
    table: np.ndarray,
    blocks: dict[str, list[bytes]],
) -> MediaFacts:
    array = np.concatenate(
        [np.array([len(counts), len(fields)], dtype=np.float64), counts.astype(np.float64)]
        + [table.reshape(-1)]
    )
    data, reference = encode_array(array, MEDIA_PREFIX, MEDIA_SUFFIX)
    reference.update(
        fields=fields, kinds=[kinds[f] for f in fields], codecs=codecs, samples=int(counts.sum())
    )
    facts = MediaFacts(counts, fields, kinds, codecs, _columns(fields, table), reference, data)
    if any(d for name in fields for d in blocks.get(name, ())):
        facts.blocks = {name: list(blocks.get(name, [b""] * int(counts.sum()))) for name in fields}
        facts.blocks_data, reference["blocks"] = _encoded_blocks(
            fields, int(counts.sum()), facts.blocks
        )
    return facts


def _encoded_blocks(
    fields: list[str], total: int, blocks: dict[str, list[bytes]]
) -> tuple[bytes, dict[str, str]]:
    """The block digests' side file (see the module) and its reference."""
    runs = [d for name in fields for d in blocks[name]]
    sizes = np.array([len(d) // DIGEST for d in runs], dtype=np.uint64)
    starts = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(sizes, dtype=np.uint64)])
    digests = np.frombuffer(b"".join(runs), dtype="<u8").astype(np.uint64)
    array = np.concatenate(
        [np.array([BLOCK, total, len(fields)], dtype=np.uint64), starts, digests]
    )
    return encode_array(array, BLOCKS_PREFIX, BLOCKS_SUFFIX)


def _columns(fields: list[str], table: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    return {name: {c: table[f, j] for j, c in enumerate(COLUMNS)} for f, name in enumerate(fields)}


def facts_of_shards(
    parts: Sequence[tuple[MediaFacts | None, Sequence[int], Sequence[int]]],
) -> MediaFacts | None:
    """The facts of shards picked from several datasets, in order, as a new side file (a merge, an
    append, a split part): ``parts`` are (recorded facts or None, each shard's sample count, the shards
    picked). The union of their fields; 0 (unknown) where a part does not record a field or has no
    facts; None when no part has any."""
    if all(facts is None for facts, _, _ in parts):
        return None
    fields = sorted({name for facts, _, _ in parts if facts is not None for name in facts.fields})
    kinds = {n: k for facts, _, _ in parts if facts is not None for n, k in facts.kinds.items()}
    codecs = sorted({c for facts, _, _ in parts if facts is not None for c in facts.codecs})
    counts, tables = [], []
    blocks: dict[str, list[bytes]] = {name: [] for name in fields}
    for facts, per_shard, keep in parts:
        per_shard = np.asarray(per_shard, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(per_shard)])
        rows = [np.arange(starts[i], starts[i + 1]) for i in keep]
        picked = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        table = np.zeros((len(fields), len(COLUMNS), len(picked)), dtype=np.float64)
        if facts is not None:
            renumber = np.array([0] + [codecs.index(c) + 1 for c in facts.codecs], dtype=np.float64)
            for f, name in enumerate(fields):
                if name in facts.columns:
                    table[f] = np.stack([facts.columns[name][c][picked] for c in COLUMNS])
                    table[f, -1] = renumber[table[f, -1].astype(np.int64)]
        for name in fields:
            have = facts.blocks.get(name) if facts is not None else None
            blocks[name] += [have[j] for j in picked.tolist()] if have else [b""] * len(picked)
        counts.append(per_shard[list(keep)])
        tables.append(table)
    return _encoded(
        np.concatenate(counts), fields, kinds, codecs, np.concatenate(tables, axis=2), blocks
    )


def reference_problem(ref: Any) -> str | None:
    """What keeps ``ref`` (the head's ``media``) from naming a media facts file, or None."""
    if not isinstance(ref, dict):
        return f"'media' is {type(ref).__name__}, not an object"

    def strings(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    blocks = ref.get("blocks")
    fine = (
        set(ref) - {"blocks"} == _KEYS
        and (
            "blocks" not in ref
            or (
                isinstance(blocks, dict)
                and set(blocks) == {"file", "sha256"}
                and side_name_fits(
                    blocks.get("file"), BLOCKS_PREFIX, BLOCKS_SUFFIX, blocks.get("sha256")
                )
            )
        )
        and side_name_fits(ref.get("file"), MEDIA_PREFIX, MEDIA_SUFFIX, ref.get("sha256"))
        and strings(ref.get("fields"))
        and strings(ref.get("kinds"))
        and len(ref["kinds"]) == len(ref["fields"])
        and strings(ref.get("codecs"))
        and type(ref.get("samples")) is int
    )
    if not fine:
        return f"its media reference {str(ref)[:120]} is not {{{', '.join(sorted(_KEYS))}}}"
    return None


def reference_only(ref: dict[str, Any]) -> MediaFacts:
    """The head's reference alone (the file is read when asked for)."""
    kinds = dict(zip(ref["fields"], ref["kinds"]))
    return MediaFacts(
        np.zeros(0, dtype=np.int64),
        list(ref["fields"]),
        kinds,
        list(ref["codecs"]),
        reference=dict(ref),
    )


def read_media_facts(
    ref: dict[str, Any], read: Callable[[str], bytes], samples: np.ndarray
) -> MediaFacts:
    """The recorded facts the head's ``ref`` names, read with ``read`` and checked against the manifest's
    sample counts per shard; a :class:`ManifestError` naming the file otherwise."""
    problem = reference_problem(ref)
    if problem is not None:
        raise ManifestError(f"the dataset's manifest: {problem}; re-pack the dataset")
    name, fix = ref["file"], "re-pack the dataset"
    array = load_array(ref, read, fix)
    if array.dtype != np.float64 or array.ndim != 1 or len(array) < 2:
        raise ManifestError(f"{name} is not a flat float64 array; {fix}")
    n, k = int(array[0]), int(array[1])
    counts = array[2 : 2 + n].astype(np.int64)
    expected = np.asarray(samples, dtype=np.int64)
    if n != len(expected) or k != len(ref["fields"]) or not np.array_equal(counts, expected):
        raise ManifestError(
            f"{name} records {n} shards of {int(counts.sum())} samples and {k} fields, the manifest "
            f"{len(expected)} shards of {int(expected.sum())} samples and {len(ref['fields'])}; {fix}"
        )
    total = int(counts.sum())
    table = array[2 + n :]
    if len(table) != k * len(COLUMNS) * total or total != ref["samples"]:
        raise ManifestError(
            f"{name} holds {len(table)} values, not {k * len(COLUMNS) * total}; {fix}"
        )
    codes = table.reshape(k, len(COLUMNS), total)[:, -1]
    if len(codes) and (codes.min(initial=0) < 0 or codes.max(initial=0) > len(ref["codecs"])):
        raise ManifestError(f"{name} names codecs the manifest does not list; {fix}")
    facts = reference_only(ref)
    facts.counts, facts.columns = (
        counts,
        _columns(facts.fields, table.reshape(k, len(COLUMNS), total)),
    )
    if "blocks" in ref:
        facts.blocks = _read_blocks(ref["blocks"], read, facts.fields, total)
    return facts


def _read_blocks(
    ref: dict[str, Any], read: Callable[[str], bytes], fields: list[str], total: int
) -> dict[str, list[bytes]]:
    """The block digests ``ref`` names, checked against its sha256 and the media facts' shape."""
    name, fix = ref["file"], "re-pack the dataset"
    array = load_array(ref, read, fix)
    k = len(fields)
    if array.dtype != np.uint64 or array.ndim != 1 or len(array) < 4 + k * total:
        raise ManifestError(f"{name} is not a flat uint64 array of {k} fields; {fix}")
    if int(array[0]) != BLOCK or int(array[1]) != total or int(array[2]) != k:
        raise ManifestError(
            f"{name} records blocks of {int(array[0])} bytes of {int(array[1])} samples and "
            f"{int(array[2])} fields, not of {BLOCK} bytes, {total} samples and {k}; {fix}"
        )
    starts = array[3 : 4 + k * total].astype(np.int64)
    digests = array[4 + k * total :].astype("<u8").tobytes()
    if starts[0] != 0 or np.any(np.diff(starts) < 0) or int(starts[-1]) * DIGEST != len(digests):
        raise ManifestError(f"{name}'s block numbers do not match its digests; {fix}")
    bounds = (starts * DIGEST).tolist()
    return {
        field_name: [
            digests[bounds[f * total + j] : bounds[f * total + j + 1]] for j in range(total)
        ]
        for f, field_name in enumerate(fields)
    }


def recorded_media(store: Any, m: Any) -> MediaFacts | None:
    """The media facts manifest ``m`` (of ``store``, a :class:`~shardstream.storage.Store`) recorded at
    pack time, read and checked; None where it records none."""
    if m.media is None:
        return None
    return read_media_facts(m.media.reference, store.read_bytes, m.stored_counts)


def duration_summary(facts: MediaFacts) -> dict[str, dict[str, Any]]:
    """Per media field: how many samples have a known duration, their total hours, and the spread of
    durations in seconds (min, median, max, and the 10th and 90th percentiles)."""
    out = {}
    for name in facts.fields:
        seconds = facts.columns[name]["duration"]
        known = seconds[seconds > 0]
        spread = (
            dict(zip(("min", "p10", "median", "p90", "max"),
                     (float(v) for v in np.percentile(known, [0, 10, 50, 90, 100]))))
            if len(known) else {}
        )  # fmt: skip
        out[name] = {
            "kind": facts.kinds.get(name, ""),
            "samples": int(len(known)),
            "hours": float(known.sum() / 3600),
            "seconds": spread,
        }
    return out


__all__ = [
    "BLOCK",
    "COLUMNS",
    "block_digests",
    "MediaFacts",
    "ShardMedia",
    "duration_summary",
    "encode_media_facts",
    "facts_of_shards",
    "read_media_facts",
    "recorded_media",
    "reference_only",
    "reference_problem",
]
