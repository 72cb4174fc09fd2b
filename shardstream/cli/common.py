"""What every command shares: the ``shardstream`` group, one-line errors, storage flags, quiet logs,
and :func:`safe`, which every string that comes from a dataset passes through before it is printed.

User mistakes and damaged data end with one ``error:`` line and a non-zero exit,
never a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import traceback
import unicodedata
from collections.abc import Callable
from typing import Any

import click

from ..errors import ShardstreamError
from ..manifest import Manifest
from ..manifest.locate import open_stored
from ..storage import StorageSettings, Store, connection_options, is_url
from ..version import __version__

# Characters a terminal may act on, or that hide or reorder text: C0 and C1 controls and DEL (Cc),
# format characters such as the bidi overrides U+202A..U+202E, U+2066..U+2069 and zero-width
# spaces (Cf), lone surrogates (Cs) and the line and paragraph separators (Zl, Zp).
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Zero-width (non-)joiners are Cf too, but Persian, Indic scripts and emoji need them; they are harmless.
_JOINERS = frozenset("\u200c\u200d")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _needs_escape(ch: str) -> bool:
    return ch not in _JOINERS and unicodedata.category(ch) in _ESCAPED


def _repr_escape(ch: str) -> str:
    o = ord(ch)
    return _SHORT.get(ch) or (
        f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"
    )


def _json_escape(ch: str) -> str:
    o = ord(ch)
    if o < 0x10000:
        return f"\\u{o:04x}"
    o -= 0x10000
    return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"


def safe(text: object) -> str:
    """``text`` fit for a terminal: control, format and bidi characters and lone surrogates are
    written as Python escapes (``\\x1b``, ``\\u202e``, ``\\n``), as ``repr`` would; other text,
    ``é`` and ``中`` included, is left as it is. Every dataset-derived string is printed through it."""
    text = str(text)
    if text.isprintable():  # the common case, and one C call: no character here needs escaping
        return text
    return "".join(_repr_escape(ch) if _needs_escape(ch) else ch for ch in text)


def has_controls(text: str) -> bool:
    """Whether :func:`safe` would change ``text`` apart from its line ends (``\\n``, ``\\r\\n``) and tabs."""
    text = text.replace("\r\n", "").replace("\n", "").replace("\t", "")
    return not text.isprintable() and any(_needs_escape(ch) for ch in text)


def safe_json(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON that is safe on a terminal and still parses to the same value:
    the characters :func:`safe` escapes become ``\\uXXXX`` escapes."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    if text.isprintable():
        return text
    # json.dumps escapes C0 controls inside strings itself, so a raw newline here is indentation
    return "".join(_json_escape(ch) if ch != "\n" and _needs_escape(ch) else ch for ch in text)


def _fail(ctx: click.Context, message: str, code: int = 1) -> None:
    click.echo(f"error: {safe(message)}", err=True)
    ctx.exit(code)


def _unexpected(exc: Exception) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    text = str(exc)
    text = text if len(text) <= 300 else text[:300] + " ..."
    return (
        f"unexpected {type(exc).__name__}{where}: {text}; this is a bug in shardstream, please report it "
        "(shardstream --traceback ... shows the traceback)"
    )


# command -> the module of this package that defines it, imported when the command runs (or --help lists them)
COMMANDS = {
    "pack": "pack",
    "info": "show",
    "ls": "show",
    "cat": "show",
    "verify": "check",
    "index": "check",
    "upgrade": "check",
    "doctor": "doctor",
    "bench": "bench",
    "log": "living",
    "gc": "living",
    "merge": "living",
    "split": "living",
}


def load_commands(module: str) -> Any:
    """Import the command module ``module`` of this package. Where it defines a command of its own name, the
    package's attribute of that name stays the command (``shardstream.cli.pack``), as it always was."""
    loaded = importlib.import_module(f"{__package__}.{module}")
    setattr(sys.modules[__package__], module, getattr(loaded, module, loaded))
    return loaded


