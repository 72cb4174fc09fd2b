"""One manifest from two: an append's new shards after the dataset's, checked to be the same kind of data.

Pure: no I/O. The shards keep their entries (path, stored samples, bytes, checksums) unchanged; what must
agree (shard format, Arrow schema, classes, the set of fields) is checked, and a difference is a one-line
error naming it. Field sample counts add up; a split part's selection (and a merge's relabelling) extends
to the new shards, whose samples are all read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ManifestError, ShardstreamError
from .image_sizes import ImageSizes
from .relabel import Relabel
from .sample_set import samples_of
from .schema import Manifest
from .selection import Selection, encode_selection


def difference(base: Manifest, new: Manifest, same_classes: bool = True) -> str | None:
    """What keeps ``new``'s shards from joining ``base``'s (as a phrase), or ``None``; with
    ``same_classes=False`` their class lists may differ (a merge relabels them), not their presence."""
    if base.shard_format != new.shard_format:
        return f"its shards are {base.shard_format}, the new ones {new.shard_format}"
    if base.arrow_schema is not None and not _same_columns(base.arrow_schema, new.arrow_schema):
        return "its Arrow schema differs from the new shards' (columns or types)"
    if (
        same_classes
        and base.classes is not None
        and new.classes is not None
        and base.classes != new.classes
    ):
        extra = sorted(set(new.classes) ^ set(base.classes))
        what = (
            f"classes {extra[:5]} are in one only" if extra else "the classes are in another order"
        )
        return f"its class list differs from the new one ({what}): labels would mean other classes"
    if (base.classes is None) != (new.classes is None):
        return "one has class labels and the other has none"
    if base.tokens is not None or new.tokens is not None:
        return "token datasets are packed again instead of appended to"
    names = {f["name"] for f in base.fields}
    new_names = {f["name"] for f in new.fields}
    if names and new_names and names != new_names:
        only_base, only_new = sorted(names - new_names), sorted(new_names - names)
        return (
            f"its fields are {sorted(names)}, the new samples' {sorted(new_names)}"
            f" ({'only there: ' + ', '.join(only_base) if only_base else ''}"
            f"{'; ' if only_base and only_new else ''}"
            f"{'only new: ' + ', '.join(only_new) if only_new else ''})"
        )
    return None


def _same_columns(base: str, new: str | None) -> bool:
    """Whether two manifests' Arrow schemas have the same columns as readers see them: names and types,
    images stored in Hugging Face ``Image`` structs as the binary they are read as, metadata aside (the
    ``datasets`` features name each pack's own classes, which a merge relabels)."""
    if new is None or new == base:
        return new == base
    import pyarrow as pa

    from ..formats.arrow import schema_from_text
    from ..formats.hf_features import unwrapped_schema

    try:
        found, given = (
            unwrapped_schema(schema_from_text(base)),
            unwrapped_schema(schema_from_text(new)),
        )
    except (pa.ArrowException, ValueError, ShardstreamError):
        return False
    return found.equals(given, check_metadata=False)


def appended(
    base: Manifest,
    new: Manifest,
    url: str,
    version: int,
    image_sizes: ImageSizes | None = None,
) -> Manifest:
    """``base``'s shards then ``new``'s, as version ``version`` (created info: ``new``'s); a
    :class:`ManifestError` naming ``url`` and the difference if they cannot be one dataset.
    ``image_sizes``: the recorded sizes of all of them (see :func:`.image_sizes.join_image_sizes`)."""
    problem = difference(base, new)
    if problem is not None:
        raise ManifestError(
            f"cannot append to {url}: {problem}; append data of the same kind, or pack it elsewhere"
        )
    index: Any = None
    if base.index_sha256 is not None or new.index_sha256 is not None:
        index = list(base.index_sha256 or [""] * base.num_shards) + list(
            new.index_sha256 or [""] * new.num_shards
        )
    return Manifest(
        shard_format=base.shard_format,
        paths=base.paths + new.paths,
        stored_counts=np.concatenate([base.stored_counts, new.stored_counts]),
        nbytes=np.concatenate([base.nbytes, new.nbytes]),
        sha256=list(base.sha256) + list(new.sha256),
        fields=_add_fields(base.fields, new.fields),
        classes=base.classes if base.classes is not None else new.classes,
        arrow_schema=base.arrow_schema,
        created={  # what this version added, for its summary (the rest is the base's)
            **new.created,
            "operation": "append",
            "appended_shards": new.num_shards,
            "appended_samples": new.num_samples,
            "appended_bytes": new.total_bytes,
        },
        index_sha256=index,
        version=version,
        roots=base.roots,
        selection=_selection_appended(base, new),
        relabel=_relabel_appended(base, new),
        image_sizes=image_sizes,
    )


def _selection_appended(base: Manifest, new: Manifest) -> Selection | None:
    """A split part's selection with every sample of the new shards added: the part keeps reading only the
    samples it selected of its source's shards (none of another part's)."""
    if base.selection is None:
        return None
    samples = samples_of(base)
    per_shard = [samples.stored_rows_of(i) for i in range(base.num_shards)]
    per_shard += [np.arange(int(n), dtype=np.uint32) for n in new.stored_counts]
    return encode_selection(per_shard)[1]


def _relabel_appended(base: Manifest, new: Manifest) -> Relabel | None:
    """A merged dataset's relabeling, its new shards' labels kept as they are (packed with its classes)."""
    if base.relabel is None:
        return None
    same = tuple(range(len(base.classes or [])))
    return Relabel.of_shards(base.relabel.shard_maps() + [same] * new.num_shards)


def _add_fields(base: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fields of both, their sample counts added (a field's other settings: the base's)."""
    counts = {f["name"]: f.get("samples") for f in new}
    out = []
    for f in base:
        added = counts.pop(f["name"], None)
        out.append(f if "samples" not in f else {**f, "samples": f["samples"] + (added or 0)})
    return out + [dict(f) for f in new if f["name"] in counts]


__all__ = ["appended", "difference"]
