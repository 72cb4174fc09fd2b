"""The folder plan's shortcuts agree with the rules they shortcut: sample sizes by arithmetic, and all
keys checked at once."""

from __future__ import annotations

import pytest

from shardstream.errors import SourceError
from shardstream.formats import tar as tar_format
from shardstream.packing.fields import key_problem
from shardstream.packing.folder import check_sample_names, sample_bytes, sample_fields
from shardstream.sources import FileSample
from tests.packing.test_keys import GOOD_KEYS, HOSTILE_KEYS

KEYS = [
    "a",
    "class_03/000123",
    "é/ü",
    "x" * 95,
    "x" * 96,
    "x" * 97,
    "d/" + "y" * 120,
    "\udcff/bad-utf8",
]
SIZES = [0, 1, 511, 512, 513, 25_000, 8**11 - 1, 8**11, 10**12]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("label", [None, 0, 7, 12345])
def test_sample_bytes_is_the_tar_writers_size(key, label):
    for size in SIZES:
        for exts in (["jpg"], ["jpg", "txt"], ["bin"], ["ü"]):
            sample = FileSample(
                key, [(ext, f"/nowhere/{ext}", size + i) for i, ext in enumerate(exts)], label
            )
            assert sample_bytes(sample) == tar_format.sample_size(key, sample_fields(sample)), (
                key,
                size,
                exts,
            )


def _samples(keys: list[str], ext: str = "jpg") -> list[FileSample]:
    return [FileSample(k, [(ext, f"/src/{i}.{ext}", 10)]) for i, k in enumerate(keys)]


def test_good_keys_pass_in_bulk_and_one_by_one():
    plain = [f"class_{i % 10:02d}/{i:06d}" for i in range(1000)]
    check_sample_names(_samples(plain), "tar")
    check_sample_names(_samples(plain + GOOD_KEYS), "tar")
    for key in GOOD_KEYS:
        check_sample_names(_samples([key]), "tar")


@pytest.mark.parametrize("key", HOSTILE_KEYS + ["", "ends/"])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_one_hostile_key_among_good_ones_is_refused_by_name(key, where):
    keys = [f"class_00/{i:06d}" for i in range(2)]
    keys.insert(where, key)
    with pytest.raises(SourceError, match="its sample key .* rename the file") as info:
        check_sample_names(_samples(keys), "tar")
    assert repr(key) in str(info.value) and key_problem(key, "tar") in str(info.value)


@pytest.mark.parametrize("ext", ["a\\b", "esc\x1b", "new\nline"])
def test_a_hostile_field_name_is_refused_by_name(ext):
    with pytest.raises(SourceError, match="its field name .* rename the file"):
        check_sample_names(
            _samples(["class_00/1", "class_00/2"]) + _samples(["class_00/3"], ext), "tar"
        )
