"""The ``shardstream`` command, one module per command group: ``pack``; ``show`` (info, ls,
cat); ``check`` (verify, index). ``common`` holds the group, the storage flags and the
one-line errors they all share.
"""

from . import check, pack, show  # noqa: F401 - each registers its commands with the group
from .common import cli

__all__ = ["cli", "main"]


def main() -> None:
    cli(prog_name="shardstream")


if __name__ == "__main__":
    main()
