"""``shardstream info | ls | cat``: what a dataset holds, from its manifest and shards."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from ..errors import ShardstreamError
from ..manifest.sample_set import SampleSet, samples_of
from ..sizes import count, format_size
from .common import (
    cli,
    dataset_version,
    dataset_version_option,
    has_controls,
    open_dataset,
    safe,
    safe_json,
    storage_option,
)


@cli.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--shuffle-quality",
    "quality",
    is_flag=True,
    help="Read the cls field once and report the classes per batch of a shuffled epoch against i.i.d.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Batch size for --shuffle-quality.",
)
@click.option(
    "--seq-len",
    type=click.IntRange(min=1),
    default=None,
    help="Token datasets: the token windows of this length, and the tokens they leave out.",
)
@dataset_version_option
@storage_option
def info(
    dataset: str,
    as_json: bool,
    quality: bool,
    batch_size: int,
    storage_options: tuple[str, ...],
    seq_len: int | None = None,
) -> None:
    """Summarise DATASET: format, counts, sizes, fields, classes."""
    store, m = open_dataset(dataset, storage_options)
    samples = samples_of(m)
    doc = {
        "url": store.url,
        "shard_format": m.shard_format,
        "num_shards": m.num_shards,
        "num_samples": samples.total,
        **({"num_stored": m.num_stored} if samples.selected else {}),
        "total_bytes": m.total_bytes,
        "fields": m.fields,
        "classes": m.classes,
        "created": m.created,
    }
    if m.tokens is not None:
        from ..manifest.token_stats import describe, token_window_stats

        doc["tokens"] = dict(
            m.tokens, **({"windows": token_window_stats(m, seq_len)} if seq_len else {})
        )
    if m.media is not None:  # video and audio: total hours and the spread of durations
        doc["media"] = _media_summary(store, m)
    if quality:
        doc["shuffle_quality"] = _shuffle_quality(dataset, m, batch_size, storage_options)
    if as_json:
        click.echo(safe_json(doc, indent=2))
        return
    mean = m.total_bytes / m.num_shards if m.num_shards else 0
    per_shard = samples.per_shard if m.tokens is None else m.stored_counts
    fewest, most = (int(per_shard.min()), int(per_shard.max())) if m.num_shards else (0, 0)
    fields = ", ".join(
        f"{safe(f.get('name'))} ({_count(f['samples'])})"
        if "samples" in f
        else f"{safe(f.get('name'))}: {safe(f.get('type'))}"
        for f in m.fields
    )
    lines = [
        ("dataset", safe(store.url)),
        ("format", safe(m.shard_format)),
        ("samples", f"{samples.total:,}" + (" (a split part)" if samples.selected else "")),
        (
            "shards",
            f"{m.num_shards:,} (mean {format_size(mean)}, {_per_shard(fewest, most, m.num_shards)})",
        ),
        ("size", format_size(m.total_bytes) + _shared(samples)),
        ("fields", fields or "-"),
    ]
    if m.classes is not None:
        shown = ", ".join(safe(c) for c in m.classes[:10]) + (
            ", ..." if len(m.classes) > 10 else ""
        )
        lines.append(("classes", f"{len(m.classes):,}: {shown}"))
    if m.tokens is not None:
        lines += [(k, safe(str(v))) for k, v in describe(m, seq_len)]
    lines += _media_lines(doc.get("media", {}))
    if quality:
        q = doc["shuffle_quality"]
        window = count(q["window"], "sample")
        lines.append(
            (
                "shuffle",
                f"{q['classes_per_batch']:.1f} classes per batch of {batch_size} "
                f"(i.i.d.: {q['iid_classes_per_batch']:.1f}; default shuffle window {window})",
            )
        )
    created = m.created
    if created:
        lines.append(
            (
                "created",
                " ".join(
                    safe(x)
                    for x in (
                        created.get("at"),
                        "by",
                        created.get("by"),
                        "from",
                        created.get("source"),
                    )
                    if x
                ),
            )
        )
    left_out = created.get("left_out") if isinstance(created, dict) else None
    if left_out:  # members an index put in no sample, by reason
        lines.append(("left out", safe(left_out)))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key:<{width}}  {value}")


def _media_summary(store: Any, m: Any) -> dict[str, Any]:
    """Per video and audio field: samples of known duration, total hours, spread of durations."""
    from ..manifest.media_facts import duration_summary, recorded_media

    return duration_summary(recorded_media(store, m))  # type: ignore[arg-type]


def _media_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``info``'s lines of the media summary: one per field."""
    lines = []
    for name, s in summary.items():
        spread = s["seconds"]
        shown = (
            f"{s['hours']:,.2f} hours in {s['samples']:,} {s['kind'] or 'media'} samples; seconds "
            + (
                "min {min:.1f}, p10 {p10:.1f}, median {median:.1f}, p90 {p90:.1f}, max {max:.1f}".format(
                    **spread
                )
                if spread
                else "unknown"
            )
        )
        lines.append((safe(name), shown))
    return lines


