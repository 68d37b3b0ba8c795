"""The person's secret files stay out of test runs unless the person lets them in (ADR-097).

The model never reads a ``.env`` or a key (the kernel's reads refuse them), but it
writes tests, and a test runs with the project's files: one that prints ``.env`` would
show it to the model in the run's output, one that asserts on it character by character
would tell it in the outcomes.  So the test view leaves out every file that looks like
a secret (:func:`~fluffy.kernel.globs.is_secret_file`) unless git's index lists it with
the content it has: the person's own (never committed, or a committed placeholder they
filled in, or one git is told not to look at) stay out.  What the repository holds stays
(a test certificate, a ``.env.test``: anyone with the repository has them), as does what
the session itself wrote.  When git's index cannot be read, every such file is left out.

The person lets tests read one with ``fluffy config tests secrets --allow PATH``, which
the host records in :data:`ALLOWED_FILE` in the kernel's state folder: a repository
cannot ship that answer, and the model cannot write there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from fluffy.kernel.globs import is_secret_file
from fluffy.kernel.project.gitindex import Tracked, tracked
from fluffy.kernel.project.records import read_strings, write_strings
from fluffy.kernel.project.viewfiles import walk_project

#: In the kernel's state folder (written on the host): the project paths the person lets
#: test runs read although they hold secrets.
ALLOWED_FILE = "test-secrets.json"
#: Names remembered at most (beyond, the memory starts again).
_REMEMBERED = 500_000


def allowed_secrets(state: Path) -> frozenset[str]:
    """The paths the person allowed (none when the record is missing or unreadable)."""
    return read_strings(state, ALLOWED_FILE, "allow")


def set_allowed(state: Path, paths: Iterable[str]) -> None:
    """Record the person's allowances (atomically; the whole list)."""
    write_strings(state, ALLOWED_FILE, "allow", paths)


def _index_signature(project: Path) -> tuple[int, ...] | None:
    try:
        info = (project / ".git" / "index").lstat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_ino)


class SecretFiles:
    """Which of a project's files a test sandbox must not see, asked anew for each sync
    (the person may allow a file, or commit one, while the kernel runs)."""

    def __init__(self, project: Path, state: Path) -> None:
        self.project = project
        self.state = state
        self._signature: tuple[int, ...] | None = None
        self._tracked: Tracked | None = None
        self._read = False
        #: rel -> does its name look like a secret's (the glob match costs ~4 µs a file,
        #: 40 ms a sync of 10,000 files; a name's answer never changes)
        self._looks: dict[str, bool] = {}

    def _known(self) -> Tracked | None:
        signature = _index_signature(self.project)
        if not self._read or signature != self._signature:
            self._tracked, self._signature, self._read = tracked(self.project), signature, True
        return self._tracked

    def hidden(self, let_in: frozenset[str] | None = None) -> Callable[[str], bool]:
        """``rel`` -> whether the view leaves that project file out; ``let_in``: the
        person's allowances, if already read.  The index is checked once per predicate,
        and only once a secret-looking file is met."""
        if let_in is None:
            let_in = allowed_secrets(self.state)
        looks = self._looks
        if len(looks) > _REMEMBERED:
            looks.clear()
        known: list[Tracked | None] = []

        def hide(rel: str) -> bool:
            secret = looks.get(rel)
            if secret is None:
                secret = looks[rel] = is_secret_file(rel)
            if not secret or rel in let_in:
                return False
            if not known:
                known.append(self._known())
            index = known[0]  # the repository's own: listed, with this content
            return index is None or not index.holds(self.project, rel)

        return hide


def kept_out(project: Path, state: Path) -> tuple[list[str], list[str]]:
    """(the project's files test runs do not see, the secret-looking ones the person let
    them see): what ``fluffy config tests secrets`` shows."""
    let_in = allowed_secrets(state)
    hide = SecretFiles(project, state).hidden(let_in)
    out: list[str] = []
    seen: list[str] = []
    for entry in walk_project(project):
        if hide(entry.rel):
            out.append(entry.rel)
        elif entry.rel in let_in:
            seen.append(entry.rel)
    return out, seen
