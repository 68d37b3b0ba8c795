"""One requirement of a project's files, parsed as data before anything is fetched.

A repository names its dependencies in many places (pyproject.toml, requirements and
constraints files, lock files, ``[build-system] requires``), and a cloned repository is
untrusted: a line it writes must never reach pip as written.  ``pkg @ https://...`` makes
pip fetch that URL and run the archive's build backend on this machine (``--only-binary``
does not cover direct URLs); a line starting with ``-`` is a pip option
(``--extra-index-url=``, ``--no-binary``); a name with a newline in it is two lines.

So every line goes through :mod:`packaging`: what is kept is re-rendered from the parsed
parts (a PEP 508 name, extras, version specifiers, markers), and anything else (a URL,
VCS, a local path, an option, a name or version that does not parse) is a
:class:`Refusal` naming the file, the line and the fix.  Refused lines are never fetched.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import msgspec

from fluffy.pathnames import matchable

if TYPE_CHECKING:
    from packaging.requirements import Requirement

#: PEP 508's distribution name.
NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
#: A sha256 as hex (lock files and ``--hash=sha256:``).
SHA256 = re.compile(r"^[0-9a-f]{64}$")
FIX_SOURCE = (
    "name a release from the package index instead (e.g. `pkg>=1.2`), or build a wheel of "
    "it yourself and put it in .fluffy/wheels/"
)
#: What pip reads in a requirements file line beyond PEP 508: ``${VAR}`` (expanded from
#: the person's environment), `` -opt`` / `` --opt`` (options), `` #`` (a comment).
_PIP_SYNTAX = re.compile(r"\$|\s-|\s#|[\r\n\\]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: A name pip reads as a local archive to install (and build, on this machine), not as a
#: project on the index: PEP 508 names may hold dots, so `evil.tar.gz` parses as a name.
_ARCHIVE = (".zip", ".whl", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz",
            ".tlz", ".tar.lz", ".tar.lzma")  # fmt: skip
_AS_ARCHIVE = "a name pip would take for a local archive file, not a release on the index"


def _archive_name(name: str) -> bool:
    return name.lower().endswith(_ARCHIVE)


#: ``===`` compares text, not versions: it takes anything, `/` and `..` too, and pip
#: reads a line whose text looks like a path as a folder to build, on this machine.
_ARBITRARY = "`===` takes any text as a version (pip may read it as a path)"


def _plain_versions(req: Requirement) -> bool:
    """Every specifier is a PEP 440 comparison with a PEP 440 version (or ``==X.*``)."""
    from packaging.version import InvalidVersion, Version

    for spec in req.specifier:
        if spec.operator == "===":
            return False
        try:
            Version(spec.version.removesuffix(".*"))
        except InvalidVersion:
            return False
    return True


class Refusal(msgspec.Struct, frozen=True):
    """A line fluffy will not fetch: where it is, what it says, why, and what to do."""

    where: str  # "requirements/dev.txt:4", "pyproject.toml:12"
    text: str
    why: str
    fix: str = FIX_SOURCE

    def __str__(self) -> str:
        return f"{self.where}: {self.text!r} refused: {self.why}; {self.fix}"


def shown(text: str, limit: int = 100) -> str:
    """A line as it may be shown: control characters visible, bounded, UTF-8 (a file
    name's undecodable bytes as U+FFFD)."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", matchable(text.strip()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def line_of(source: str | None, needle: str) -> int | None:
    """The 1-based line of ``source`` that holds ``needle`` first (None: not found)."""
    if not source or not needle:
        return None
    at = source.find(needle)
    return None if at < 0 else source.count("\n", 0, at) + 1


def _refuse_url(req: Requirement) -> str:
    url = req.url or ""
    if url.startswith(("git+", "hg+", "svn+", "bzr+")):
        return "a VCS reference: its build would run on this machine"
    if url.startswith("file:"):
        return "a local path outside the package index"
    return "a direct URL: fluffy fetches only named releases from the package index"


def requirement(text: str, where: str, refused: list[Refusal]) -> Requirement | None:
    """``text`` as a requirement from the index, or None (a refusal is recorded)."""
    from packaging.requirements import InvalidRequirement, Requirement

    raw = text.strip()
    if _PIP_SYNTAX.search(raw):
        refused.append(Refusal(where, shown(raw), "it holds what pip would read as more "
                               "than a requirement (a $VARIABLE, an option, a comment)",
                               "write it as plain PEP 508"))  # fmt: skip
        return None
    if raw.startswith("-"):
        refused.append(Refusal(where, shown(raw), "a pip option; options in a project's "
                               "files are never passed to pip", "remove it; set pip's index "
                               "in your own pip configuration"))  # fmt: skip
        return None
    if raw.startswith((".", "/", "~")) or "://" in raw.split("@", 1)[0]:
        refused.append(Refusal(where, shown(raw), "a local path or URL, not a release from "
                               "the package index"))  # fmt: skip
        return None
    try:
        req = Requirement(raw)
    except InvalidRequirement as exc:
        refused.append(Refusal(where, shown(raw), f"not a requirement ({shown(str(exc), 80)})",
                               "write it as PEP 508 (`name[extra]>=1.0; marker`)"))  # fmt: skip
        return None
    if req.url:
        refused.append(Refusal(where, shown(raw), _refuse_url(req)))
        return None
    if _archive_name(req.name):
        refused.append(Refusal(where, shown(raw), _AS_ARCHIVE))
        return None
    if not _plain_versions(req):
        refused.append(Refusal(where, shown(raw), _ARBITRARY, "write it with ==, >=, ~= ..."))
        return None
    return req


def render(req: Requirement, *, extras: bool = True) -> str:
    """A parsed requirement as one line pip reads as data (no URL, no option): rendered
    from its parts, so nothing of the original text survives that did not parse."""
    out = req.name  # PEP 508's name grammar: letters, digits, ``._-``
    if extras and req.extras:
        out += "[" + ",".join(sorted(req.extras)) + "]"
    out += str(req.specifier)
    if req.marker is not None:
        out += f"; {req.marker}"
    return out


def requirement_line(text: str, where: str, refused: list[Refusal]) -> str | None:
    req = requirement(text, where, refused)
    return None if req is None else render(req)


def constraint_line(text: str, where: str, refused: list[Refusal]) -> str | None:
    """A constraint: a requirement without extras (pip refuses extras in constraints)."""
    req = requirement(text, where, refused)
    return None if req is None else render(req, extras=False)


def pin(name: object, version: object, where: str, refused: list[Refusal]) -> str | None:
    """``name==version`` from a lock entry, both checked (None: refused)."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    if not isinstance(name, str) or not NAME.match(name) or _archive_name(name):
        refused.append(Refusal(where, shown(str(name)), "not a package name",
                               "regenerate the lock file with its tool"))  # fmt: skip
        return None
    if not isinstance(version, str):
        return None
    try:
        parsed = Version(version)
    except InvalidVersion:
        refused.append(Refusal(where, shown(f"{name} {version}"), "not a version",
                               "regenerate the lock file with its tool"))  # fmt: skip
        return None
    return f"{canonicalize_name(name)}=={parsed}"


def check_line(line: str) -> str:
    """Defence in depth at the pip boundary: ``line`` must be what :func:`render` makes,
    and nothing in it that pip's file format would read as more than data."""
    from packaging.requirements import Requirement

    req = Requirement(line)  # raises InvalidRequirement
    data = line.split(";", 1)[0]  # what pip may read as a path: all before the marker
    if (
        req.url
        or line.lstrip().startswith("-")
        or _PIP_SYNTAX.search(line)
        or _archive_name(req.name)
        or not _plain_versions(req)
        or "/" in data
        or ".." in data
    ):
        raise ValueError(f"refusing to pass {shown(line)!r} to pip")
    return line


def sha256_of(value: object) -> str | None:
    """``sha256:<hex>`` (or bare hex) as lower-case hex; None for other algorithms."""
    if not isinstance(value, str):
        return None
    algo, _, digest = value.strip().partition(":")
    if not digest:
        algo, digest = "sha256", algo
    digest = digest.lower()
    return digest if algo.lower() == "sha256" and SHA256.match(digest) else None
