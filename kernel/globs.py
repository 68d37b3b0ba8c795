"""Path globs with .gitignore semantics (design: Match semantics), compiled once.

pathspec implements the patterns (``**``, ``*``, anchoring); this adds git's directory
rule (once a parent directory matches, everything below it matches, gitignore(5)) and the
design's priority: exclusions (``!pattern``) always win over inclusions, wherever they
stand.  ``tests/unit`` checks inclusions against ``git check-ignore``.  A kernel-wide
helper (like :mod:`fluffy.kernel.yamltext`): the policy engine and the merge both match
paths with it, and neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pathspec
from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

from fluffy.pathnames import matchable


class _GitIgnoreSet:
    """One list of patterns with gitignore semantics, git's directory rule included."""

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
        if not self._globs:
            return False
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if self._dir_matches("/".join(parts[:depth])):
                return True
        return bool(self._spec.match_file(path))


class GlobSet:
    """A rule's ``path_glob`` list: includes with gitignore semantics, and exclusions
    (``!pattern``) that always win, wherever they stand in the list (design: "Exclude
    takes priority over include" -- an exclusion is never silently cancelled by order)."""

    __slots__ = ("_exclude", "_globs", "_include")

    def __init__(self, globs: Sequence[str], *, lazy: bool = False) -> None:
        """``lazy``: compile at the first match, not now (a set that is known valid --
        fluffy's own, or validated when its policy was read -- and not needed to
        start: compiling a long list costs milliseconds of the kernel's start)."""
        self._globs = tuple(globs)
        self._include: _GitIgnoreSet | None = None
        self._exclude: _GitIgnoreSet | None = None
        if not lazy:  # an invalid pattern raises here, where the list is given
            self._compile()

    def _compile(self) -> tuple[_GitIgnoreSet, _GitIgnoreSet]:
        globs = self._globs
        include = _GitIgnoreSet([g for g in globs if not g.startswith("!")])
        exclude = _GitIgnoreSet([g[1:] for g in globs if g.startswith("!")])
        self._include, self._exclude = include, exclude
        return include, exclude

    def match(self, path: str) -> bool:
        """Whether ``path`` matches (a name that is not UTF-8: by its readable part)."""
        include, exclude = self._include, self._exclude
        if include is None or exclude is None:
            include, exclude = self._compile()
        try:
            return include.match(path) and not exclude.match(path)
        except UnicodeError:  # a surrogate escape: RE2 takes UTF-8 only
            return self.match(matchable(path))


class Patterns:
    """A plain list of gitignore-style patterns (no exclusion priority), matched
    against project paths; a name that is not UTF-8 is matched by its readable part."""

    __slots__ = ("_spec",)

    def __init__(self, globs: Sequence[str]) -> None:
        self._spec = pathspec.GitIgnoreSpec.from_lines(globs)

    def match(self, path: str) -> bool:
        try:
            return bool(self._spec.match_file(path))
        except UnicodeError:  # a surrogate escape: RE2 takes UTF-8 only
            return bool(self._spec.match_file(matchable(path)))


_WILD = frozenset("*?[\\")


#: A list of globs longer than this (characters in all, or globs) is also compiled whole
#: when it is checked, as the policy engine and the merge will compile it: RE2 refuses a
#: set past its memory budget (one ~16 KB glob; ~1,400 short ones), which no glob's own
#: conversion shows.  Policies' usual lists are far shorter and cost no compile.
WHOLE_CHARS = 1_000
WHOLE_GLOBS = 32


def check_globs(globs: Sequence[str]) -> None:
    """ValueError (what a settings model's validator raises) when the list ``globs``
    cannot be matched with, naming the glob when one alone is the reason:
    :func:`glob_problem` for each, and a long list compiled whole."""
    for glob in globs:
        problem = glob_problem(glob)
        if problem is not None:
            raise ValueError(f"{glob!r} is not a path glob: {problem}")
    if len(globs) > WHOLE_GLOBS or sum(map(len, globs)) > WHOLE_CHARS:
        try:
            GlobSet(globs).match("x")
        except Exception as exc:  # RE2's "failed to compile Set", or its memory budget
            what = f"{globs[0][:40]!r}..." if len(globs) == 1 else f"these {len(globs)} globs"
            raise ValueError(
                f"{what} are too large for the matcher ({exc}): use fewer, broader globs, "
                "or split them over several rules"
            ) from None


def glob_problem(glob: str) -> str | None:
    """Why ``glob`` is no pattern :class:`GlobSet` can match with (pathspec's, re's or
    re2's own words), or None when it is one.

    Cheap enough for a whole policy: the pattern is converted to its regular expression
    (~5 us), and only a bracket expression, the one place a glob's own text becomes
    regular-expression syntax (``[z-a]``: a bad range), is compiled too.  Checking a
    policy's ~150 globs costs ~1 ms instead of the ~15 ms of compiling them all, which
    the policy engine then does for each rule when it first looks at it."""
    try:
        GitIgnoreSpecPattern.pattern_to_regex(glob.removeprefix("!"))  # as GlobSet splits
        if "[" in glob:
            GlobSet((glob,)).match("x")
    except Exception as exc:  # pathspec's, re's or re2's error: each a bad glob
        return str(exc) or type(exc).__name__
    return None


def literal_roots(globs: Sequence[str]) -> frozenset[str] | None:
    """The first path segments every path these globs can match starts with.

    None when some positive glob can match anywhere (no slash before its end, a leading
    ``**``, a wildcard in the first segment): such rules are checked for every path.
    Negations only remove matches, so they never widen the set.
    """
    roots: set[str] = set()
    for raw in globs:
        if raw != raw.strip():
            return None  # whitespace is significant to the matcher: do not second-guess it
        glob = raw
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


#: Files that hold the person's secrets (gitignore syntax): the model is never shown their
#: content by the kernel's reads and searches (an example or template file is not one).
SECRET_FILES: tuple[str, ...] = (
    *(".env", ".env.*", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*"),
    *("id_ed25519*", "id_ecdsa*", "**/secrets/**", "**/.ssh/**", ".pypirc", ".npmrc"),
    *(".netrc", ".git-credentials", ".dockercfg", "**/.docker/config.json"),
    *("*.env", "**/.aws/credentials", "credentials.json", "**/.streamlit/secrets.toml"),
    *("*.tfvars", "*.tfstate", "**/.kube/config", ".pgpass", ".htpasswd"),
    *("!*.example", "!*.sample", "!*.template", "!*.dist", "!*.pub"),
)
_SECRETS = GlobSet(SECRET_FILES, lazy=True)


def is_secret_file(rel: str) -> bool:
    """Whether the project path ``rel`` is one of :data:`SECRET_FILES`, in any case
    (``.ENV``, ``server.PEM``); a name that is not UTF-8 is matched by its readable part."""
    try:
        lower = rel.lower()
        return _SECRETS.match(rel) or (lower != rel and _SECRETS.match(lower))
    except UnicodeError:  # a surrogate escape: no matcher takes it
        return is_secret_file(matchable(rel))