def _shuffle_quality(
    dataset: str, m: Any, batch_size: int, storage_options: tuple[str, ...]
) -> dict[str, Any]:
    """Classes per batch of epoch 0 under the default read-time shuffle, from the cls labels read once."""
    import numpy as np

    from .. import plan
    from ..dataset import ShardDataset
    from .common import storage_settings_for

    if not any(f.get("name") == "cls" for f in m.fields):
        raise ShardstreamError(
            "--shuffle-quality needs a 'cls' field (an ImageFolder pack); this dataset has none"
        )
    ds = ShardDataset(
        dataset,
        shuffle=False,
        decode=None,
        transform=_label,
        rank=0,
        world_size=1,
        storage=storage_settings_for(storage_options, dataset),
        version=dataset_version(),
    )
    counts = ds.sample_set.per_shard
    labels = np.fromiter(iter(ds), dtype=np.int64, count=ds.sample_set.total)
    per_shard = np.split(labels, np.cumsum(counts)[:-1])
    window = plan.default_window(counts)
    order = plan.EpochOrder.create(counts, seed=0, epoch=0, shuffle=True, window=window)
    seen, iid = plan.batch_diversity(order, per_shard, batch_size)
    return {
        "batch_size": batch_size,
        "window": window,
        "classes_per_batch": seen,
        "iid_classes_per_batch": iid,
    }


def _label(sample: dict[str, Any]) -> int:
    value = sample.get("cls")
    if value is None:
        raise ShardstreamError(f"sample {sample.get('__key__')!r} has no cls field")
    try:
        return int(bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else value)
    except (TypeError, ValueError):
        raise ShardstreamError(
            f"sample {sample.get('__key__')!r}: cls {value!r} is not an integer"
        ) from None


def _shared(samples: SampleSet) -> str:
    """What ``size`` leaves unsaid for a split part: its shards' bytes hold other parts' samples too."""
    if not samples.selected:
        return ""
    stored = samples.manifest.num_stored
    return f" of shards shared with its source (it reads {samples.total:,} of their {stored:,} samples)"


def _per_shard(fewest: int, most: int, shards: int) -> str:
    """Samples per shard: ``1,000-1,200 samples``, ``1,000 samples each``, or one shard's ``1 sample``."""
    if fewest != most:
        return f"{fewest:,}-{most:,} samples"
    return count(most, "sample") + (" each" if shards > 1 else "")


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else safe(value)


@cli.command(name="ls")
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one per shard.")
@click.option(
    "--keys", is_flag=True, help="List every sample's index, key and shard instead of the shards."
)
@click.option(
    "--wids",
    is_flag=True,
    help="Print the shard list wids reads (wids.ShardListDataset), its URLs relative to DATASET's "
    "folder: save it there (e.g. as DATASET/.wids.json).",
)
@click.option(
    "--output",
    default=None,
    help="With --wids: write the shard list to this file (a path or URL), its URLs relative to the "
    "file's folder, instead of printing it.",
)
@dataset_version_option
@storage_option
def ls_(
    dataset: str,
    as_json: bool,
    keys: bool,
    wids: bool,
    output: str | None,
    storage_options: tuple[str, ...],
) -> None:
    """List DATASET's shards with sample counts and sizes (--keys: its samples' keys; --wids: the shard
    list wids reads)."""
    if output is not None and not wids:
        raise click.UsageError("--output goes with --wids")
    if wids and (keys or as_json):
        raise click.UsageError("--wids prints JSON of its own: leave out --keys and --json")
    if wids:
        _wids_list(dataset, output, storage_options)
        return
    if keys:
        _list_keys(dataset, as_json, storage_options)
        return
    _, m = open_dataset(dataset, storage_options)
    samples = samples_of(m)
    stored = m.stored_counts.tolist()
    rows = list(zip(m.paths, samples.per_shard.tolist(), stored, m.nbytes.tolist(), m.sha256))
    if as_json:
        for path, n, held, size, digest in rows:
            doc = {"path": path, "samples": n, "bytes": size, "sha256": digest}
            click.echo(safe_json({**doc, "stored": held} if samples.selected else doc))
        return
    paths = [safe(p) for p in m.paths]
    width = max([len(p) for p in paths] + [5])
    stored_head = f"  {'stored':>10}" if samples.selected else ""
    click.echo(f"{'shard':<{width}}  {'samples':>10}{stored_head}  {'size':>10}  sha256")
    for path, (_, n, held, size, digest) in zip(paths, rows):
        held_text = f"  {held:>10,}" if samples.selected else ""
        click.echo(
            f"{path:<{width}}  {n:>10,}{held_text}  {format_size(size):>10}  {safe(str(digest)[:16])}"
        )
    click.echo(
        f"{count(m.num_shards, 'shard')}, {count(samples.total, 'sample')}, {format_size(m.total_bytes)}"
    )


