from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluffy.errors import ConfigError
from fluffy.units import parse_duration_ms, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 2**20),
        ("1GiB", 2**30),
        ("100KiB", 102400),
        ("1KB", 1000),
        ("2MB", 2_000_000),
        ("1GB", 10**9),
        ("1048576", 1048576),
        ("1.5KiB", 1536),
        (0, 0),
    ],
)
def test_sizes(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["512mib", "1gb", "1 GiB B", "MiB", "-1MiB", "1TiB", "", "1kb"])
def test_sizes_are_case_sensitive_and_never_guessed(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text)
    assert "KiB" in info.value.why


@pytest.mark.parametrize(
    ("text", "expected"), [("100ms", 100), ("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000)]
)
def test_durations(text: str, expected: int) -> None:
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize("text", ["100", "1S", "1 min", "ms", "1.5.2s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration_ms(text)


@given(st.integers(0, 10**6), st.sampled_from(["KiB", "MiB", "KB", "MB", ""]))
def test_size_round_trip(number: int, unit: str) -> None:
    factor = {"KiB": 1024, "MiB": 2**20, "KB": 1000, "MB": 10**6, "": 1}[unit]
    assert parse_size(f"{number}{unit}") == number * factor
