"""Test-run evidence: the only facts the TDD guards may believe.

The guards (``test_writing -> code_writing`` needs a red run, ``validating -> reviewing``
a green one) never read what the AI says about its tests.  They read a :class:`TestRun`
that the kernel executed itself: the command, the exit code, every test's outcome from
pytest's JUnit XML (read by :mod:`fluffy.junit`), and a hash of the
test tree and the source tree taken *before* the run.  The rules:

* **Red** means at least one test whose file was added or changed since ``test_writing``
  began fails *on an assertion*, or fails (or fails to import) because the code it tests
  does not exist yet: an ImportError / ModuleNotFoundError / AttributeError / NameError
  naming a module or symbol the project's tree really lacks (checked against the tree by
  :mod:`fluffy.kernel.workflow.missing`, never believed from the message alone).  A syntax
  error, a fixture setup/teardown error, a missing third-party module or a test body dying
  of ``ZeroDivisionError`` is not red: it proves the test is broken, not that the
  behaviour is missing.
* **Green** means exit code 0, at least one test passed, none failed or errored.
* **Stale** means the files hashed for the run have changed since; stale evidence proves
  nothing about the current tree.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec

from fluffy.errors import EvidenceError
from fluffy.junit import OUTCOMES, TestCase, parse_junit
from fluffy.kernel.globs import Patterns
from fluffy.kernel.project.viewfiles import ignored, ignored_dir, ignored_file
from fluffy.pathnames import shown

STREAM_ABOVE_BYTES = 8 * 1024 * 1024
DEFAULT_TEST_GLOBS = ("tests/**", "test/**", "**/test_*.py", "**/*_test.py", "**/conftest.py")
_EXC_NAME = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Group|Failed))\b")


def _hash_file(path: Path) -> str:
    """sha256 of a regular file's content, opened without following symlinks."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return hashlib.sha256(b"unreadable").hexdigest()
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            return hashlib.sha256(b"not-a-file").hexdigest()
        if info.st_size <= STREAM_ABOVE_BYTES:
            digest.update(fh.read())
        else:
            for chunk in iter(lambda: fh.read(1024 * 1024), b""):
                digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class TreeSnapshot:
    """Relative posix path (:func:`~fluffy.pathnames.shown`) -> sha256 hex of its
    content (a symlink: of its target)."""

    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(sorted(self.files.items()))))

    @property
    def digest(self) -> str:
        """sha256 over the sorted (path, hash) pairs, each part length-prefixed."""
        digest = hashlib.sha256(b"fluffy-tree-v1\0")
        for path, value in sorted(self.files.items()):
            for part in (path.encode("utf-8", "surrogateescape"), value.encode()):
                digest.update(len(part).to_bytes(8, "big") + part)
        return digest.hexdigest()

    def changed_since(self, older: TreeSnapshot) -> set[str]:
        """Paths added, modified or removed between ``older`` and this snapshot."""
        keys = set(self.files) | set(older.files)
        return {k for k in keys if self.files.get(k) != older.files.get(k)}


#: Staged changes laid over the project: rel path -> sha256 hex, or None if deleted.
Overlay = Mapping[str, str | None]


