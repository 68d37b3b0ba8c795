"""Glob patterns over project paths, with .gitignore's rules (pathspec, as the kernel).

``*`` and ``?`` never cross a ``/``; ``**`` does; ``[abc]``, ``[a-z]`` and ``[!abc]`` are
character classes.  A pattern without a ``/`` matches a name at any depth (``*.py``
finds every Python file, as in ripgrep and .gitignore); a pattern with one matches the
path from the project root; a pattern that names a folder matches what is inside it.
One pattern names what to include, so .gitignore's negation (``!``) and comments
(``#``) are refused rather than silently matching nothing.
"""

from __future__ import annotations

import pathspec

from fluffy.errors import ToolInputInvalid


class Glob:
    """A compiled pattern; :meth:`matches` takes a ``/``-separated relative path."""

    def __init__(self, pattern: str) -> None:
        cleaned = pattern.strip()
        while cleaned.startswith("./"):
            cleaned = cleaned[2:]
        cleaned = cleaned.lstrip("/")
        if not cleaned:
            raise ToolInputInvalid(
                f"the glob {pattern!r} is empty",
                why="an empty pattern names no file",
                fix="Use e.g. '**/*.py'.",
            )
        if cleaned[0] in "!#":
            raise ToolInputInvalid(
                f"the glob {pattern!r} starts with {cleaned[0]!r}",
                why="in .gitignore syntax that makes it an exclusion or a comment, and a "
                "search glob names the files to include",
                fix=f"Write '\\{cleaned[0]}' for a name that starts with {cleaned[0]!r}, "
                "or leave the character out.",
            )
        try:
            self._spec = pathspec.GitIgnoreSpec.from_lines([cleaned])
        except (ValueError, TypeError) as exc:  # pathspec's pattern errors are ValueErrors
            raise ToolInputInvalid(
                f"the glob {pattern!r} is not valid: {exc}",
                why="the pattern is not .gitignore syntax",
                fix="Use *, ?, ** and [a-z] classes only.",
            ) from None
        self.pattern = cleaned

    def matches(self, rel: str) -> bool:
        return self._spec.match_file(rel)
