"""Secret redaction for anything the kernel records or hands back (design: Output Sanitization).

High-confidence secret shapes are replaced by ``[REDACTED:<kind>]`` before text reaches
the audit log or a summary; policy.yaml may add patterns.  The tool path's truncation
strategies build on :func:`redact`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

SECRET_PATTERNS: Final = (
    ("openai_key", r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"),
    ("github_token", r"gh[pousr]_[A-Za-z0-9]{20,}"),
    ("aws_access_key", r"(?:AKIA|ASIA)[0-9A-Z]{16}"),
    ("slack_token", r"xox[abposr]-[A-Za-z0-9\-]{10,}"),
    ("gitlab_token", r"glpat-[A-Za-z0-9_\-]{20,}"),
    ("npm_token", r"npm_[A-Za-z0-9]{36}"),
    (
        "private_key",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    ),
    ("bearer", r"(?i:(?<=authorization: bearer ))[A-Za-z0-9._\-]{8,}"),
)


class Redactor:
    def __init__(self, extra: Iterable[str] = ()) -> None:
        parts = [f"(?P<{name}>{pattern})" for name, pattern in SECRET_PATTERNS]
        parts += [f"(?P<policy_{i}>{pattern})" for i, pattern in enumerate(extra)]
        self._pattern = re.compile("|".join(parts))

    def redact(self, text: str) -> str:
        return self._pattern.sub(lambda m: f"[REDACTED:{m.lastgroup}]", text)


_DEFAULT = Redactor()


def redact(text: str) -> str:
    return _DEFAULT.redact(text)
