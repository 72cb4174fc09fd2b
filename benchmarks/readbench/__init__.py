"""The read benchmark behind ``benchmarks/read.py`` (its docstring is the user's guide).

- :mod:`.config`: settings every part shares (modes, batch size, workers, shard size).
- :mod:`.tools`: one module per tool, with its conversion (writer) and its loader.
- :mod:`.decoding`: JPEG decoding as the other tools' users would write it.
- :mod:`.convert`: each tool's converted copy of the data, written once (untimed) and reused.
- :mod:`.epoch`, :mod:`.limit`, :mod:`.arrow`: what runs inside a measured child process.
- :mod:`.procfs`: process-tree memory and CPU load, from ``/proc``.
- :mod:`.jobs`: jobs (tool, mode, place) and their results.
- :mod:`.harness`: running each job in a fresh, sampled child process, waiting for a quiet machine.
- :mod:`.targets`: the issue's targets, met or missed.
- :mod:`.report`: tables, Markdown and JSON; :mod:`.machine`: what the machine and the source are.
- :mod:`.cli`: the command line and the main flow (local, ``--remote s3`` (moto) and ``--remote seaweedfs``).
- :mod:`.firstbatch`: a script of its own: every request before shardstream's first batch from SeaweedFS.

Run as a script from the repository root, ``benchmarks/`` is ``sys.path[0]``: this package imports the
benchmarks' shared modules (``_data``, ``_remote``, ``pack``) as top-level modules, and shardstream only
through its top-level names.
"""
