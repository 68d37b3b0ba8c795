"""Path globs with .gitignore semantics (design: Match semantics), compiled once.

pathspec implements the patterns (``**``, ``*``, anchoring, negation with ``!``, the last
matching pattern wins); this adds git's directory rule: once a parent directory matches,
nothing below it can be re-included ("It is not possible to re-include a file if a parent
directory of that file is excluded", gitignore(5)).  ``tests/unit`` checks the result
against ``git check-ignore``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pathspec


class GlobSet:
    __slots__ = ("_globs", "_own", "_spec")

    def __init__(self, globs: Sequence[str]) -> None:
        self._globs = tuple(globs)
        self._spec = pathspec.GitIgnoreSpec.from_lines(self._globs)
        # "d/**" matches what is inside d, not d itself: a spec without those, per d.
        self._own: dict[str, pathspec.GitIgnoreSpec] = {}

    def _dir_matches(self, folder: str) -> bool:
        if not self._spec.match_file(folder + "/"):
            return False
        inside_only = {f"{folder}/**", f"/{folder}/**"}
        if not any(g.strip().lstrip("!") in inside_only for g in self._globs):
            return True
        own = self._own.get(folder)
        if own is None:
            own = pathspec.GitIgnoreSpec.from_lines(
                [g for g in self._globs if g.strip().lstrip("!") not in inside_only]
            )
            self._own[folder] = own
        return bool(own.match_file(folder + "/"))

    def match(self, path: str) -> bool:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if self._dir_matches("/".join(parts[:depth])):
                return True
        return bool(self._spec.match_file(path))


_WILD = frozenset("*?[\\")


def literal_roots(globs: Sequence[str]) -> frozenset[str] | None:
    """The first path segments every path these globs can match starts with.

    None when some positive glob can match anywhere (no slash before its end, a leading
    ``**``, a wildcard in the first segment): such rules are checked for every path.
    Negations only remove matches, so they never widen the set.
    """
    roots: set[str] = set()
    for raw in globs:
        glob = raw.strip()
        if glob.startswith("!"):
            continue
        if glob.startswith("\\"):
            glob = glob[1:]
        anchored = glob.startswith("/") or "/" in glob.rstrip("/")
        glob = glob.lstrip("/")
        first = glob.split("/", 1)[0]
        if not anchored or not first or any(ch in _WILD for ch in first):
            return None
        roots.add(first)
    return frozenset(roots)