def snapshot_trees(
    root: Path,
    test_globs: Sequence[str] = DEFAULT_TEST_GLOBS,
    overlay: Overlay | None = None,
) -> tuple[TreeSnapshot, TreeSnapshot]:
    """Hash the project as ``(tests, sources)``.

    Symlinks are never followed: one is recorded as sha256 of ``"symlink:" + target``.
    Paths :mod:`~fluffy.kernel.project.viewfiles` leaves out (tool state, caches) are
    skipped, as is anything that is not a regular file or symlink.  A file matching
    ``test_globs`` is a test; every other file is a source.  ``overlay`` (the session's
    staged, not yet merged changes) replaces or removes the hashes of the paths it names:
    the snapshot is of what the tools see.  Its keys are :func:`~fluffy.pathnames.shown`
    names: a file name that is not UTF-8 is kept, quoted as git quotes it.
    """
    tests_spec = Patterns(test_globs)
    tests: dict[str, str] = {}
    sources: dict[str, str] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as found:
                entries = list(found)
        except OSError as exc:
            raise EvidenceError(f"cannot list {folder}", why=str(exc)) from None
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(root).as_posix()
            if entry.is_symlink():
                try:
                    target = os.fsencode(path.readlink())
                except OSError:  # vanished while walking
                    continue
                if ignored_dir(entry.name):  # a symlinked .venv/ etc.
                    continue
                value = hashlib.sha256(b"symlink:" + target).hexdigest()
            elif entry.is_dir(follow_symlinks=False):
                if not ignored_dir(entry.name):
                    stack.append(path)
                continue
            elif entry.is_file(follow_symlinks=False):
                value = _hash_file(path)
            else:
                continue
            if not ignored_file(entry.name):
                (tests if tests_spec.match(rel) else sources)[shown(rel)] = value
    for rel, staged in (overlay or {}).items():
        key = shown(rel)
        tests.pop(key, None)
        sources.pop(key, None)
        if staged is not None and not ignored(rel):
            (tests if tests_spec.match(rel) else sources)[key] = staged
    return TreeSnapshot(tests), TreeSnapshot(sources)


