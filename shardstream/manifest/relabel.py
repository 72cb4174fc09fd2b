"""A merge's class unification: each source's labels mapped to the merged class list as they are read.

Shards keep the labels they were packed with (``cls``: an index into their source's class list); a
merged manifest lists the union of the sources' classes and, under ``relabel``, one map per source
(old id -> new id) and which shards each map applies to, as runs of consecutive shards:

    "relabel": {"field": "cls", "maps": [[0, 1], [1, 2]], "runs": [[0, 2], [1, 3]]}

(the first 2 shards read label ``i`` as ``maps[0][i]``, the next 3 as ``maps[1][i]``). No shard is
rewritten: readers apply the map to every sample's ``cls`` (a tar's digits, an Arrow or Parquet
integer) before anything else sees it. A manifest with ``relabel`` is manifest format 3, which older
readers refuse ("upgrade shardstream") rather than read labels that mean other classes.

Pure: no I/O. A label outside its shard's map is a one-line error naming the shard and sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CorruptShardError

LABEL_FIELD = "cls"  # the field that holds an index into ``Manifest.classes``

LabelMap = tuple[int, ...]  # one shard's map: old label -> new label


@dataclass(frozen=True, eq=False)
class Relabel:
    """Per shard, the map from the label it holds to its index in the manifest's class list."""

    maps: tuple[LabelMap, ...]
    runs: tuple[tuple[int, int], ...]  # (map, consecutive shards that use it)

    @classmethod
    def of_shards(cls, per_shard: Sequence[LabelMap]) -> Relabel:
        """The relabeling whose shard ``i`` uses ``per_shard[i]`` (equal maps stored once)."""
        maps: dict[LabelMap, int] = {}
        runs: list[list[int]] = []
        for shard_map in per_shard:
            k = maps.setdefault(tuple(int(v) for v in shard_map), len(maps))
            if runs and runs[-1][0] == k:
                runs[-1][1] += 1
            else:
                runs.append([k, 1])
        return cls(tuple(maps), tuple((k, n) for k, n in runs))

    def shard_maps(self) -> list[LabelMap]:
        """Each shard's map, in shard order."""
        return [self.maps[k] for k, n in self.runs for _ in range(n)]

    @property
    def num_shards(self) -> int:
        return sum(n for _, n in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "field": LABEL_FIELD,
            "maps": [list(m) for m in self.maps],
            "runs": [[k, n] for k, n in self.runs],
        }

    def problem(self, num_shards: int, num_classes: int | None) -> str | None:
        """What keeps this from relabeling ``num_shards`` shards into ``num_classes`` classes, or None."""
        if num_classes is None:
            return "it relabels classes, and has no class list"
        if self.num_shards != num_shards:
            return f"its relabel runs cover {self.num_shards} shards, the manifest has {num_shards}"
        if any(not 0 <= k < len(self.maps) or n < 1 for k, n in self.runs):
            return f"its relabel runs name maps outside its {len(self.maps)} maps, or no shards"
        for k, m in enumerate(self.maps):
            if any(not 0 <= v < num_classes for v in m):
                return f"its relabel map {k} names a class outside its {num_classes} classes"
        return None

    def _arrays(self) -> tuple[list[np.ndarray], np.ndarray]:
        cached = self.__dict__.get("_cached")
        if cached is None:
            arrays = [np.asarray(m, dtype=np.int64) for m in self.maps]
            which = np.repeat(
                np.array([k for k, _ in self.runs], dtype=np.int64),
                np.array([n for _, n in self.runs], dtype=np.int64),
            )
            cached = (arrays, which)
            object.__setattr__(self, "_cached", cached)
        return cached

    def of(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s map (old label -> new label)."""
        arrays, which = self._arrays()
        return arrays[int(which[shard])]

    def labels(self, values: np.ndarray, shard: int, where: str) -> np.ndarray:
        """Shard ``shard``'s labels ``values`` (integers) as indexes into the merged class list."""
        table = self.of(shard)
        values = np.asarray(values, dtype=np.int64)
        bad = (values < 0) | (values >= len(table))
        if bad.any():
            raise _outside(int(values[int(np.argmax(bad))]), len(table), where)
        return table[values]

    def value(self, stored: Any, shard: int, where: str) -> Any:
        """One stored label (a tar's digits as bytes, or an integer; None stays None), relabeled, of the
        same kind."""
        if stored is None:
            return None
        table = self.of(shard)
        if isinstance(stored, (bytes, bytearray, memoryview)):
            text = bytes(stored)
            try:
                old = int(text)
            except ValueError:
                raise CorruptShardError(
                    f"{where}: its {LABEL_FIELD} {text[:20]!r} is not a class number, so it cannot be "
                    "mapped to the merged class list; run 'shardstream verify' on its source"
                ) from None
            if not 0 <= old < len(table):
                raise _outside(old, len(table), where)
            return str(int(table[old])).encode()
        if isinstance(stored, (int, np.integer)) and not isinstance(stored, bool):
            if not 0 <= int(stored) < len(table):
                raise _outside(int(stored), len(table), where)
            return int(table[int(stored)])
        raise CorruptShardError(
            f"{where}: its {LABEL_FIELD} is {type(stored).__name__}, not a class number, so it cannot "
            "be mapped to the merged class list"
        )

    def sample(self, stored: dict[str, Any], shard: int, where: str) -> dict[str, Any]:
        """``stored`` (one stored sample) with its label relabeled, in place."""
        if LABEL_FIELD in stored:
            stored[LABEL_FIELD] = self.value(stored[LABEL_FIELD], shard, where)
        return stored


def _outside(label: int, classes: int, where: str) -> CorruptShardError:
    return CorruptShardError(
        f"{where}: its {LABEL_FIELD} {label} is not one of its source's {classes} classes; the shard "
        "or the merged manifest was replaced, merge the sources again"
    )


def read_relabel(doc: Any) -> tuple[str | None, Relabel | None]:
    """(problem or None, relabeling) of a manifest's ``relabel`` object (untrusted: every part checked)."""

    def whole(v: Any) -> bool:
        return type(v) is int and 0 <= v < 1 << 53

    if not (
        isinstance(doc, dict)
        and set(doc) == {"field", "maps", "runs"}
        and doc["field"] == LABEL_FIELD
        and isinstance(doc["maps"], list)
        and all(isinstance(m, list) and all(map(whole, m)) for m in doc["maps"])
        and isinstance(doc["runs"], list)
        and all(
            isinstance(r, list) and len(r) == 2 and whole(r[0]) and whole(r[1]) for r in doc["runs"]
        )
    ):
        return (
            f"its relabel {str(doc)[:120]} is not {{field: 'cls', maps: [[class, ...], ...], "
            "runs: [[map, shards], ...]}",
            None,
        )
    return None, Relabel(
        tuple(tuple(m) for m in doc["maps"]), tuple((r[0], r[1]) for r in doc["runs"])
    )


def unify(class_lists: Sequence[Sequence[str]]) -> tuple[list[str], list[LabelMap]]:
    """The union of ``class_lists`` (the first's classes in order, then each next one's new ones in
    order) and, per list, its map (old index -> index in the union)."""
    union: dict[str, int] = {}
    maps = []
    for classes in class_lists:
        maps.append(tuple(union.setdefault(c, len(union)) for c in classes))
    return list(union), maps


__all__ = ["LABEL_FIELD", "Relabel", "read_relabel", "unify"]
