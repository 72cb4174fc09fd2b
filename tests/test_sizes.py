"""parse_size / format_size: human byte sizes in and out."""

from __future__ import annotations

import pytest

from shardstream.errors import ShardstreamError
from shardstream.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1),
        (123_456, 123_456),
        ("1000000", 1_000_000),
        ("10b", 10),
        ("10B", 10),
        ("1k", 1000),
        ("1KB", 1000),
        ("256MB", 256_000_000),
        ("256mb", 256_000_000),
        ("256 MB", 256_000_000),
        ("  256MB  ", 256_000_000),
        ("256M", 256_000_000),
        ("2GB", 2_000_000_000),
        ("2g", 2_000_000_000),
        ("3TB", 3 * 10**12),
        ("1t", 10**12),
        ("1KiB", 1024),
        ("64MiB", 64 * 2**20),
        ("64mib", 64 * 2**20),
        ("1GiB", 2**30),
        ("1TiB", 2**40),
        ("1.5GB", 1_500_000_000),
        ("1.5GiB", 3 * 2**29),
        (".5MB", 500_000),
        ("2.MB", 2_000_000),
    ],
)
def test_parse_size_units(value, expected):
    assert parse_size(value) == expected


def test_decimal_and_binary_units_differ():
    assert parse_size("1MB") == 1000**2
    assert parse_size("1MiB") == 1024**2
    assert parse_size("1GB") < parse_size("1GiB")


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        -(2**40),
        "0",
        "0MB",
        "0.0001B",
        "-5MB",
        "-1",
        "abc",
        "10 parsecs",
        "",
        "   ",
        "MB",
        "1.2.3MB",
        "1e6",
        "5 M B",
        "0x10",
        None,
        True,
        False,
    ],
)
def test_parse_size_rejects_bad_values(value):
    with pytest.raises(ShardstreamError) as info:
        parse_size(value)
    assert repr(value) in str(info.value)


def test_parse_size_error_names_what_and_gives_an_example():
    with pytest.raises(ShardstreamError, match=r"cache size 'abc' is not a size.*256MB"):
        parse_size("abc", what="cache size")
    with pytest.raises(ShardstreamError, match=r"cache size 0 must be more than 0 bytes"):
        parse_size(0, what="cache size")


def test_bools_are_not_sizes_even_though_they_are_ints():
    # True == 1 in Python; a size of True is a mistake, not one byte.
    with pytest.raises(ShardstreamError, match="True"):
        parse_size(True)


@pytest.mark.parametrize(
    ("value", "expected"), [("2.01KB", 2010), ("8.19KB", 8190), ("16.06KB", 16060)]
)
def test_parse_size_decimal_fractions_are_exact(value, expected):
    assert parse_size(value) == expected


def test_parse_size_large_integer_string_is_exact():
    assert parse_size("9007199254740993") == 9007199254740993


def test_parse_size_absurdly_large_string_is_a_user_error():
    with pytest.raises(ShardstreamError):
        parse_size("1" + "0" * 400)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (999, "999 B"),
        (1000, "1.0 KB"),
        (1500, "1.5 KB"),
        (512_300_000, "512.3 MB"),
        (2_000_000_000, "2.0 GB"),
        (10**12, "1.0 TB"),
        (5 * 10**15, "5000.0 TB"),
    ],
)
def test_format_size(n, expected):
    assert format_size(n) == expected


@pytest.mark.parametrize("n", [1, 999, 1000, 1234, 256_000_000, 1_500_000_000, 7 * 10**12])
def test_format_size_parses_back_to_about_the_same_size(n):
    text = format_size(n)
    assert abs(parse_size(text.replace(" ", "")) - n) <= 0.05 * n


@pytest.mark.parametrize(("n", "expected"), [(999_999, "1.0 MB"), (999_960_000, "1.0 GB")])
def test_format_size_never_shows_1000_of_a_unit(n, expected):
    assert format_size(n) == expected