class _Cli(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            load_commands(COMMANDS[cmd_name])
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ShardstreamError as exc:
            _fail(ctx, str(exc))
        except KeyboardInterrupt:
            click.echo("interrupted; nothing was published", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            sys.stderr.close()  # the reader went away (`| head`); not an error
            ctx.exit(0)
        except OSError as exc:
            where = f"{exc.filename} " if getattr(exc, "filename", None) else ""
            _fail(ctx, f"{where}{exc.strerror or exc}")
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # usage errors and exits: click reports them
        except Exception as exc:  # the promise is one line, never a traceback
            if ctx.params.get("traceback"):
                raise
            _fail(ctx, _unexpected(exc))


def storage_options_for(values: tuple[str, ...], url: str) -> dict[str, Any]:
    """Storage options for ``url``: --endpoint-url, --anon and --profile, then each -o KEY=VALUE."""
    meta = click.get_current_context().meta
    flags = meta.get("shardstream.connection", {})
    if meta.get("shardstream.trusted") and not is_url(url):
        flags = {}  # a local dataset's command: the connection flags are for its trusted roots
    out: dict[str, Any] = connection_options(url, **flags)
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--storage-option")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def trusted_roots_for(values: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The --trust-root locations: where a merged dataset may name shards by full URL. One in object
    storage is reached with the command's storage flags (``values``: its -o KEY=VALUE); a local one
    needs none."""
    roots = click.get_current_context().meta.get("shardstream.trusted", ())
    return {root: storage_options_for(values, root) if is_url(root) else {} for root in roots}


def storage_settings_for(values: tuple[str, ...], url: str) -> StorageSettings:
    """The command's storage flags for ``url`` as a dataset's settings (options and trusted roots)."""
    return StorageSettings(
        options=storage_options_for(values, url), trusted_roots=trusted_roots_for(values)
    )


def _trust(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    if value:
        ctx.meta["shardstream.trusted"] = value
    return value


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value:
        ctx.meta.setdefault("shardstream.connection", {})[param.name] = value
    return value


def storage_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say how to reach object storage, for every command."""
    for option in reversed(
        [
            click.option(
                "--endpoint-url",
                expose_value=False,
                callback=_remember,
                metavar="URL",
                help="S3-compatible or GCS endpoint, e.g. http://127.0.0.1:9000 (MinIO, R2, Ceph).",
            ),
            click.option(
                "--anon",
                is_flag=True,
                expose_value=False,
                callback=_remember,
                help="Anonymous access to a public bucket.",
            ),
            click.option(
                "--profile",
                expose_value=False,
                callback=_remember,
                metavar="NAME",
                help="AWS credentials profile (s3://).",
            ),
            click.option(
                "--trust-root",
                multiple=True,
                expose_value=False,
                callback=_trust,
                metavar="LOCATION",
                help="A location outside the dataset's folder that its manifest may name shards in by "
                "full URL (a merge across stores), e.g. s3://bucket/team-a (repeatable); reached with "
                "the flags above.",
            ),
            click.option(
                "--storage-option",
                "-o",
                "storage_options",
                multiple=True,
                metavar="KEY=VALUE",
                help="fsspec storage option (repeatable); VALUE is parsed as JSON when it can be.",
            ),
        ]
    ):
        command = option(command)
    return command


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardstream")
@click.option(
    "--traceback", is_flag=True, help="Show the traceback of an unexpected error (for bug reports)."
)
def cli(traceback: bool) -> None:
    """Pack folders and tables into sharded datasets; inspect and verify them."""
    _lenient_output()
    _quiet_logging()


def _lenient_output() -> None:
    """Characters the terminal's encoding lacks (``中`` under a Latin-1 locale) print as escapes, not a crash."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")


class _NoTraceback(logging.Formatter):
    def formatException(self, ei) -> str:  # logging's name
        return ""

    def format(self, record: logging.LogRecord) -> str:
        record.exc_text = ""
        return safe(super().format(record))


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (click's test runner swaps it for each command)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _quiet_logging() -> None:
    """shardstream's warnings as ``warning: ...`` lines; the storage clients' own error logs (with
    tracebacks) are left out, since the error line that follows says what went wrong."""
    log = logging.getLogger("shardstream")
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(_NoTraceback("warning: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    for name in ("gcsfs", "s3fs", "fsspec", "aiobotocore", "botocore", "google"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _pin(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None:
        ctx.meta["shardstream.dataset_version"] = value
    return value


def dataset_version_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--dataset-version N``: the commands that read a dataset read that version of it."""
    return click.option(
        "--dataset-version",
        type=click.IntRange(min=1),
        default=None,
        expose_value=False,
        callback=_pin,
        metavar="N",
        help="Read version N of the dataset (default: the latest; 'shardstream log' lists them).",
    )(command)


def dataset_version() -> int | None:
    """The version ``--dataset-version`` asks for (``None``: the latest)."""
    return click.get_current_context().meta.get("shardstream.dataset_version")


def open_dataset(dataset: str, storage_options: tuple[str, ...]) -> tuple[Store, Manifest]:
    """The store and manifest of DATASET, with the command's storage flags (and --trust-root), at the
    version --dataset-version names (default: the latest)."""
    return open_stored(
        dataset,
        storage_options_for(storage_options, dataset),
        version=dataset_version(),
        trusted_roots=trusted_roots_for(storage_options),
    )
