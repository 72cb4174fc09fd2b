"""``shardstream pack`` starts without what it does not use: no torch (seconds), no tqdm under ``-q``,
no other command's module; every command still loads when it runs."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from shardstream.cli import cli
from shardstream.cli.common import COMMANDS
from tests.sample_datasets import make_files

PROBE = """
import json, sys
from shardstream.cli import main
sys.argv = ["shardstream", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tqdm", "pyarrow", "fsspec")
                        or m.startswith("shardstream.cli.") or m.startswith("shardstream.dataset"))))
"""


def _modules_after(*argv: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pack_imports_neither_torch_nor_tqdm_nor_other_commands(tmp_path):
    src = make_files(tmp_path / "src", {f"c{i % 2}/{i}.jpg": bytes([i]) * 100 for i in range(6)})
    loaded = _modules_after("pack", str(src), str(tmp_path / "out"), "-q", "--workers", "1")
    assert (tmp_path / "out" / "_manifest.json").exists()
    assert not [
        m
        for m in loaded
        if m.split(".")[0] in ("torch", "tqdm") or m.startswith("shardstream.dataset")
    ]
    assert [m for m in loaded if m.startswith("shardstream.cli.")] == [
        "shardstream.cli.common",
        "shardstream.cli.pack",
    ]


def test_every_command_loads_when_it_runs():
    runner = CliRunner()
    for name in COMMANDS:
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0 and f"Usage: cli {name}" in result.output, (
            name,
            result.output,
        )
    listed = runner.invoke(cli, ["--help"]).output
    assert all(f"  {name} " in listed for name in COMMANDS)
