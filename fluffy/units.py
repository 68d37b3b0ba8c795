"""The design's unit specifications, with no guessing.

Sizes: IEC binary (``KiB``, ``MiB``, ``GiB``) and SI decimal (``KB``, ``MB``, ``GB``),
case-sensitive; a pure number is bytes.  Durations: ``ms``, ``s``, ``m``, ``h``,
case-sensitive; a pure number is refused (say which unit you mean).  Anything else is a
:class:`~fluffy.errors.ConfigError` naming the value and the accepted forms.
"""

from __future__ import annotations

import re

from fluffy.errors import ConfigError

_SIZE_UNITS = {
    "": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
}
_TIME_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_NUMBER = r"(\d+(?:\.\d+)?)"


def parse_size(value: str | int) -> int:
    """Bytes in ``value`` ("512MiB", "1GB", "100"); fractional results round down."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(
                f"size {value} is negative",
                fix="Give a size of 0 or more.",
                why="a size counts bytes",
            )
        return value
    match = re.fullmatch(_NUMBER + r"(KiB|MiB|GiB|KB|MB|GB)?", str(value).strip())
    if not match:
        raise ConfigError(
            f"{value!r} is not a size",
            why="sizes are a number with one of KiB, MiB, GiB (binary) or KB, MB, GB "
            "(decimal), case-sensitive; a pure number is bytes",
            fix='Write it like "512MiB", "1GB" or "1048576".',
        )
    return int(float(match[1]) * _SIZE_UNITS[match[2] or ""])


def parse_duration_ms(value: str) -> int:
    """Milliseconds in ``value`` ("100ms", "30s", "5m", "1h")."""
    match = re.fullmatch(_NUMBER + r"(ms|s|m|h)", str(value).strip())
    if not match:
        raise ConfigError(
            f"{value!r} is not a duration",
            why="durations are a number with one of ms, s, m, h (case-sensitive)",
            fix='Write it like "100ms", "30s", "5m" or "1h".',
        )
    return int(float(match[1]) * _TIME_UNITS_MS[match[2]])


def valid_size(value: str) -> str:
    """A pydantic field validator: ``value`` if it is a size, else ValueError (which
    pydantic reports with the field's name and place)."""
    try:
        parse_size(value)
    except ConfigError as exc:
        raise ValueError(f"{exc.what}: {exc.why}") from None
    return value


def valid_duration(value: str) -> str:
    """A pydantic field validator for durations (see :func:`valid_size`)."""
    try:
        parse_duration_ms(value)
    except ConfigError as exc:
        raise ValueError(f"{exc.what}: {exc.why}") from None
    return value
