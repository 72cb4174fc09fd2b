"""The manifest itself: one JSON file, written last, that makes a folder of shards a dataset.

Per-shard data is stored column by column (a list of paths, a list of counts, ...),
so a manifest of a million shards is a few flat JSON arrays and loads in about a
second. Nothing in it grows with the number of samples.

A manifest comes from whoever made the dataset, so its schema is enforced when one is read or
made: types, counts in ``[0, 2**53)``, checksums of 64 hex digits (kept lower-case; empty: none),
relative, normalized, unique shard paths (none reaches outside the dataset's folder or bucket, but
under the roots a merge or split declares: folders beside it, or full URLs a reader must trust),
field names safe as file-name extensions; per-shard columns are checked as whole strings.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import operator
import platform
import re
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from ..errors import ManifestError
from .checks import checksums_fine, kind_of, path_problem, paths_fine
from .table import HexColumn, decode_table, reference_problem

if TYPE_CHECKING:
    from .image_sizes import ImageSizes
    from .media_facts import MediaFacts
    from .relabel import Relabel
    from .selection import Selection

MANIFEST_NAME = "_manifest.json"
# the newest this reads and writes, and what each brought: 4 keeps every file shardstream adds in the
# .shardstream folder (manifest.side_names) and per-member checksums in sample indexes; 3 relabels classes
# at read time (a merge's, see .relabel); 2 is a head naming a shard table; 1 one JSON file. Manifests
# are written as 4; older ones read as they are; older readers refuse what they cannot read.
FORMAT_VERSION = 4
NAMESPACE_FORMAT = 4
TABLE_FORMAT = 2
RELABEL_FORMAT = 3
SHARD_FORMATS = ("tar", "tar.zst", "tar.gz", "tar.xz", "tar.bz2", "arrow", "tokens", "parquet")
COLUMNAR_FORMATS = ("arrow", "parquet")  # rows of a table: fields are column names, any text
MAX_COUNT = 1 << 53  # sample and byte counts stay below this, exact in every JSON reader

_FIX = "re-create it with 'shardstream index' (or pack the data again)"
_BAD_FIELD_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f/\\\ud800-\udfff]")  # tar field names: extensions
# other names: NUL, and what UTF-8 cannot encode
_BAD_TEXT_CHAR = re.compile(r"[\x00\ud800-\udfff]")
_SHA = re.compile(r"(?:[0-9a-fA-F]{64})?")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


RUN_TOKEN = re.compile(r"[0-9a-f]{16}")  # a pack run's token: 16 lower-case hex digits
# A shard name's run token, as the fingerprint leaves it out: "shard-000000-<token>.tar" counts as "shard-000000.tar".
_RUN_IN_NAME = re.compile(r"(?<=[\"/])(shard-[0-9]{6,})-[0-9a-f]{16}(?=\.)")


def shard_name(index: int, shard_format: str, run: str | None = None) -> str:
    """A shard's file name: ``shard-000000.tar``; with the token of the run that writes it,
    ``shard-000000-<run>.tar`` (no two runs ever write the same name)."""
    if run is None:
        return f"shard-{index:06d}.{shard_format}"
    if not RUN_TOKEN.fullmatch(run):
        raise ValueError(f"a run token is 16 lower-case hex digits, not {run!r}")
    return f"shard-{index:06d}-{run}.{shard_format}"


@dataclass
class Manifest:
    """What a dataset is: its shards (path, samples, bytes, sha256), fields and classes.

    Checked when made: a :class:`ManifestError` (naming ``source``, the file read) if any part
    breaks the schema.

    Args:
        shard_format: ``"tar"``, ``"tar.zst"``, ``"tar.gz"``, ``"arrow"`` or ``"tokens"``.
        paths: each shard's path, relative to the dataset's folder.
        stored_counts: the samples each shard file stores (a split reads some of them:
            :func:`~shardstream.manifest.sample_set.samples_of` says which).
        nbytes: each shard's size in bytes.
        sha256: each shard's sha256 (hex; ``""``: none).
        fields: the fields and their written types.
        classes: the class names of an ImageFolder (``cls`` is the index into them), or None.
        arrow_schema: the Arrow schema of Arrow shards, serialized.
        created: creation info (time, versions).
        tokens: a token dataset's ``dtype``, ``vocab_size``, ``eos_id``, ``tokenizer`` and ``total``.
        index_sha256: each shard's sample index sha256 (``""``: none), or None.
        source: the file the manifest was read from, named in errors.
        version: the dataset's version this manifest is (1 for the first publish).
        selection: a split's selection of each shard's samples (its side file and sha256), or None.
        roots: the folders beside the dataset's (``../a``), or full URLs (``s3://bucket/a``: a merge
            across stores), that a merged or split dataset reads shards from; shards under a full URL
            are read only where the reader trusts it (``StorageSettings.trusted_roots``).
        relabel: a merge's map of each shard's labels to ``classes`` (see
            :mod:`shardstream.manifest.relabel`), or None: labels as stored.
        image_sizes: each sample's image width and height recorded at pack time (its side file and
            sha256; see :mod:`shardstream.manifest.image_sizes`), or None.
        media: each video and audio sample's facts (duration, frame rate, size, sample rate, ...) from its
            container headers at pack time (see :mod:`shardstream.manifest.media_facts`), or None.
        format: the manifest format it was read in (:data:`FORMAT_VERSION` for one made now): 4 and up
            keep shardstream's files in ``.shardstream/`` (see :mod:`shardstream.manifest.side_names`).
        table: the shard table a head read from storage named (its columns came from it), or None.
    """

    shard_format: str
    paths: list[str]
    stored_counts: np.ndarray
    nbytes: np.ndarray
    sha256: list[str]
    fields: list[dict[str, Any]] = field(default_factory=list)
    classes: list[str] | None = None
    arrow_schema: str | None = None
    created: dict[str, Any] = field(default_factory=dict)
    # token shards: dtype, vocab_size, eos_id, tokenizer, total
    tokens: dict[str, Any] | None = None
    # per shard: its sample index's (``.shardstream/<shard>.idx``) sha256, "" for none
    index_sha256: list[str] | None = None
    # which publish of the dataset this is: 1 for the first (and for manifests without the key)
    version: int = 1
    # folders beside the dataset's whose shards it reads where they are (``../a``): a merge's or split's;
    # shard paths under them start with one
    roots: list[str] | None = None
    # per shard, the samples of it the dataset reads (a split); None: all of them
    selection: Selection | None = None
    # per shard, its labels' map to ``classes`` (a merge of datasets with other class lists); None: as stored
    relabel: Relabel | None = None
    # each sample's image width and height, in a side file (read only by what plans from them)
    image_sizes: ImageSizes | None = None
    format: int = FORMAT_VERSION
    table: str | None = None
    # each video and audio sample's header facts, in a side file (read by info and what plans from them)
    media: MediaFacts | None = None
    source: InitVar[str | None] = None

    def __post_init__(self, source: str | None) -> None:
        _Checker(source).check(self)

    @property
    def num_shards(self) -> int:
        return len(self.paths)

    @property
    def num_samples(self) -> int:
        """The dataset's samples: its shards' stored samples, or those a split selects of them
        (:func:`~shardstream.manifest.sample_set.samples_of` says which)."""
        from .selection import selected_counts

        return int(selected_counts(self.stored_counts, self.selection).sum())

    @property
    def num_stored(self) -> int:
        """The samples its shard files store (a split's dataset reads fewer: :attr:`num_samples`)."""
        return int(self.stored_counts.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    @property
    def fingerprint(self) -> str:
        """A sha256 of what identifies the dataset's contents: format, shard paths, counts, sizes
        and checksums, fields and classes; not the creation info, nor the run token in shard names
        (:func:`shard_name`), so a re-pack of the same source has the same fingerprint, and any change
        to a shard gives another."""
        import hashlib

        key = tuple(
            map(
                id,
                (
                    self.shard_format,
                    self.paths,
                    self.stored_counts,
                    self.nbytes,
                    self.sha256,
                    self.fields,
                    self.classes,
                    self.arrow_schema,
                    self.tokens,
                    self.selection,
                    self.relabel,
                ),
            )
        )
        # computed once per set of columns (10^6 shards: ~1 s)
        cached = self.__dict__.get("_fingerprint")
        if cached is None or cached[0] != key:
            sha = self.sha256.tolist() if isinstance(self.sha256, HexColumn) else self.sha256
            doc = [
                self.shard_format,
                self.paths,
                self.stored_counts.tolist(),
                self.nbytes.tolist(),
                sha,
                self.fields,
                self.classes,
                self.arrow_schema,
            ] + ([self.tokens] if self.tokens is not None else [])
            if self.selection is not None:  # a split: which samples of the shards it reads
                doc.append(self.selection.reference.get("sha256", ""))
            if self.relabel is not None:  # a merge: what its labels mean
                doc.append(self.relabel.to_json())
            text = _RUN_IN_NAME.sub(r"\1", json.dumps(doc, sort_keys=True, separators=(",", ":")))
            cached = self.__dict__["_fingerprint"] = (
                key,
                hashlib.sha256(text.encode()).hexdigest(),
            )
        return cached[1]

    def to_json(self, table: dict[str, Any] | None = None) -> bytes:
        """The manifest's JSON; with ``table`` (a :func:`~.table.table_reference`) only its head,
        which names the shard table instead of listing the shard columns."""
        doc = {  # older readers refuse the format, rather than misread where its files are
            "shardstream_manifest": FORMAT_VERSION,
            "shard_format": self.shard_format,
            "num_shards": self.num_shards,
            "num_samples": self.num_samples,
            "total_bytes": self.total_bytes,
            "fields": self.fields,
            "classes": self.classes,
            "arrow_schema": self.arrow_schema,
            "created": self.created,
            **({"tokens": self.tokens} if self.tokens is not None else {}),
            # version 1 is written as before versions existed: readers of older releases read it byte for byte
            **({"version": self.version} if self.version != 1 else {}),
            **({"roots": self.roots} if self.roots is not None else {}),
            **({"selection": self.selection.reference} if self.selection is not None else {}),
            **({"relabel": self.relabel.to_json()} if self.relabel is not None else {}),
            **({"image_sizes": self.image_sizes.reference} if self.image_sizes is not None else {}),
            **({"media": self.media.reference} if self.media is not None else {}),
            "shards": table
            if table is not None
            else {
                "path": self.paths,
                "samples": self.stored_counts.tolist(),
                "bytes": self.nbytes.tolist(),
                "sha256": list(self.sha256),
                **(
                    {"index_sha256": list(self.index_sha256)}
                    if self.index_sha256 is not None
                    else {}
                ),
            },
        }
        # heads: readable
        layout: dict[str, Any] = {"indent": 1} if table is not None else {"separators": (",", ":")}
        return (json.dumps(doc, ensure_ascii=False, **layout) + "\n").encode("utf-8")

    @classmethod
    def from_json(
        cls,
        data: bytes | str,
        source: str = "manifest",
        read_table: Callable[[str], bytes] | None = None,
    ) -> Manifest:
        """Parse a manifest and enforce its schema; ``source`` names it in errors. A head that names a
        shard table reads it with ``read_table(name)`` (bytes), checks its sha256, then its columns."""
        doc = _parse(data, source)
        check = _Checker(source)
        shards = _shard_columns(doc, check, read_table)
        for column in ("path", "samples", "bytes", "sha256"):
            if not isinstance(shards.get(column), (list, HexColumn)) and not hasattr(
                shards.get(column), "dtype"
            ):
                raise check.fail(
                    f"the shard column {column!r} is {kind_of(shards.get(column))}, not a list"
                )
        if "shard_format" not in doc:
            raise check.fail("'shard_format' is missing")
        for key, kind in (
            ("fields", list),
            ("classes", list),
            ("arrow_schema", str),
            ("created", dict),
            ("tokens", dict),
            ("version", int),
            ("roots", list),
            ("selection", dict),
            ("relabel", dict),
        ):
            if doc.get(key) is not None and not isinstance(doc[key], kind):
                raise check.fail(f"{key!r} is {kind_of(doc[key])}, not {kind_of(kind())}")
        if shards.get("index_sha256") is not None and not isinstance(
            shards["index_sha256"], (list, HexColumn)
        ):
            raise check.fail(
                f"the shard column 'index_sha256' is {kind_of(shards['index_sha256'])}, not a list"
            )
        manifest = cls(
            doc["shard_format"],
            shards["path"],
            shards["samples"],
            shards["bytes"],
            shards["sha256"],
            doc.get("fields") or [],
            doc.get("classes"),
            doc.get("arrow_schema"),
            doc.get("created") or {},
            doc.get("tokens"),
            shards.get("index_sha256"),
            doc.get("version", 1),
            doc.get("roots"),
            _selection(doc, check, read_table),
            _relabel(doc, check),
            _image_sizes(doc, check),
            doc["shardstream_manifest"],
            doc["shards"].get("table") if isinstance(doc["shards"].get("table"), str) else None,
            source=source,
            media=_media(doc, check),
        )
        for total, actual in (
            ("num_shards", manifest.num_shards),
            ("num_samples", manifest.num_samples),
            ("total_bytes", manifest.total_bytes),
        ):
            if total in doc and (type(doc[total]) is not int or doc[total] != actual):
                raise check.fail(
                    f"{total} {_show(doc[total])} does not agree with the shard list ({actual})"
                )
        return manifest


def _parse(data: bytes | str, source: str) -> dict[str, Any]:
    """The manifest's JSON object, of a version this reads; a :class:`ManifestError` otherwise."""
    try:
        doc = json.loads(data, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _Refused as exc:
        raise ManifestError(f"{source} is damaged: {exc}; {_FIX}") from None
    except RecursionError:
        raise ManifestError(
            f"{source} is not a manifest: its JSON is nested too deeply; {_FIX}"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise ManifestError(f"{source} is not valid JSON ({exc}); {_FIX}") from None
    if not isinstance(doc, dict) or "shardstream_manifest" not in doc:
        raise ManifestError(f"{source} is not a shardstream manifest")
    version = doc["shardstream_manifest"]
    if type(version) is not int or version < 1:
        raise ManifestError(
            f"{source} has manifest version {_show(version)}, which no shardstream writes; {_FIX}"
        )
    if version > FORMAT_VERSION:
        raise ManifestError(
            f"{source} has manifest version {version}; this shardstream reads up to "
            f"version {FORMAT_VERSION}, upgrade shardstream"
        )
    return doc


def _shard_columns(
    doc: dict[str, Any], check: _Checker, read_table: Callable[[str], bytes] | None
) -> dict[str, Any]:
    """The manifest's ``shards`` object: its columns as they are, or read from the shard table it names."""
    shards = doc.get("shards")
    if not isinstance(shards, dict):
        raise check.fail(f"'shards' is {kind_of(shards)}, not an object")
    if "table" in shards:
        problem = reference_problem(shards)
        if problem is None and read_table is None:
            problem = (
                f"it names the shard table {shards['table']}, and nothing was given to read it"
            )
        if problem is None:
            problem, shards = decode_table(read_table(shards["table"]), shards)  # type: ignore[misc]
        if problem is not None:
            raise check.fail(problem)
    return shards


def _selection(
    doc: dict[str, Any], check: _Checker, read_table: Callable[[str], bytes] | None
) -> Selection | None:
    """The split's selection the head names, read with ``read_table`` and checked against its sha256."""
    ref = doc.get("selection")
    if ref is None:
        return None
    from .selection import read_selection

    problem, selection = read_selection(ref, read_table)
    if problem is not None:
        raise check.fail(problem)
    return selection


def _relabel(doc: dict[str, Any], check: _Checker) -> Relabel | None:
    """The merge's relabeling the head holds; only a format that older readers refuse may hold one."""
    if doc.get("relabel") is None:
        return None
    if doc["shardstream_manifest"] < RELABEL_FORMAT:
        raise check.fail(
            f"it relabels classes in manifest version {doc['shardstream_manifest']}, which readers "
            f"that ignore relabel read too; relabel needs version {RELABEL_FORMAT}"
        )
    from .relabel import read_relabel

    problem, relabel = read_relabel(doc["relabel"])
    if problem is not None:
        raise check.fail(problem)
    return relabel


def _image_sizes(doc: dict[str, Any], check: _Checker) -> ImageSizes | None:
    """The head's reference to the recorded image sizes (the file itself is read when planned from)."""
    from . import image_sizes

    def make(ref: dict[str, Any]) -> ImageSizes:
        import numpy as np

        return image_sizes.ImageSizes(
            np.zeros(0, dtype=np.int64), list(ref["fields"]), reference=ref
        )

    return _side_reference(doc, "image_sizes", check, image_sizes.reference_problem, make)


def _media(doc: dict[str, Any], check: _Checker) -> MediaFacts | None:
    """The head's reference to the recorded media facts (the file itself is read when asked for)."""
    from . import media_facts

    return _side_reference(
        doc, "media", check, media_facts.reference_problem, media_facts.reference_only
    )


def _side_reference(
    doc: dict[str, Any],
    key: str,
    check: _Checker,
    problem_of: Callable[[Any], str | None],
    make: Callable[[dict[str, Any]], Any],
) -> Any:
    """The head's ``key``, a reference to a checked side file (:mod:`.side_arrays`), checked by
    ``problem_of`` and made by ``make`` (None where the head has none)."""
    ref = doc.get(key)
    if ref is None:
        return None
    problem = problem_of(ref)
    if problem is not None:
        raise check.fail(problem)
    return make(dict(ref))


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


def _within(paths: list[Any], roots: list[str]) -> list[Any]:
    """Each path with the root it starts with (if any) taken off: what must be a plain shard path."""
    prefixes = [root + "/" for root in roots]
    out = []
    for path in paths:
        if isinstance(path, str) and (path.startswith("../") or "://" in path):
            for prefix in prefixes:
                if path.startswith(prefix):
                    path = path[len(prefix) :]
                    break
        out.append(path)
    return out


class _Refused(ValueError):  # JSON that parses, but that no manifest can be
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _Refused(f"the key {_show(twice)} appears twice in one object")
    return doc


def _no_constant(name: str) -> Any:
    raise _Refused(f"it holds {name}, which is not a number JSON allows")


def _show(value: object) -> str:
    """A short, one-line, escaped rendering of a value from the manifest, for messages."""
    if isinstance(value, str):
        return (
            repr(value)
            if len(value) <= 60
            else repr(value[:60])[:-1] + "..." + repr(value[:60])[-1]
        )
    small = (
        value is None
        or isinstance(value, (bool, float))
        or isinstance(value, int)
        and abs(value) < 10**30
    )
    return repr(value) if small else kind_of(value)


def _scalar(value: object) -> bool:
    """A JSON scalar that survives ``to_json``: no NaN, no NUL or text UTF-8 cannot encode."""
    if isinstance(value, str):
        return _BAD_TEXT_CHAR.search(value) is None
    return (
        math.isfinite(value)
        if isinstance(value, float)
        else value is None or isinstance(value, (bool, int))
    )


class _Checker:
    """Enforces the schema on a manifest, naming ``source`` and the shard in every error."""

    def __init__(self, source: str | None):
        self.source = source
        self.paths: list[Any] = []

    def fail(self, what: str) -> ManifestError:
        if self.source is None:  # made in code: from the values given to Manifest()
            return ManifestError(f"invalid manifest: {what}")
        return ManifestError(f"{self.source} is damaged: {what}; {_FIX}")

    def shard_fail(self, i: int, what: str) -> ManifestError:
        return self.fail(f"shard {i} ({_show(self.paths[i])}): {what}")

    def check(self, m: Manifest) -> None:
        if not isinstance(m.shard_format, str) or m.shard_format not in SHARD_FORMATS:
            raise self.fail(
                f"unknown shard format {_show(m.shard_format)} (known: {', '.join(SHARD_FORMATS)})"
            )
        import numpy as np

        columns = {
            "path": m.paths,
            "samples": m.stored_counts,
            "bytes": m.nbytes,
            "sha256": m.sha256,
        }
        for name, column in columns.items():
            counts = (
                name in ("samples", "bytes") and isinstance(column, np.ndarray) and column.ndim == 1
            )
            if not (isinstance(column, (list, tuple, HexColumn)) or counts):
                raise self.fail(f"the shard column {name!r} is {kind_of(column)}, not a list")
        if len({len(column) for column in columns.values()}) > 1:
            lengths = ", ".join(f"{name} {len(column)}" for name, column in columns.items())
            raise self.fail(f"the shard columns have different lengths ({lengths})")
        m.roots = self.check_roots(m.roots)
        m.paths = self.paths = self.check_paths(
            m.paths if type(m.paths) is list else list(m.paths), m.roots or []
        )
        m.stored_counts = self.counts(m.stored_counts, "samples")
        m.nbytes = self.counts(m.nbytes, "bytes")
        m.sha256 = self.checksums(m.sha256)
        if m.index_sha256 is not None:
            if not isinstance(m.index_sha256, (list, tuple, HexColumn)) or len(
                m.index_sha256
            ) != len(m.paths):
                raise self.fail(
                    f"the shard column 'index_sha256' is not a list of {len(m.paths)} checksums"
                )
            m.index_sha256 = self.checksums(m.index_sha256)
        m.fields = self.check_fields(m.fields, m.shard_format)
        if m.classes is not None:
            m.classes = self.texts(m.classes, "classes")
        if m.arrow_schema is not None and not (
            isinstance(m.arrow_schema, str) and _BASE64.fullmatch(m.arrow_schema)
        ):
            raise self.fail(f"arrow_schema is {kind_of(m.arrow_schema)}, not base64 text")
        if not isinstance(m.created, dict) or not all(
            isinstance(k, str) and _scalar(k) and _scalar(v) for k, v in m.created.items()
        ):
            raise self.fail("'created' is not an object of strings, numbers, booleans and nulls")
        m.created = dict(m.created)
        self.check_version(m)
        if m.tokens is not None or m.shard_format == "tokens":
            from .token_stats import check_tokens

            problem = check_tokens(m)
            if problem is not None:
                raise self.fail(problem)

    def check_version(self, m: Manifest) -> None:
        """The version number, and what a version may read of other datasets' shards (a split's selection)."""
        if type(m.version) is not int or not 1 <= m.version < MAX_COUNT:
            raise self.fail(f"version {_show(m.version)} is not a whole number of 1 or more")
        problem = None if m.selection is None else m.selection.problem(m.stored_counts)
        if problem is None and m.relabel is not None:
            problem = m.relabel.problem(len(m.paths), None if m.classes is None else len(m.classes))
        if problem is not None:
            raise self.fail(problem)

    def check_roots(self, roots: Any) -> list[str] | None:
        if roots is None:
            return None
        from ..storage.routed import url_root_problem
        from ..storage.store import root_problem

        roots = self.texts(roots, "roots")
        for root in roots:
            # a folder beside the dataset's, or a full URL (a merge across stores: read only where trusted)
            problem = url_root_problem(root) if "://" in root else root_problem(root)
            if problem is not None:
                raise self.fail(f"root {_show(root)} {problem}")
        return roots

    def check_paths(self, paths: list[Any], roots: list[str]) -> list[str]:
        if not paths_fine(_within(paths, roots) if roots else paths):
            for i, path in enumerate(_within(paths, roots) if roots else paths):
                problem = path_problem(path)
                if problem is not None:
                    raise self.fail(f"shard {i}: path {_show(paths[i])} {problem}")
        # Packed and indexed datasets list their shards in increasing order: no set needed there.
        if not all(map(operator.lt, paths, itertools.islice(paths, 1, None))) and len(
            set(paths)
        ) != len(paths):
            first: dict[str, int] = {}
            for i, path in enumerate(paths):
                if first.setdefault(path, i) != i:
                    raise self.fail(
                        f"shard {i}: path {_show(path)} is shard {first[path]}'s too; "
                        "each shard is listed once"
                    )
        return paths

    def counts(self, values: Any, column: str) -> np.ndarray:
        import numpy as np

        if isinstance(values, np.ndarray):
            if values.dtype.kind not in "iu":
                raise self.fail(
                    f"the shard column {column!r} holds {values.dtype} values, not whole numbers"
                )
            array = values
        else:
            if not set(map(type, values)) <= {int}:
                for i, value in enumerate(values):
                    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                        raise self.shard_fail(i, f"{column} is {_show(value)}, not a whole number")
                values = [int(value) for value in values]
            try:
                array = np.array(values, dtype=np.int64)
            except OverflowError:
                i = next(i for i, value in enumerate(values) if not 0 <= value < MAX_COUNT)
                raise self.shard_fail(i, f"{column} {_show(values[i])} is out of range") from None
        if array.size:
            bad = (array < 0) | (array >= MAX_COUNT)
            if bad.any():
                i = int(bad.argmax())
                raise self.shard_fail(
                    i,
                    f"{column} {int(array[i])} is "
                    f"{'negative' if array[i] < 0 else 'too large (2**53 or more)'}",
                )
            if float(array.sum(dtype=np.float64)) >= MAX_COUNT:
                raise self.fail(f"the shards' {column} add up to 2**53 or more")
        return array.astype(np.int64, copy=False)

    def checksums(self, sha: Any) -> list[str]:
        if isinstance(sha, HexColumn):  # 32-byte digests: well-formed by construction
            return sha  # type: ignore[return-value]
        sha = list(sha)
        fine = checksums_fine(sha)
        if fine is not None:
            return fine
        for i, digest in enumerate(sha):
            if not isinstance(digest, str) or not _SHA.fullmatch(digest):
                raise self.shard_fail(
                    i, f"sha256 {_show(digest)} is not 64 hex digits (nor empty, for none)"
                )
        return [digest.lower() for digest in sha]

    def check_fields(self, fields: Any, shard_format: str) -> list[dict[str, Any]]:
        if not isinstance(fields, (list, tuple)):
            raise self.fail(f"'fields' is {kind_of(fields)}, not a list")
        for j, entry in enumerate(fields):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise self.fail(f"fields[{j}] is {_show(entry)}, not an object with a name")
            name = entry["name"]
            if (
                _BAD_TEXT_CHAR.search(name)
                if shard_format in COLUMNAR_FORMATS
                else not name or _BAD_FIELD_CHAR.search(name)
            ):
                raise self.fail(
                    f"field name {_show(name)} is empty or holds a '/', a backslash or a control "
                    "character, which tar member names and the files they extract to cannot"
                )
            samples, nullable = entry.get("samples", 0), entry.get("nullable", False)
            if (
                not isinstance(entry.get("type"), str)
                or type(samples) is not int
                or not 0 <= samples < MAX_COUNT
                or not isinstance(nullable, bool)
                or not all(map(_scalar, itertools.chain(*entry.items())))
            ):
                raise self.fail(
                    f"field {_show(name)} is not {{name: text, type: text, samples: count, "
                    "nullable: true or false}"
                )
        return [dict(entry) for entry in fields]

    def texts(self, values: Any, what: str) -> list[str]:
        if not isinstance(values, (list, tuple)):
            raise self.fail(f"{what!r} is {kind_of(values)}, not a list")
        values = list(values)
        if not set(map(type, values)) <= {str} or _BAD_TEXT_CHAR.search("".join(values)):
            for i, value in enumerate(values):
                if not isinstance(value, str) or _BAD_TEXT_CHAR.search(value):
                    raise self.fail(
                        f"{what}[{i}] is {_show(value)}, not text without NUL or invalid Unicode"
                    )
        return values
