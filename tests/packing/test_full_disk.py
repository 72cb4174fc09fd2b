"""A disk that fills up while a dataset is written: every file is whole or the write fails, naming the
file, and a failed publish leaves no manifest. Each test mounts a small tmpfs (needs root; skipped
otherwise) and fills it to an exact number of free pages, so the write that runs out of room is the one
under test; a write that straddles the last free page is where a single unchecked ``write`` comes back
short instead of failing."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import shardstream as ss
from shardstream.errors import StorageError
from shardstream.manifest import MANIFEST_NAME
from shardstream.manifest.files import write_durably
from shardstream.storage import Store
from tests.folders import folder_files
from tests.oslimits import leave_free, tiny_tmpfs
from tests.sample_datasets import make_files

_EXE = Path(sys.executable).with_name("shardstream")
SHARDSTREAM = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "shardstream"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHARDSTREAM, *map(str, args)], capture_output=True, text=True, timeout=120
    )


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """The temporary files anywhere under ``folder`` (``.shardstream/`` too)."""
    return [n for n in folder_files(folder) if n.endswith(".tmp")]


def test_write_durably_never_leaves_a_cut_file(tmp_path):
    """The file that publishes a dataset (manifest, shard table, sample index) is written whole or not at
    all: a disk with one free page and 20 kB to write is an error naming the file, not 4 kB in place."""
    with tiny_tmpfs(tmp_path / "tiny", "256k") as tiny:
        leave_free(tiny, 4096)
        store = Store(tiny)
        data = json.dumps({"x": "y" * 20_000}).encode()
        with pytest.raises(StorageError) as caught:
            write_durably(store, MANIFEST_NAME, data)
        message = str(caught.value)
        assert str(tiny / MANIFEST_NAME) in message and "no space" in message
        assert not (tiny / MANIFEST_NAME).exists()
        assert leftovers(tiny) == []


def _tars(folder: Path, count: int) -> None:
    """``count`` one-sample tars (``tarfile``'s own, one 10 kB record each)."""
    folder.mkdir()
    for i in range(count):
        with tarfile.open(folder / f"part-{i:04d}.tar", "w") as tar:
            info = tarfile.TarInfo(f"{i:06d}.txt")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))


def test_index_on_a_full_disk_fails_on_one_line_and_publishes_nothing(tmp_path):
    """``shardstream index`` whose sample indexes and manifest (about 12 kB) meet a disk with one free page:
    exit 1, one line naming the file that did not fit and the fix, no manifest and no index left (before:
    exit 0 and a manifest cut at 4096 bytes)."""
    with tiny_tmpfs(tmp_path / "tiny", "2m") as tiny:
        ds = tiny / "tars"
        _tars(ds, 60)
        leave_free(tiny, 4096)
        proc = run("index", ds, "-q")
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        line = one_error_line(proc.stderr)
        assert f"cannot write {ds}/" in line and "no space" in line and "free some space" in line
        assert not (ds / MANIFEST_NAME).exists()
        assert not [n for n in folder_files(ds) if n.endswith(".idx")]
        assert leftovers(ds) == []


def _small_files(root: Path, count: int) -> Path:
    rng = random.Random(3)
    return make_files(root, {f"{i:05d}.bin": rng.randbytes(200) for i in range(count)})


def test_a_full_spool_fails_an_upload_instead_of_cutting_it(tmp_path, monkeypatch):
    """Uploads spool through the temporary folder; with room there for each small shard but not for the
    manifest (a store without conditional writes uploads it through the spool too), the pack fails naming
    the manifest and no manifest is uploaded (before: a manifest cut at 8192 bytes, and success)."""
    src = _small_files(tmp_path / "src", 150)
    url = f"memory://full-spool-{random.randrange(1 << 30)}/ds"
    with tiny_tmpfs(tmp_path / "spool", "256k") as spool:
        monkeypatch.setattr("tempfile.tempdir", str(spool))
        leave_free(spool, 8192)
        with pytest.raises(StorageError) as caught:
            ss.pack(src, url, samples_per_shard=1, workers=1, shuffle=False, index=False)
        assert f"{url}/{MANIFEST_NAME}" in str(caught.value) and "no space" in str(caught.value)
    assert not Store(url).exists(MANIFEST_NAME)


def test_folder_to_arrow_on_a_full_disk_names_the_shard_and_the_fix(tmp_path):
    """Folder to Arrow goes through ``ShardWriter``, whose shard file's errors were not its own: a full disk
    was a bare ``No space left on device``; now the one line other paths give, naming the shard."""
    src = make_files(
        tmp_path / "src", {f"{i:03d}.bin": random.Random(i).randbytes(3000) for i in range(100)}
    )
    with tiny_tmpfs(tmp_path / "tiny", "128k") as tiny:
        dest = tiny / "ds"
        proc = run("pack", src, dest, "--format", "arrow", "--shard-size", "100KB", "-q")
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        line = one_error_line(proc.stderr)
        assert f"cannot write {dest}/shard-" in line and ".arrow" in line, line
        assert "no space left" in line and "free some space or choose another destination" in line
        assert not (dest / MANIFEST_NAME).exists()
        assert leftovers(dest) == []


def test_shard_writer_on_a_full_disk_raises_a_storage_error_naming_the_shard(tmp_path):
    """The same through the API: a ``StorageError`` (a ``ShardstreamError``), the open shard removed."""
    with tiny_tmpfs(tmp_path / "tiny", "64k") as tiny:
        dest = tiny / "ds"
        writer = ss.ShardWriter(str(dest), format="arrow", shard_size="1MB")
        with pytest.raises(StorageError) as caught, writer:
            for i in range(200):
                writer.write({"__key__": f"{i:04d}", "blob": random.Random(i).randbytes(2000)})
        assert f"{dest}/shard-" in str(caught.value) and "no space" in str(caught.value)
        assert not (dest / MANIFEST_NAME).exists()
        assert leftovers(dest) == []
