"""``shardstream info | ls | cat``: what a dataset holds, from its manifest and shards."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..errors import ShardstreamError
from ..sizes import format_size
from .common import cli, open_dataset, storage_option


@cli.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@storage_option
def info(dataset: str, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """Summarise DATASET: format, counts, sizes, fields, classes."""
    store, m = open_dataset(dataset, storage_options)
    doc = {
        "url": store.url, "shard_format": m.shard_format, "num_shards": m.num_shards,
        "num_samples": m.num_samples, "total_bytes": m.total_bytes, "fields": m.fields,
        "classes": m.classes, "created": m.created,
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    mean = m.total_bytes / m.num_shards if m.num_shards else 0
    fewest, most = (int(m.samples.min()), int(m.samples.max())) if m.num_shards else (0, 0)
    fields = ", ".join(
        f"{f['name']} ({f['samples']:,})" if "samples" in f else f"{f['name']}: {f['type']}" for f in m.fields
    )
    lines = [
        ("dataset", store.url),
        ("format", m.shard_format),
        ("samples", f"{m.num_samples:,}"),
        ("shards", f"{m.num_shards:,} (mean {format_size(mean)}, {fewest:,}-{most:,} samples)"),
        ("size", format_size(m.total_bytes)),
        ("fields", fields or "-"),
    ]
    if m.classes is not None:
        shown = ", ".join(m.classes[:10]) + (", ..." if len(m.classes) > 10 else "")
        lines.append(("classes", f"{len(m.classes):,}: {shown}"))
    created = m.created
    if created:
        lines.append(("created", " ".join(str(x) for x in (created.get("at"), "by", created.get("by"),
                                                           "from", created.get("source")) if x)))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key:<{width}}  {value}")


@cli.command(name="ls")
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one per shard.")
@storage_option
def ls_(dataset: str, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """List DATASET's shards with sample counts and sizes."""
    _, m = open_dataset(dataset, storage_options)
    rows = zip(m.paths, m.samples.tolist(), m.nbytes.tolist(), m.sha256)
    if as_json:
        for path, n, size, digest in rows:
            click.echo(json.dumps({"path": path, "samples": n, "bytes": size, "sha256": digest}))
        return
    width = max([len(p) for p in m.paths] + [5])
    click.echo(f"{'shard':<{width}}  {'samples':>10}  {'size':>10}  sha256")
    for path, n, size, digest in rows:
        click.echo(f"{path:<{width}}  {n:>10,}  {format_size(size):>10}  {digest[:16]}")
    click.echo(f"{m.num_shards:,} shards, {m.num_samples:,} samples, {format_size(m.total_bytes)}")


def _preview(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        if len(value) <= 200:
            try:
                text = value.decode("utf-8")
                if text.isprintable() or not text.strip("\n\t "):
                    return repr(text) if text != text.strip() else text
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
@storage_option
def cat(dataset: str, index: int | None, key: str | None, field: str | None,
        storage_options: tuple[str, ...]) -> None:
    """Show one sample of DATASET, by INDEX (default 0) or --key."""
    from ..manifest.lookup import sample_at, sample_by_key

    if index is not None and key is not None:
        raise click.UsageError("give an INDEX or --key, not both")
    store, m = open_dataset(dataset, storage_options)
    sample = sample_by_key(store, m, key) if key is not None else sample_at(store, m, index or 0)
    if field is not None:
        if field not in sample:
            raise ShardstreamError(f"sample {sample.get('__key__')!r} has no field {field!r}; "
                                   f"it has {', '.join(k for k in sample if k != '__key__')}")
        value = sample[field]
        if not isinstance(value, (bytes, bytearray)):
            value = (value if isinstance(value, str) else json.dumps(value, default=str)).encode()
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
        return
    width = max(len(k) for k in sample)
    for name, value in sample.items():
        click.echo(f"{name:<{width}}  {_preview(value)}")