def _wids_list(dataset: str, output: str | None, storage_options: tuple[str, ...]) -> None:
    """Print (or write to ``output``) DATASET's shard list for wids."""
    import posixpath

    from ..manifest.wids import shard_list
    from ..storage import Store, is_url
    from .common import storage_options_for

    store, m = open_dataset(dataset, storage_options)
    folder = store.url if output is None else posixpath.dirname(output.rstrip("/")) or "."
    if output is not None and not is_url(output):
        folder = os.path.dirname(os.path.abspath(output))
    name = posixpath.basename(store.url.rstrip("/")) or store.url
    doc = shard_list(m, [store.url_of(p) for p in m.paths], name, folder)
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    target = Store(folder, storage_options_for(storage_options, output))
    target.makedirs()
    target.write_bytes(posixpath.basename(output.rstrip("/")), text.encode("utf-8"))
    click.echo(
        f"wrote the wids shard list of {count(m.num_shards, 'shard')}, "
        f"{count(m.num_stored, 'sample')} -> {safe(output)}"
    )


def _sample_map(dataset: str, storage_options: tuple[str, ...]) -> Any:
    """DATASET as a ``ShardMap`` of stored bytes (nothing decoded)."""
    from ..dataset import ShardMap
    from .common import storage_settings_for

    return ShardMap(
        dataset,
        decode=None,
        storage=storage_settings_for(storage_options, dataset),
        version=dataset_version(),
    )


def _list_keys(dataset: str, as_json: bool, storage_options: tuple[str, ...]) -> None:
    m = _sample_map(dataset, storage_options)
    index = 0
    for shard, path in enumerate(m.manifest.paths):
        try:
            keys = m.keys_of(shard)
        except KeyError as exc:
            raise ShardstreamError(exc.args[0]) from None
        for key in keys:
            if as_json:
                click.echo(safe_json({"index": index, "key": key, "shard": path}))
            else:
                click.echo(f"{index}\t{safe(key)}\t{safe(path)}")
            index += 1


def _preview(value: Any) -> str:
    """A short, terminal-safe rendering of one field's value."""
    return safe(_shorten(value))


def _shorten(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        if len(value) <= 200:
            try:
                text = value.decode("utf-8")
                if not has_controls(text):  # text, perhaps of several lines: quoted unless plain
                    return text if text.isprintable() and text == text.strip() else repr(text)
            except UnicodeDecodeError:
                pass
        return f"<{len(value):,} bytes: {value[:16].hex(' ')}{' ...' if len(value) > 16 else ''}>"
    if isinstance(value, str) and value.isprintable() and value == value.strip():
        return value if len(value) <= 200 else value[:200] + " ..."
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + " ..."


@cli.command(context_settings={"ignore_unknown_options": True})  # so that INDEX may be -1
@click.argument("dataset")
@click.argument("index", type=int, required=False)
@click.option("--key", default=None, help="Find the sample by its key instead of its index.")
@click.option("--field", default=None, help="Write this field's raw bytes to stdout.")
@click.option(
    "--raw",
    is_flag=True,
    help="With --field: write the bytes to a terminal even if they are binary or hold control characters.",
)
@dataset_version_option
@storage_option
def cat(
    dataset: str,
    index: int | None,
    key: str | None,
    field: str | None,
    raw: bool,
    storage_options: tuple[str, ...],
) -> None:
    """Show one sample of DATASET, by INDEX (default 0) or --key.

    Names and values are shown with control characters escaped. --field writes the field's
    bytes as they are to a file or pipe; to a terminal only text without control characters,
    unless --raw.
    """
    if index is not None and key is not None:
        raise click.UsageError("give an INDEX or --key, not both")
    if raw and field is None:
        raise click.UsageError("--raw goes with --field")
    m = _sample_map(dataset, storage_options)
    try:
        sample = m.get(key) if key is not None else m[index or 0]
    except (KeyError, IndexError) as exc:
        raise ShardstreamError(exc.args[0]) from None
    if field is not None:
        if field not in sample:
            raise ShardstreamError(
                f"sample {sample.get('__key__')!r} has no field {field!r}; "
                f"it has {', '.join(k for k in sample if k != '__key__')}"
            )
        value = sample[field]
        if not isinstance(value, (bytes, bytearray)):
            value = _encode(value if isinstance(value, str) else json.dumps(value, default=str))
        if not raw and sys.stdout.isatty() and not _terminal_text(value):
            raise ShardstreamError(
                f"field {field!r} of sample {sample.get('__key__')!r} is binary or holds terminal control "
                "characters; redirect it to a file (> out) or a pipe, or pass --raw to write it to the terminal"
            )
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
        return
    names = {name: safe(name) for name in sample}
    width = max(len(n) for n in names.values())
    for name, value in sample.items():
        click.echo(f"{names[name]:<{width}}  {_preview(value)}")


def _encode(text: str) -> bytes:
    try:
        # a tar name's undecodable bytes, as they were
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _terminal_text(value: bytes | bytearray) -> bool:
    """Whether ``value`` is UTF-8 text a terminal shows as it is: no control or format characters
    other than line ends and tabs."""
    try:
        return not has_controls(bytes(value).decode("utf-8"))
    except UnicodeDecodeError:
        return False
