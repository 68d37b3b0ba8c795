"""Glob patterns over project paths, on the standard library (no pathspec in L2 images).

``*`` and ``?`` never cross a ``/``; ``**`` does (``**/`` also matches no folder at all);
``[abc]``, ``[a-z]`` and ``[!abc]`` are character classes.  A pattern without a ``/``
matches a file's name at any depth (``*.py`` finds every Python file, as in ripgrep and
.gitignore); a pattern with one matches the whole path from the project root.
"""

from __future__ import annotations

import re

from fluffy.errors import ToolInputInvalid


def _char_class(body: str) -> str:
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    items: list[str] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            items.append(f"{re.escape(body[k])}-{re.escape(body[k + 2])}")
            k += 3
        else:
            items.append(re.escape(body[k]))
            k += 1
    return f"[^/{''.join(items)}]" if negate else f"[{''.join(items)}]"


def translate(pattern: str) -> str:
    """The regular expression (source) matching what ``pattern`` matches."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if i < n and pattern[i] == "/":
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := pattern.find("]", i + 2)) != -1:
            out.append(_char_class(pattern[i + 1 : end]))
            i = end + 1
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return "(?s:" + "".join(out) + r")\Z"


class Glob:
    """A compiled pattern; :meth:`matches` takes a ``/``-separated relative path."""

    def __init__(self, pattern: str) -> None:
        cleaned = pattern.strip()
        while cleaned.startswith("./"):
            cleaned = cleaned[2:]
        cleaned = cleaned.lstrip("/")
        if not cleaned:
            raise ToolInputInvalid(f"the glob {pattern!r} is empty", fix="Use e.g. '**/*.py'.")
        self.pattern = cleaned
        self.by_name = "/" not in cleaned
        try:
            self.regex = re.compile(translate(cleaned))
        except re.error as exc:
            raise ToolInputInvalid(
                f"the glob {pattern!r} is not valid: {exc}",
                fix="Use *, ?, ** and [a-z] classes only.",
            ) from None

    def matches(self, rel: str) -> bool:
        target = rel.rsplit("/", 1)[-1] if self.by_name else rel
        return self.regex.match(target) is not None
