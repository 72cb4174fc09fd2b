"""``python -m shardstream.cli``: the same as the ``shardstream`` command."""

from . import main

main()
