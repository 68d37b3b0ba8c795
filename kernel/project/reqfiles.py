"""Requirements and constraints files (pip's format), read as data with line numbers.

Only what pip's format means as *data* is taken: requirements, ``-r``/``-c`` includes
(inside the project only), ``--hash=sha256:`` of a pinned line.  Every other option
(``--index-url``, ``--extra-index-url``, ``--find-links``, ``--no-binary``, ``-e``, ...) is
never passed on: an index or a build setting is the person's pip configuration, not the
repository's to choose.  ``-e .`` and ``.`` name the project itself, which is installed
from the tree anyway.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from pathlib import Path

from fluffy.kernel.project.files import read_text
from fluffy.kernel.project.reqlines import (
    Refusal,
    constraint_line,
    pin,
    render,
    requirement,
    sha256_of,
    shown,
)
from fluffy.pathnames import is_utf8

_REQ_FILE = re.compile(r"(.*[-_])?requirements([-_.].*)?\.(txt|in)$|^(dev|test)s?[-_].*\.txt$")
MAX_INCLUDE_DEPTH = 5
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Requirements files for other jobs than testing (docs, linters, type checks, releases).
_NOT_FOR_TESTS = (
    *("doc", "lint", "mypy", "typecheck", "typing", "packaging", "release"),
    *("publish", "style", "format", "pre-commit", "ruff", "flake8", "black"),
)
_INCLUDE = ("-r", "--requirement", "-c", "--constraint")
_SELF = {".", "./", "-e .", "-e ./", "--editable .", "--editable=."}
_HASH = re.compile(r"\s--hash[=\s]+(\S+)")

#: ``add(line, where)`` for requirements, ``constrain(line, where)`` for constraints
Sink = Callable[[str, str], None]


def requirement_files(root: Path) -> list[str]:
    """Requirements files at the root and under ``requirements/`` (docs files left out)."""
    found: list[str] = []
    for folder in (".", "requirements"):
        base = root if folder == "." else root / folder
        if base.is_symlink():
            continue  # a folder that leads elsewhere is not the project's
        try:
            names = sorted(
                p.name
                for p in base.iterdir()
                if p.is_file() and not p.is_symlink() and is_utf8(p.name)  # no text can name
            )
        except OSError:
            continue
        for name in names:
            if any(word in name.lower() for word in _NOT_FOR_TESTS):
                continue
            if (folder == "requirements" and name.endswith((".txt", ".in"))) or _REQ_FILE.match(
                name
            ):
                found.append(name if folder == "." else f"{folder}/{name}")
    # a .txt compiled from a .in (pip-tools) is the pinned one: prefer it
    found = [f for f in found if not (f.endswith(".in") and f[:-3] + ".txt" in found)]
    return [f for f in found if not _variant_of(f, found)]


#: ``tests37.txt``, ``requirements-py38.txt``: the same set compiled for one Python.
_PY_VARIANT = re.compile(r"^(.*?)[-_.]?(?:py)?[-_.]?[23]\.?\d{1,2}(\.(?:txt|in))$")


def _variant_of(rel: str, found: list[str]) -> bool:
    """``rel`` is a version-suffixed copy of another file found (jinja's tests37.txt beside
    its tests.txt, pinned for Python 3.7): its pins contradict the main file's, and the
    main one is what the tests need."""
    match = _PY_VARIANT.match(rel)
    return match is not None and f"{match.group(1)}{match.group(2)}" in found


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with ``\\`` continuations joined and comments cut."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        line = line if line.startswith("#") else re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
        if line.strip() and not line.startswith("#"):
            out.append((start, line.strip()))
    return out


def _included(rel: str, target: str) -> str | None:
    """The include's path relative to the project, or None when it leaves the project."""
    if target.startswith("/") or "://" in target:
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return None if joined.startswith("../") or joined == ".." else joined


class RequirementsReader:
    """Reads one project's requirements files into ``add`` / ``constrain``."""

    def __init__(self, root: Path, refused: list[Refusal], hashes: dict[str, set[str]]) -> None:
        self.root, self.refused, self.hashes = root, refused, hashes
        self._seen: set[str] = set()
        self.read: list[str] = []  # every file read, in order

    def requirements(self, rel: str, add: Sink, constrain: Sink, depth: int = 0) -> None:
        self._read(rel, add, constrain, depth, constraints=False)

    def constraints(self, rel: str, constrain: Sink, depth: int = 0) -> None:
        self._read(rel, constrain, constrain, depth, constraints=True)

    def _read(self, rel: str, add: Sink, constrain: Sink, depth: int, *, constraints: bool) -> None:
        if rel in self._seen or depth > MAX_INCLUDE_DEPTH:
            return
        self._seen.add(rel)
        text = read_text(self.root, rel, MAX_FILE_BYTES)
        if text is None:
            self.refused.append(Refusal(rel, rel, "not a readable file inside the project",
                                        "fix the include"))  # fmt: skip
            return
        self.read.append(rel)
        for number, line in _logical_lines(text):
            where = f"{rel}:{number}"
            head = line.split(None, 1)
            if head[0] in _INCLUDE or head[0].startswith(("--requirement=", "--constraint=")):
                self._include(rel, where, line, add, constrain, depth)
            elif line in _SELF:
                continue  # the project itself: installed from the tree
            elif line.startswith("-"):
                self.refused.append(Refusal(where, shown(line), "a pip option in the "
                                            "repository's file; it is never passed to pip",
                                            "set indexes and build options in your own pip "
                                            "configuration"))  # fmt: skip
            else:
                self._entry(line, where, add, constrain if constraints else None)

    def _include(
        self, rel: str, where: str, line: str, add: Sink, constrain: Sink, depth: int
    ) -> None:
        option, _, target = line.replace("=", " ", 1).partition(" ")
        joined = _included(rel, target.strip())
        if joined is None:
            self.refused.append(Refusal(where, shown(line), "an include outside the project",
                                        "keep included files inside the project"))  # fmt: skip
        elif option in ("-c", "--constraint"):
            self.constraints(joined, constrain, depth + 1)
        else:
            self.requirements(joined, add, constrain, depth + 1)

    def _entry(self, line: str, where: str, add: Sink, constrain: Sink | None) -> None:
        digests = {d for d in map(sha256_of, _HASH.findall(" " + line)) if d}
        body = _HASH.sub("", " " + line).strip()
        if constrain is not None:
            kept = constraint_line(body, where, self.refused)
            if kept is not None:
                constrain(kept, where)
            return
        req = requirement(body, where, self.refused)
        if req is None:
            return
        add(render(req), where)
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if digests and len(pinned) == 1:
            key = pin(req.name, pinned[0], where, self.refused)
            if key is not None:
                self.hashes.setdefault(key, set()).update(digests)
