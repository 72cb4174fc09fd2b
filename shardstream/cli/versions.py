"""``shardstream log | gc``: a dataset's versions, and removing what no kept version needs."""

from __future__ import annotations

import click

from ..manifest import dataset_store
from ..sizes import count, format_size
from .common import cli, safe, storage_option, storage_options_for


@cli.command()
@click.argument("dataset")
@storage_option
def log(dataset: str, storage_options: tuple[str, ...]) -> None:
    """List DATASET's readable versions: number, time, samples, shards, fingerprint, operation."""
    from ..manifest.versions import history

    store = dataset_store(dataset, storage_options_for(storage_options, dataset))
    click.echo(
        f"{'version':>7}  {'published':<25} {'samples':>12} {'shards':>8}  fingerprint   made by"
    )
    for entry in history(store):
        click.echo(
            f"{entry.version:>7}  {safe(entry.at) or '?':<25} {entry.samples:>12,} {entry.shards:>8,}  "
            f"{entry.fingerprint[:12]}  {safe(entry.operation)}"
        )


@cli.command()
@click.argument("dataset")
@click.option(
    "--keep",
    type=int,
    required=True,
    help="How many of the newest versions stay readable (1 or more).",
)
@click.option(
    "--delete", is_flag=True, help="Remove the files (without it: a dry run that lists them)."
)
@storage_option
def gc(dataset: str, keep: int, delete: bool, storage_options: tuple[str, ...]) -> None:
    """Remove the versions older than the newest KEEP and the shards none of those needs (a dry run
    unless --delete)."""
    from ..packing.gc import collect

    store = dataset_store(dataset, storage_options_for(storage_options, dataset))
    result = collect(store, keep, delete)
    verb = "removed" if result.deleted else "would remove"
    kept = ", ".join(map(str, result.kept))
    click.echo(
        f"{verb} {count(len(result.versions), 'version')} and {count(len(result.files), 'file')} "
        f"({format_size(result.nbytes)}) of {safe(store.url)}; keeping version(s) {kept}"
    )
    for name in result.files[:20]:
        click.echo(f"  {safe(name)}")
    if len(result.files) > 20:
        click.echo(f"  ... and {len(result.files) - 20:,} more")
    if not result.deleted and (result.files or result.versions):
        click.echo("dry run: pass --delete to remove them")
