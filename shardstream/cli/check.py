"""``shardstream verify | index | upgrade``: check a dataset against its manifest; write one for existing
tars or Parquet files; bring a dataset of an older format to this one."""

from __future__ import annotations

import click
from tqdm import tqdm

from ..errors import ShardstreamError
from ..manifest.locate import open_stored
from ..manifest.schema import FORMAT_VERSION
from ..sizes import count, format_size
from .common import (
    cli,
    dataset_version,
    dataset_version_option,
    safe,
    storage_option,
    storage_options_for,
    trusted_roots_for,
)


@cli.command()
@click.argument("dataset")
@click.option("--workers", type=int, default=4, show_default=True, help="Shards checked at once.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option(
    "--decode",
    is_flag=True,
    help="Also decode every image, label, text, JSON and numpy field (slower; finds a non-image .jpg).",
)
@dataset_version_option
@storage_option
def verify(
    dataset: str, workers: int, quiet: bool, decode: bool, storage_options: tuple[str, ...]
) -> None:
    """Check every shard's size and checksum, and that every sample parses (--decode: and decodes)."""
    from ..manifest.verify import verify as run_verify

    options, trusted = (
        storage_options_for(storage_options, dataset),
        trusted_roots_for(storage_options),
    )
    store, m = open_stored(dataset, options, version=dataset_version(), trusted_roots=trusted)
    with tqdm(
        total=m.total_bytes,
        unit="B",
        unit_scale=True,
        desc="verifying",
        leave=False,
        disable=True if quiet else None,
    ) as bar:
        report = run_verify(
            dataset,
            options,
            workers,
            on_shard=bar.update,
            decode=decode,
            trusted_roots=trusted,
            version=m.version,
        )
    if m.format < FORMAT_VERSION:
        click.echo(f"note: {_older_format(store.url, m.format)}", err=True)
    if report.ok:
        summary = f"{count(m.num_shards, 'shard')}, {count(m.num_samples, 'sample')}, {format_size(m.total_bytes)}"
        click.echo(f"ok: {summary} in {safe(store.url)}")
        click.echo(safe(report.checksums_line()))
        return
    click.echo(safe(report.checksums_line()))
    for problem in report.problems:
        click.echo(f"damaged: {safe(problem)}", err=True)
    damaged = len(report.problems)
    raise ShardstreamError(
        f"{damaged:,} of {count(m.num_shards, 'shard')} {'is' if damaged == 1 else 'are'} "
        f"damaged in {store.url}"
    )


def _older_format(url: str, fmt: int) -> str:
    """The line that says a dataset is of an older format, and the one command that moves it."""
    return (
        f"{safe(url)} is of manifest format {fmt}: its sample indexes lie beside its shards (where other "
        "tools keep theirs) and hold no per-sample checksums; 'shardstream upgrade "
        f"{safe(url)}' moves them into .shardstream/ as its next version"
    )


@cli.command()
@click.argument("dataset")
@storage_option
def upgrade(dataset: str, storage_options: tuple[str, ...]) -> None:
    """Bring DATASET, written by an older shardstream or packed with --no-index, to this format as its
    next version: its sample indexes (with per-sample checksums) and side files in .shardstream/, no
    shard changed. The older layout's files stay for the older versions ('shardstream gc' removes them)."""
    from ..manifest.upgrade import upgrade as run_upgrade

    result = run_upgrade(dataset, storage_options_for(storage_options, dataset))
    m = result.manifest
    if result.already:
        click.echo(
            f"{safe(result.url)} is of this format already (version {m.version}): nothing to do"
        )
        return
    skipped = (
        f"; {count(result.skipped, 'shard')} of other datasets left as they are (upgrade those)"
        if result.skipped
        else ""
    )
    click.echo(
        f"upgraded {safe(result.url)} as version {m.version}: {result.indexes:,} "
        f"{'index' if result.indexes == 1 else 'indexes'} written "
        f"into .shardstream/{skipped}; 'shardstream gc {safe(result.url)} --keep 1 --delete' removes "
        "the older layout's files once no reader needs the older versions"
    )


@cli.command(name="index")
@click.argument("shards", nargs=-1, required=True)
@click.option(
    "--output", default=None, help="Folder for _manifest.json [default: the shards' folder]."
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Publish over an existing dataset, as its next version (the earlier ones stay until gc).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Index a folder that an unfinished pack left (it holds .shardstream-writing); "
    "re-running the pack is usually the better fix.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def index_(
    shards: tuple[str, ...],
    output: str | None,
    overwrite: bool,
    force: bool,
    quiet: bool,
    storage_options: tuple[str, ...],
) -> None:
    """Write a manifest for existing WebDataset tars ('shard-{000..009}.tar', files or a folder) or for
    Parquet files read in place ('data/*.parquet', files, or a Hugging Face folder of one split)."""
    from ..manifest.index_parquet import index_parquet, is_parquet
    from ..manifest.index_tars import index as run_index

    with tqdm(
        unit="B", unit_scale=True, desc="indexing", leave=False, disable=True if quiet else None
    ) as bar:
        options = storage_options_for(storage_options, output or shards[0])
        if is_parquet(shards, options):
            if force:
                raise click.UsageError(
                    "--force indexes the tars of an unfinished pack; Parquet files are indexed as "
                    "they are: leave it out"
                )
            result = index_parquet(list(shards), output, options, overwrite, on_shard=bar.update)
        else:
            result = run_index(
                list(shards), output, options, overwrite, on_shard=bar.update, force=force
            )
    m = result.manifest
    for note in result.notes:
        click.echo(f"warning: {safe(note)}", err=True)
    if result.unkeyed:
        one = len(result.unkeyed) == 1
        click.echo(
            f"warning: {count(len(result.unkeyed), 'member')} {'has' if one else 'have'} no KEY.EXT name "
            f"(such as macOS's ._ files) and {'belongs' if one else 'belong'} to no sample, e.g. "
            f"{safe(repr(result.unkeyed[0]))}",
            err=True,
        )
    indexes = ", with their sample indexes" if result.indexes_written else ""
    version = f" as version {m.version}" if m.version > 1 else ""
    click.echo(
        f"indexed {count(m.num_shards, 'shard')}, {count(m.num_samples, 'sample')}, "
        f"{format_size(m.total_bytes)}{indexes}{version} -> {safe(result.url)}/_manifest.json"
    )
