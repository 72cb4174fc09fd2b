"""``shardstream log | gc | merge | split``: a dataset's versions, removing what no kept version needs, and
new datasets made of other datasets' shards without copying them."""

from __future__ import annotations

import click

from ..manifest import dataset_store
from ..sizes import count, format_size
from ..storage import is_url
from .common import cli, safe, storage_option, storage_options_for, trusted_roots_for


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


@cli.command()
@click.argument("datasets", nargs=-1, required=True)
@click.option("--overwrite", is_flag=True, help="Replace a dataset already at DEST.")
@storage_option
def merge(datasets: tuple[str, ...], overwrite: bool, storage_options: tuple[str, ...]) -> None:
    """Write DEST (the last argument): a dataset of the shards of the others, read where they are (no copy).

    Sources on DEST's store are named by relative path; others (another bucket or store) by full URL,
    which readers follow only where trusted (StorageSettings(trusted_roots=...)). Shard format and
    fields must agree. Class lists may differ: DEST lists their union (the first
    dataset's classes in order, then each next one's new ones) and maps each source's labels to it
    when they are read."""
    from ..packing.compose import merge as run_merge

    if len(datasets) < 2:
        raise click.UsageError("give one or more datasets and then DEST")
    *sources, dest = datasets
    # the connection flags are for the object store among them (a local DEST may merge a bucket's dataset)
    options = storage_options_for(storage_options, next((d for d in datasets if is_url(d)), dest))
    m = run_merge(sources, dest, storage_options=options, overwrite=overwrite)
    click.echo(
        f"merged {count(len(sources), 'dataset')} into {safe(dest)}: {count(m.num_shards, 'shard')}, "
        f"{count(m.num_samples, 'sample')}, {format_size(m.total_bytes)} (no shard copied)"
    )
    if m.relabel is not None:
        click.echo(
            f"classes unified: {count(len(m.classes or []), 'class', 'classes')}, each source's "
            "labels mapped to them when read"
        )


@cli.command()
@click.argument("dataset")
@click.argument("dest")
@click.argument("more_parts", nargs=-1)
@click.option(
    "--into",
    "into",
    multiple=True,
    required=True,
    help="The parts as NAME=FRACTION, the fractions adding up to 1: --into train=0.98 val=0.02.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the key hash.")
@click.option("--overwrite", is_flag=True, help="Replace datasets already at DEST/NAME.")
@storage_option
def split(
    dataset: str,
    dest: str,
    more_parts: tuple[str, ...],
    into: tuple[str, ...],
    seed: int,
    overwrite: bool,
    storage_options: tuple[str, ...],
) -> None:
    """Write one dataset per part under DEST (DEST/NAME), each selecting DATASET's samples whose key hashes
    into it (no shard copied); a sample's part depends only on its key and the seed."""
    from ..packing.compose import split as run_split

    parts: dict[str, float] = {}
    for item in (
        *into,
        *more_parts,
    ):  # --into train=0.98 val=0.02: the later parts come as arguments
        name, sep, fraction = item.partition("=")
        try:
            parts[name] = float(fraction)
        except ValueError:
            sep = ""
        if not sep:
            raise click.UsageError(f"--into {item!r}: give NAME=FRACTION, e.g. train=0.98")
    options = storage_options_for(storage_options, dest)
    made = run_split(
        dataset,
        dest,
        parts,
        seed=seed,
        storage_options=options,
        overwrite=overwrite,
        trusted_roots=trusted_roots_for(storage_options),
    )
    for name, m in made.items():
        click.echo(
            f"{safe(name)}: {count(m.num_samples, 'sample')} of {count(m.num_shards, 'shard')} "
            f"in {safe(dest)}/{safe(name)}"
        )
