"""Command patterns: how a rule's ``command`` condition matches a command's argv.

A pattern is written like a command line (shell quoting, no shell): ``python -m mypkg
**``.  Each word is a glob for the argument in its place (``*``, ``?`` and ``[...]``
within that one argument: ``*`` never spans two arguments, so ``pytest *`` matches
``pytest -x`` and not ``pytest -x tests``); a last word ``**`` matches any number of
further arguments, none included.  Otherwise a pattern matches a command of exactly as
many arguments.  Nothing is normalised: ``python`` does not match ``/usr/bin/python``,
and ``sh -c **`` is how a rule allows every shell command, on purpose.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Sequence

#: A last word that matches any number of further arguments.
REST = "**"


def parse_pattern(text: str) -> tuple[str, ...]:
    """The words of ``text``; ValueError (pydantic's field error) when it is not one."""
    if "\x00" in text:
        raise ValueError(f"{text!r} is not a command pattern: it holds a NUL character")
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a command pattern: {exc}") from None
    if not words:
        raise ValueError("an empty command pattern matches nothing: write the command")
    if REST in words[:-1]:
        raise ValueError(f"{text!r}: {REST} (any further arguments) may only be the last word")
    if words[0] == REST:
        raise ValueError(f"{text!r} matches every command: name the program it allows")
    return words


def matches(pattern: Sequence[str], argv: Sequence[str]) -> bool:
    """Whether ``argv`` is a command ``pattern`` (from :func:`parse_pattern`) describes."""
    rest = bool(pattern) and pattern[-1] == REST
    fixed = pattern[:-1] if rest else pattern
    if len(argv) < len(fixed) or (not rest and len(argv) != len(fixed)):
        return False
    return all(fnmatch.fnmatchcase(arg, word) for word, arg in zip(fixed, argv, strict=False))


def shown(argv: Sequence[str]) -> str:
    """``argv`` as a person reads (and a rule's pattern can quote) it."""
    return shlex.join(argv)