class TestRun(msgspec.Struct, frozen=True):
    """One test run the kernel executed and recorded (JSON round-trips for SQLite)."""

    __test__ = False

    command: tuple[str, ...]
    exit_code: int
    cases: tuple[TestCase, ...]
    tests: TreeSnapshot
    sources: TreeSnapshot
    started_at: float
    duration_s: float
    #: failing tests that fail on the base tree too (the project without the session's
    #: changes): reported, not blocking (policy tdd.require_all_green: true makes them so)
    preexisting: tuple[str, ...] = ()
    #: what ran the tests ("pytest", "vitest", "the project's test command"); "" unknown
    runner: str = ""
    #: the end of the runner's output when it failed without reporting a test (a crash
    #: before any test ran): what the verdict quotes, as pytest's collection error is
    output: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "preexisting": list(self.preexisting),
            **({"runner": self.runner} if self.runner else {}),
            **({"output": self.output} if self.output else {}),
            "command": list(self.command),
            "exit_code": self.exit_code,
            "cases": [msgspec.structs.asdict(c) for c in self.cases],
            "tests": dict(self.tests.files),
            "sources": dict(self.sources.files),
            "started_at": self.started_at,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TestRun:
        """Rebuild a run from :meth:`to_dict`; anything malformed is an EvidenceError."""
        try:
            if data["version"] != 1:
                raise ValueError(f"unknown version {data['version']!r}")
            cases = tuple(_case_from_dict(raw) for raw in data["cases"])
            trees = [{str(k): str(v) for k, v in data[key].items()} for key in ("tests", "sources")]
            return cls(
                command=tuple(str(part) for part in data["command"]),
                exit_code=int(data["exit_code"]),
                cases=cases,
                tests=TreeSnapshot(trees[0]),
                sources=TreeSnapshot(trees[1]),
                started_at=float(data["started_at"]),
                duration_s=float(data["duration_s"]),
                preexisting=tuple(str(i) for i in data.get("preexisting") or ()),
                runner=str(data.get("runner") or ""),  # runs recorded before: unknown
                output=str(data.get("output") or ""),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EvidenceError("a stored test run is malformed", why=repr(exc)) from None

    @property
    def counts(self) -> dict[str, int]:
        counts = {"found": len(self.cases)} | dict.fromkeys(OUTCOMES, 0)
        for case in self.cases:
            counts[case.outcome] += 1
        return counts

    def _red_cases(
        self, baseline_tests: TreeSnapshot, proves: MissingProof | None = None
    ) -> list[TestCase]:
        changed = self.tests.changed_since(baseline_tests)
        red: list[TestCase] = []
        for case in self.cases:
            if case.file not in changed:
                continue
            if case.assertion or (
                proves is not None and _names_missing_code(case) and proves(case.message)
            ):
                red.append(case)
        return red

    def is_red(self, baseline_tests: TreeSnapshot, proves: MissingProof | None = None) -> bool:
        """A test file (per ``test_globs``) added or changed since ``baseline_tests`` has a
        test failing on an assertion, or (with ``proves``, the tree check) failing because
        the code it tests is missing."""
        return bool(self._red_cases(baseline_tests, proves))

    def red_reason(self, baseline_tests: TreeSnapshot, proves: MissingProof | None = None) -> str:
        """Whether this run is red, why, and if not what would be: one sentence for the
        user and the model alike."""
        red = self._red_cases(baseline_tests, proves)
        if red:
            first = red[0]
            how = "fail on an assertion" if first.assertion else "fail on missing code"
            return (
                f"red: {len(red)} new or changed test(s) {how}, e.g. {first.id} ({first.message})"
            )
        if not self.cases:
            detail = f"{self.runner or 'the test run'} ran no tests (exit code {self.exit_code})"
            said = _last_lines(self.output)
            detail += f"; its output ends: {said}" if said else ""
        else:
            detail = _not_red_detail(self.cases)
        return f"not red: {detail}; {WHAT_IS_RED}"

    def is_green(self) -> bool:
        """At least one test passed and none failed or errored but those that fail on the
        base tree too (:attr:`preexisting`); exit code 0, or 1 (pytest's "tests failed")
        when only those failed."""
        known = set(self.preexisting)
        broken = [c for c in self.cases if c.outcome in ("failed", "error") and c.id not in known]
        failed_known = any(c.id in known and c.outcome in ("failed", "error") for c in self.cases)
        ok_exit = self.exit_code == 0 or (self.exit_code == 1 and failed_known)
        return ok_exit and self.counts["passed"] > 0 and not broken

    def is_stale(
        self,
        root: Path,
        test_globs: Sequence[str] = DEFAULT_TEST_GLOBS,
        overlay: Overlay | None = None,
    ) -> bool:
        """The tree (with ``overlay``) no longer matches what was hashed before this run."""
        tests, sources = snapshot_trees(root, test_globs, overlay)
        return (tests.digest, sources.digest) != (self.tests.digest, self.sources.digest)


#: The tree check of :mod:`fluffy.kernel.workflow.missing` (message -> code is missing).
MissingProof = Callable[[str], bool]
WHAT_IS_RED = (
    "red needs a new or changed test that fails on an assertion or on code the project "
    "does not have yet (an import, attribute or name)"
)


def _names_missing_code(case: TestCase) -> bool:
    """A test body's failure or a module's import (collection) error, raised by the test's
    own code: the places where a missing module or symbol shows.  Fixture errors do not
    count, nor does a failure raised inside the project's code (a broken import there is
    the project's problem, not the missing code of a new test)."""
    where = case.outcome == "failed" or (case.outcome == "error" and "::" not in case.id)
    return where and case.raised_in_test()


#: How much of a crashed runner's output a verdict quotes.
OUTPUT_CHARS = 600


def _last_lines(output: str) -> str:
    """The last lines of ``output`` (non-empty ones, joined by `` | ``), at most
    :data:`OUTPUT_CHARS` characters."""
    said = ""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if not line:
            continue
        joined = f"{line} | {said}" if said else line
        if len(joined) > OUTPUT_CHARS:
            return said or line[-OUTPUT_CHARS:]
        said = joined
    return said


def _case_from_dict(raw: Mapping[str, Any]) -> TestCase:
    texts = [raw[key] for key in ("id", "file", "message")]
    origin = raw.get("origin", "")  # runs recorded before origins were kept have none
    if not all(isinstance(t, str) for t in (*texts, origin)) or raw["outcome"] not in OUTCOMES:
        raise ValueError(f"malformed case {raw!r:.200}")
    return TestCase(texts[0], texts[1], raw["outcome"], bool(raw["assertion"]), texts[2], origin)


def _exc_name(message: str) -> str:
    """The exception's class name in a pytest message ("ZeroDivisionError", "Failed")."""
    found = _EXC_NAME.search(message) or re.match(r"([A-Za-z_][\w.]*):", message)
    return found.group(1) if found else message


def _detail(case: TestCase) -> str:
    """The message after the exception's name, short."""
    text = case.message.removeprefix("collection failure: ")
    name = _exc_name(text)
    rest = text.split(name, 1)[1].lstrip(": ") if name and name in text else text
    return (rest or text)[:140]


def _not_red_detail(cases: Sequence[TestCase]) -> str:
    """The most basic problem first: collection, then fixtures, then other failures."""
    for case in cases:
        if case.outcome == "error" and "::" not in case.id:
            return f"{case.id} failed to import ({_exc_name(case.message)}: {_detail(case)})"
    for case in cases:
        if case.outcome == "error":
            phase = "teardown" if "teardown" in case.message else "setup"
            return f"{case.id} errored in fixture {phase} ({_exc_name(case.message)})"
    for case in cases:
        if case.outcome == "failed" and not case.assertion:
            return f"{case.id} failed with {_exc_name(case.message)} ({_detail(case)})"
    for case in cases:
        if case.assertion:
            return (
                f"{case.id} fails on an assertion, but its file is unchanged "
                "since test_writing began"
            )
    return f"all {len(cases)} test(s) passed or were skipped"


def run_pytest(
    root: Path,
    *,
    extra_args: Sequence[str] = (),
    timeout_s: float = 300,
    env: Mapping[str, str] | None = None,
    test_globs: Sequence[str] = DEFAULT_TEST_GLOBS,
) -> TestRun:
    """Run pytest in ``root`` on the host and record the evidence.

    The trees are hashed *before* the run (split by ``test_globs``; pass the same globs to
    :meth:`TestRun.is_stale`), so edits made during the run make it stale.
    The report goes to a temporary directory outside the project.  ``env=None`` inherits
    the kernel's environment minus ``PYTEST_ADDOPTS``/``PYTEST_PLUGINS``.  Exit code 5
    (no tests collected) gives no cases; a timeout kills the process group and raises.
    """
    root = root.resolve()
    tests, sources = snapshot_trees(root, test_globs)
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    with tempfile.TemporaryDirectory(prefix="fluffy-junit-") as tmp:
        report, log = Path(tmp) / "junit.xml", Path(tmp) / "output.log"
        # fmt: off
        command = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"--rootdir={root}", "-o", "junit_family=xunit1", f"--junitxml={report}",
                   *extra_args)
        started, clock = time.time(), time.monotonic()
        with log.open("wb") as out, subprocess.Popen(
            command, cwd=root, env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        ) as proc:
            # fmt: on
            try:
                exit_code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise EvidenceError(
                    f"the test run timed out after {timeout_s:g}s",
                    fix="Make the tests faster or raise the test timeout.",
                ) from None
        duration = time.monotonic() - clock
        if exit_code == 5:
            cases: list[TestCase] = []
        elif report.is_file():
            cases = parse_junit(report.read_bytes(), name="pytest's junit report")
        else:
            tail = log.read_bytes()[-2000:].decode("utf-8", "replace").strip()
            raise EvidenceError(
                f"pytest exited with code {exit_code} and wrote no report",
                why=tail or "pytest printed nothing",
            )
    return TestRun(
        tuple(command), exit_code, tuple(cases), tests, sources, started, duration,
        runner="pytest",
    )  # fmt: skip
