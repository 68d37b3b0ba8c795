"""Secret redaction for anything the kernel records or hands back (design: Output Sanitization).

High-confidence secret shapes are replaced by ``[REDACTED:<kind>]`` before text reaches
the audit log or a summary; policy.yaml may add patterns.  The tool path's truncation
strategies (:mod:`fluffy.kernel.tools.reading.sanitizer`) build on :class:`Redactor`.

Policy patterns are compiled one by one (a broken one is refused with a
:class:`~fluffy.errors.ConfigError` naming it) and applied after the built-ins, each on
its own, so their group numbers, back-references and inline flags mean what they say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import partial
from typing import Final

from fluffy.errors import ConfigError

SECRET_PATTERNS: Final = (
    ("openai_key", r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"),
    ("github_token", r"gh[pousr]_[A-Za-z0-9]{20,}"),
    ("aws_access_key", r"(?:AKIA|ASIA)[0-9A-Z]{16}"),
    # xoxb-/xoxp-/xoxa-/xoxe-... and the design's literal "xox-".
    ("slack_token", r"xox[a-z]?-[A-Za-z0-9\-]{10,}"),
    ("gitlab_token", r"glpat-[A-Za-z0-9_\-]{20,}"),
    ("npm_token", r"npm_[A-Za-z0-9]{36}"),
    (
        "private_key",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    ),
    ("bearer", r"(?i:(?<=authorization: bearer ))[A-Za-z0-9._\-]{8,}"),
)

_BUILTIN: Final = re.compile(
    "|".join(f"(?P<{name}>{pattern})" for name, pattern in SECRET_PATTERNS)
)
#: Every built-in match contains one of these (checked by tests): text without any of them
#: skips the (much slower) combined pattern.  "bearer " is looked for in lower case.
_LITERALS: Final = (
    *("sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "AKIA", "ASIA"),
    *("xox", "glpat-", "npm_", "-----BEGIN "),
)
#: The same, as patterns that start with a literal, for long text: the regex engine's
#: prefix search runs over it (5-9 µs each in 20 KB of JSON, where ``literal in text``
#: took 9-13 µs: 49 µs for the seven instead of 125 µs for the twelve literals).  Below
#: :data:`_SHORT` characters a call's own cost dominates and the literals are faster.
_PREFIXES: Final = tuple(
    re.compile(prefix).search
    for prefix in ("sk-", "gh[pousr]_", "A[KS]IA", "xox", "glpat-", "npm_", "-----BEGIN ")
)
_SHORT: Final = 128
#: Where a built-in token begins (all of them but the private key, whose pattern also
#: matches one cut off at the end of the text, and the bearer token, after its header).
TOKEN_START: Final = re.compile("sk-|gh[pousr]_|A[KS]IA|xox|glpat-|npm_")


def may_hold_secret(text: str) -> bool:
    """A fast, sound pre-check: False means no built-in pattern can match ``text``."""
    if len(text) < _SHORT:
        for literal in _LITERALS:  # a loop, not any(<generator>): half the time on short text
            if literal in text:
                return True
    else:
        for search in _PREFIXES:
            if search(text):
                return True
    return "bearer " in text.lower()


def compile_policy_pattern(pattern: str) -> re.Pattern[str]:
    """Compile one policy.yaml redaction pattern, or raise :class:`ConfigError` naming it."""
    try:
        compiled = re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise ConfigError(
            f"redaction pattern {pattern!r} is not a valid regular expression",
            why=str(exc),
            fix="Correct the pattern in policy.yaml (tools.redact_patterns); Python `re` syntax.",
        ) from None
    if compiled.fullmatch("") is not None:
        raise ConfigError(
            f"redaction pattern {pattern!r} matches the empty string",
            why="a pattern that matches nothing would be 'found' between every two characters",
            fix="Make the pattern require at least one character (e.g. `+` instead of `*`).",
        )
    return compiled


class Redactor:
    """Built-in secret shapes plus policy patterns (``[REDACTED:policy_<i>]``)."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self._extra = [
            (f"policy_{i}", compile_policy_pattern(pattern)) for i, pattern in enumerate(extra)
        ]

    def redact(self, text: str) -> str:
        return self.scan(text)[0]

    def scan(self, text: str) -> tuple[str, list[str]]:
        """``(redacted text, the kind of every redaction made, in order)``."""
        likely = may_hold_secret(text)
        if not likely and not self._extra:
            return text, []  # the usual case: no closure made (a tool's result has many)
        kinds: list[str] = []

        def replace(match: re.Match[str], kind: str | None = None) -> str:
            if not match.group(0):  # a policy pattern's empty match elsewhere: no secret
                return ""
            found = kind or match.lastgroup or "secret"
            kinds.append(found)
            return f"[REDACTED:{found}]"

        if likely:
            text = _BUILTIN.sub(replace, text)
        for kind, pattern in self._extra:
            text = pattern.sub(partial(replace, kind=kind), text)
        return text, kinds


_DEFAULT = Redactor()


def redact(text: str) -> str:
    return _DEFAULT.redact(text)
