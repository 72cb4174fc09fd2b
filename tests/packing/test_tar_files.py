"""The buffered fast path of folder packs: the same bytes as TarShardWriter, the same errors."""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections import Counter

import pytest

from shardstream.errors import SourceError
from shardstream.formats.tar import TarShardWriter, iter_members
from shardstream.packing.folder import read_file
from shardstream.packing.tar_files import BUFFER_BYTES, write_files, writeback_starter
from shardstream.sources import FileSample


def _reference(samples: list[FileSample]) -> bytes:
    """The shard TarShardWriter writes for ``samples`` (the slow path of folder.write_shard)."""
    out = io.BytesIO()
    writer = TarShardWriter(out)
    for s in samples:
        fields = [(ext, read_file(path, size)) for ext, path, size in s.files]
        if s.label is not None:
            fields.append(("cls", str(s.label).encode()))
            fields.sort(key=lambda f: f[0])
        writer.add(s.key, fields)
    writer.close()
    return out.getvalue()


def _fast(
    tmp_path, samples: list[FileSample], writeback: bool = False
) -> tuple[bytes, int, str, Counter[str]]:
    target = tmp_path / "out.tar"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        nbytes, digest, counts = write_files(fd, samples, read_file, writeback)
    finally:
        os.close(fd)
    return target.read_bytes(), nbytes, digest, counts


def _file(folder, name: str, size: int, seed: int = 0) -> tuple[str, int]:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes((seed + i * 7) % 251 for i in range(size)))
    return str(path), size


def _samples(tmp_path) -> list[FileSample]:
    src = tmp_path / "src"
    out: list[FileSample] = []
    sizes = [0, 1, 511, 512, 513, 25_000, 700_000, 1_000_000, BUFFER_BYTES + 12_345, 3, 40_000]
    for i, size in enumerate(sizes):
        path, n = _file(src, f"c/{i:03d}.jpg", size, seed=i)
        files = [("jpg", path, n)]
        if i % 3 == 0:  # a second field, sorting after "cls"
            files.append(("txt", *_file(src, f"c/{i:03d}.txt", 10 + i, seed=99)))
        out.append(FileSample(f"c/{i:03d}", files, label=i % 4 if i % 2 else None))
    long_key = "d/" + "x" * 120  # longer than a ustar name: a PAX header
    out.append(FileSample(long_key, [("png", *_file(src, f"{long_key}.png", 2_000))], label=7))
    return out


def test_same_bytes_as_the_tar_writer(tmp_path):
    samples = _samples(tmp_path)
    expected = _reference(samples)
    data, nbytes, digest, counts = _fast(tmp_path, samples)
    assert data == expected
    assert nbytes == len(expected) and digest == hashlib.sha256(expected).hexdigest()
    assert counts == Counter({"jpg": 11, "png": 1, "cls": 6, "txt": 4})
    members = [name for name, _, _ in iter_members(data)]
    assert members[:3] == ["c/000.jpg", "c/000.txt", "c/001.cls"]


def test_labels_names_at_the_ustar_limit_and_unicode_keys_give_the_same_bytes(tmp_path):
    src = tmp_path / "src"
    samples = [
        # one field that sorts after "cls", and one equal to it in length, each with a label
        FileSample("c/a", [("txt", *_file(src, "c/a.txt", 30))], label=1),
        FileSample("c/b", [("cbz", *_file(src, "c/b.cbz", 31))], label=22),
        FileSample("c/b2", [("cls", *_file(src, "c/b2.cls", 5))]),
        # names of 100 bytes (one ustar block) and 101 (a PAX header)
        FileSample("k" * 96, [("txt", *_file(src, "k" * 96 + ".txt", 700))], label=0),
        FileSample("k" * 97, [("txt", *_file(src, "k" * 97 + ".txt", 701))]),
        FileSample("é/" + "é" * 48, [("jpg", *_file(src, "é/" + "é" * 48 + ".jpg", 40))]),
    ]
    expected = _reference(samples)
    data, nbytes, digest, _ = _fast(tmp_path, samples)
    assert data == expected and digest == hashlib.sha256(expected).hexdigest()
    members = [name for name, _, _ in iter_members(data)]
    assert members[:4] == ["c/a.cls", "c/a.txt", "c/b.cbz", "c/b.cls"]


def test_writeback_changes_no_byte(tmp_path):
    samples = _samples(tmp_path)
    assert _fast(tmp_path, samples, writeback=True)[0] == _reference(samples)


def test_writeback_is_there_on_linux():
    assert (writeback_starter() is not None) == os.uname().sysname.startswith("Linux")


def test_a_file_that_grew_is_refused_by_name(tmp_path):
    samples = _samples(tmp_path)[:3]
    path, size = samples[1].files[0][1], samples[1].files[0][2]
    with open(path, "ab") as f:
        f.write(b"more")
    grew = rf"{re.escape(path)} changed while packing \(it was {size} bytes, now more\)"
    with pytest.raises(SourceError, match=grew):
        _fast(tmp_path, samples)


def test_a_file_that_shrank_is_refused_by_name(tmp_path):
    samples = _samples(tmp_path)[5:7]
    path = samples[1].files[0][1]
    os.truncate(path, 100)
    with pytest.raises(
        SourceError,
        match=rf"{re.escape(path)} changed while packing \(it was 700000 bytes, now 100\)",
    ):
        _fast(tmp_path, samples)


def test_a_missing_file_is_refused_by_name(tmp_path):
    samples = _samples(tmp_path)[:4]
    path = samples[2].files[0][1]
    os.unlink(path)
    with pytest.raises(SourceError, match=rf"cannot read {re.escape(path)}"):
        _fast(tmp_path, samples)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


def test_files_from_more_folders_than_stay_open_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    samples = []
    for i in range(300):  # more folders than write_files keeps open at once
        path, size = _file(tmp_path, f"src/f{i:03d}/{i}.bin", 700 + i, seed=i)
        samples.append(
            FileSample(f"f{i:03d}/{i}", [("bin", os.path.relpath(path), size)], label=i % 3)
        )
    # no folder in its path
    samples.append(FileSample("top", [("bin", *_file(tmp_path, "top.bin", 5))]))
    samples[-1].files[0] = ("bin", "top.bin", 5)
    before = _open_fds()
    assert _fast(tmp_path, samples)[0] == _reference(samples)
    assert _open_fds() == before
