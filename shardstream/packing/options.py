"""``PackOptions``: everything a pack is told besides its source and destination, as one frozen value.

:func:`shardstream.pack` takes them as keywords (one per setting, as the command's options) and
``shardstream pack`` as options: both make one, checked here once, and hand it to
:func:`~shardstream.packing.api.pack_with`, whose packers take ``(source, dest, options)``. What a pack
does is chosen by what it is asked (:attr:`PackOptions.request`) and by the kind of source and the
shard format (the tables in :mod:`.api` and :mod:`.driver`), never by which keywords were given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from .engine import Execution, default_workers
from .rules import DEFAULT_SHARD_SIZE


@dataclass(frozen=True)
class TokenOptions:
    """The settings of ``pack(format="tokens")`` besides those every pack takes (see
    :func:`shardstream.packing.tokens.pack_tokens`): the ``tokenizer`` (a ``tokenizer.json`` path, a
    ``tokenizers.Tokenizer`` or a callable), the ``text_field`` of JSONL and tables, ``eos`` (end each
    document with ``eos_id``, default the tokenizer's), ``vocab_size`` (fixes a callable's dtype), the
    ``dtype`` of flat ``.bin`` token files, and ``per_file`` (one document per plain text file)."""

    tokenizer: Any = None
    text_field: str = "text"
    eos: bool = True
    eos_id: int | None = None
    vocab_size: int | None = None
    dtype: str | None = None
    per_file: bool = False


# the keywords of pack(format="tokens") besides the settings every pack takes
TOKEN_OPTIONS = tuple(f.name for f in dataclasses.fields(TokenOptions))

_EVERY = frozenset(
    {
        "format",
        "shard_size",
        "workers",
        "overwrite",
        "append",
        "storage_options",
        "progress",
        "fsync",
    }
)
_SOURCE = _EVERY | {
    "samples_per_shard",
    "compression",
    "layout",
    "shuffle",
    "seed",
    "engine",
    "ray_address",
    "source_options",
    "index",
    "image_sizes",
    "fields",
    "field_name",
    "decode_value",
}
# request -> the settings it takes; one given (other than its default) that its request does not
# take is refused, never ignored
TAKES: dict[str, frozenset[str]] = {
    "inputs": _EVERY
    | {"fn", "samples_per_shard", "compression", "engine", "ray_address", "index", "image_sizes"},
    "split": _SOURCE | {"split_by"},
    "text": _EVERY | set(TOKEN_OPTIONS),
    "source": _SOURCE,
}
# request -> settings given a value that asks for what it does anyway
SAME: dict[str, dict[str, Any]] = {
    "inputs": {"shuffle": False},  # inputs are written in the order given
    "text": {"shuffle": False, "index": False, "image_sizes": False, "compression": "none"},
}
# request -> what a refusal calls it
_WHAT = {
    "inputs": "a pack from fn= (its samples are written in input order)",
    "split": "a split pack",
    "text": (
        "format='tokens' (token shards, uncompressed, cut at documents by shard_size, tokenized in "
        "the corpus's order by this process's threads)"
    ),
    "source": "this pack",
}


@dataclass(frozen=True)
class PackOptions:
    """The settings of one pack (see :func:`shardstream.pack` for each)."""

    format: str | None = None
    shard_size: int | str = DEFAULT_SHARD_SIZE
    samples_per_shard: int | None = None
    compression: str | None = None
    workers: int | None = None
    layout: str = "auto"
    overwrite: bool = False
    append: bool = False
    storage_options: dict[str, Any] | None = None
    progress: bool = True
    fsync: bool = True
    shuffle: bool = True
    seed: int = 0
    split_by: str | None = None
    fn: Callable[[Any], Any] | None = None
    fields: Sequence[str] | None = None
    field_name: str | None = None
    decode_value: Callable[[bytes, bytes], Any] | None = None
    engine: str = "local"
    ray_address: str | None = None
    source_options: dict[str, Any] | None = None
    index: bool = True
    image_sizes: bool = True
    token_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        workers = self.workers
        if workers is not None and (isinstance(workers, bool) or int(workers) < 1):
            raise UsageError(f"workers must be at least 1, not {workers!r}")
        if self.append and self.overwrite:
            raise UsageError(
                "append adds to the dataset and overwrite replaces it: pass one of them, not both"
            )
        if self.append and (
            self.split_by is not None or self.format == "tokens" or self.token_options
        ):
            raise UsageError(
                "append adds to datasets of tar or Arrow shards; split packs and token datasets are "
                "packed again instead"
            )

    @property
    def request(self) -> str:
        """What the pack is asked to do: pack ``fn``'s samples of a list of ``"inputs"``, ``"split"`` a
        folder by class, tokenize ``"text"``, or pack a ``"source"`` (folders, tables, sample files)."""
        if self.fn is not None:
            return "inputs"
        if self.split_by is not None:
            return "split"
        if self.format == "tokens" or self.token_options:
            if self.format != "tokens":
                names = sorted(self.token_options)
                raise UsageError(
                    f"{', '.join(names)} {'applies' if len(names) == 1 else 'apply'} to "
                    "format='tokens' only: pass format='tokens', or leave "
                    f"{'it' if len(names) == 1 else 'them'} out"
                )
            return "text"
        return "source"

    def given(self) -> list[str]:
        """The settings given a value other than their default (token options by name), sorted."""
        names = [
            f.name
            for f in dataclasses.fields(self)
            if f.name != "token_options" and getattr(self, f.name) != _default(f)
        ]
        return sorted(names + list(self.token_options))

    def check_request(self, request: str) -> None:
        """Refuse (:class:`UsageError`, one line naming them) settings that ``request`` would ignore."""
        same = SAME.get(request, {})
        ignored = [
            name
            for name in self.given()
            if name not in TAKES[request]
            and (name not in same or getattr(self, name) != same[name])
        ]
        if ignored:
            one = len(ignored) == 1
            raise UsageError(
                f"{', '.join(ignored)} {'does' if one else 'do'} not apply to {_WHAT[request]}; "
                f"leave {'it' if one else 'them'} out"
            )
        if self.seed != 0 and not self.shuffle:
            raise UsageError(
                "seed draws the order of a shuffled pack, and shuffle=False asks for none: leave "
                "seed out, or shuffle"
            )
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError(
                f"ray_address is the cluster of engine='ray', and this pack runs on engine="
                f"{self.engine!r}: pass engine='ray' or leave ray_address out"
            )

    def execution(self) -> Execution:
        """How the shard jobs run: ``workers`` (checked at least 1 when made; default: every usable core)."""
        workers = default_workers() if self.workers is None else int(self.workers)
        return Execution(workers, self.progress, self.engine, self.ray_address)

    def tokens(self) -> TokenOptions:
        """The token options of ``format="tokens"``, their defaults filled in."""
        return TokenOptions(**self.token_options)

    def source_settings(self) -> dict[str, Any]:
        """What the sources of samples take (HDF5 ``fields``, LMDB ``field_name`` and ``decode_value``)."""
        given = (
            ("fields", self.fields),
            ("field_name", self.field_name),
            ("decode_value", self.decode_value),
        )
        return {k: v for k, v in given if v is not None}

    def replace(self, **changes: Any) -> PackOptions:
        return dataclasses.replace(self, **changes)


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


__all__ = ["TAKES", "TOKEN_OPTIONS", "PackOptions", "TokenOptions"]
