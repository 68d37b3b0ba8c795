"""The project's extension rules: ``.fluffy/rules/*.py``, one file per rule.

Each file defines ``evaluate(request) -> vote`` (see :mod:`fluffy.sandboxes.policy_host`)
and runs in the pre-warmed policy sandbox (:class:`ExtensionHost`), never in the kernel.
The files are protected like ``.fluffy/policy.yaml`` (a built-in rule denies writing
them); they change only through ``policy.update``, which loads the new set in a
sandbox of its own, tries it on the last decisions, and swaps it in once the user
approved.  The kernel loads them when it starts; a set that cannot load denies every
decision the rules would see (fail closed) and says why.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from fluffy.errors import FluffyError, PolicyError, SandboxRunFailed
from fluffy.kernel.confined_files import remove_file, write_atomic
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.policy.engine import ExtensionRule, Request, Verdict
from fluffy.kernel.policy.extensions import ExtensionHost

log = logging.getLogger("fluffy.kernel.policy")

RULES_DIR = Path(".fluffy") / "rules"
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}\.py")
MAX_RULES = 32
MAX_RULE_BYTES = 64 * 1024

#: The new content of rule files by name; None removes the file.
RuleChanges = Mapping[str, str | None]


def rules_dir(project: Path) -> Path:
    return project / RULES_DIR


def read_rules(folder: Path) -> dict[str, str]:
    """The rule files in ``folder`` by name (none: an empty mapping).

    Raises :class:`PolicyError` when the folder holds what cannot be a rule -- a link
    (the folder or a file), a FIFO or device, a name :data:`NAME` refuses, a file over
    :data:`MAX_RULE_BYTES`, more than :data:`MAX_RULES` -- so that a set with a rule
    that silently vanished is never run as if complete (the caller fails closed).
    """
    if folder.is_symlink():
        raise _unreadable(".fluffy/rules is a link", "rules are read from the project's own "
                          "folder only, never through a link")  # fmt: skip
    if not folder.exists():
        return {}
    if not folder.is_dir():
        raise _unreadable(".fluffy/rules is not a folder", "rules are files in that folder")
    found = {}
    for path in sorted(folder.iterdir()):
        if path.suffix != ".py":
            continue  # notes, editor backups, fluffy's own temporary files
        if not NAME.fullmatch(path.name):
            raise _unreadable(f"{path.name} is not a rule file name",
                              "rule names are lower-case letters, digits, - and _")  # fmt: skip
        found[path.name] = _read_rule(path)
        if len(found) > MAX_RULES:
            raise _unreadable(f"more than {MAX_RULES} rules", "a project may have that many")
    return found


def _read_rule(path: Path) -> str:
    try:  # never through a link, never blocked by a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        why = "it is a link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise _unreadable(f"cannot read the rule {path.name}", why) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise _unreadable(f"the rule {path.name} is not a regular file", "a FIFO, device "
                              "or folder cannot be a rule")  # fmt: skip
        data = handle.read(MAX_RULE_BYTES + 1)
    if len(data) > MAX_RULE_BYTES:
        raise _unreadable(f"the rule {path.name} is over {MAX_RULE_BYTES} bytes", "rules are small")
    return data.decode("utf-8", errors="replace")


def _unreadable(what: str, why: str) -> PolicyError:
    return PolicyError(
        f"the project's extension rules cannot be read: {what}",
        why=why,
        fix="Fix .fluffy/rules on the host (the kernel denies what the rules would judge "
        "until then), then restart the kernel.",
    )


def check_changes(current: Mapping[str, str], changes: object) -> dict[str, str]:
    """The rule set after ``changes`` (validated: names, sizes, count, Python syntax)."""
    if not isinstance(changes, dict):
        raise PolicyError(
            "rules must map file names to their new text (or null to remove)",
            fix='Send {"rules": {"no-secrets.py": "def evaluate(request): ..."}}.',
            why="policy.update takes the rules folder's changes as a mapping",
        )
    names = set(current)
    for name, text in changes.items():  # names and sizes first: cheap, before compiling
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise PolicyError(
                f"{name!r} is not a rule file name",
                why="a rule is one file in .fluffy/rules: lower-case letters, digits, - "
                "and _, ending in .py",
                fix="Name it like `no-secrets.py`.",
            )
        if text is None:
            if name not in names:
                raise PolicyError(
                    f"there is no rule {name} to remove",
                    fix="List the rules.",
                    why="removing a rule needs a rule of that name in .fluffy/rules/",
                )
            names.discard(name)
            continue
        if not isinstance(text, str):
            raise PolicyError(
                f"{name}: a rule's text must be a string",
                why="a rule is Python source text",
                fix='Send the rule as a string: {"name.py": "def evaluate(request): ..."}.',
            )
        if len(text.encode()) > MAX_RULE_BYTES:
            raise PolicyError(
                f"{name} is {len(text.encode())} bytes; a rule may have {MAX_RULE_BYTES}",
                fix="Keep a rule small; split it in two.",
                why="each rule's size is capped so the policy sandbox stays fast",
            )
        names.add(name)
    if len(names) > MAX_RULES:
        raise PolicyError(
            f"{len(names)} rules; a project may have {MAX_RULES}",
            why="each rule runs on every request, so their number is capped",
            fix="Remove a rule first, or merge two rules into one.",
        )
    after = {name: body for name, body in current.items() if name in names}
    for name, text in changes.items():
        if text is None:
            continue
        try:
            compile(text, name, "exec")  # syntax only: the code runs in the sandbox
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            raise PolicyError(
                f".fluffy/rules/{name}" + (f":{line}" if line else "") + f": {exc}",
                why="the rule is not valid Python",
                fix="Fix the rule; nothing was changed.",
            ) from None
        except (RecursionError, MemoryError):
            raise PolicyError(
                f".fluffy/rules/{name}: too deeply nested to compile",
                fix="Simplify the rule; nothing was changed.",
                why="Python's compiler ran out of stack or memory on it",
            ) from None
        after[name] = text
    return after


def stage(rules: Mapping[str, str], parent: Path) -> Path:
    """A folder of its own holding ``rules``: the policy sandbox loads them from there
    (at start and at every restart), so it must live as long as that sandbox."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="rules-", dir=parent))
    for name, text in rules.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def write_rules(folder: Path, changes: RuleChanges) -> None:
    """Apply ``changes`` to the project's rules folder, each file atomically and durably
    (the folder is never entered through a link; new files get the folder's owner)."""
    for name, text in changes.items():
        rel = f"{folder.name}/{name}"
        if text is None:
            remove_file(folder.parent, rel)
        else:
            folder.parent.mkdir(parents=True, exist_ok=True)  # .fluffy: a trusted base
            write_atomic(folder.parent, rel, text.encode(), mode=0o644)


class BrokenRules:
    """The extension rule when the project's rules could not load: every decision the
    rules would see is denied, with the reason (fail closed)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.__name__ = "extension-rules"

    def __call__(self, request: Request) -> Iterator[Verdict]:
        raise SandboxRunFailed(
            f"the project's extension rules did not load: {self.reason}",
            why="extension rules fail closed: while they cannot load, every request they would "
            "judge is denied",
            fix="Fix the rule files in .fluffy/rules/ (the kernel's log names the error), then "
            "restart the kernel.",
        )

    def stop(self) -> None:
        return None


Loaded = ExtensionHost | BrokenRules


class ProjectRules:
    """The project's rule files and the policy sandbox that runs them.

    Blocking methods (they start or stop containers): call them off the event loop.
    """

    def __init__(
        self,
        folder: Path,
        manager: Callable[[], ContainerManager] | None,
        scratch: Path,
        reserve: Callable[[], Callable[[], None]] | None = None,
    ) -> None:
        self.folder = folder
        self._manager = manager
        self.scratch = scratch  # where candidate rule sets are staged
        self.host: Loaded | None = None
        #: takes the policy sandbox's scheduler slot (ADR-043); returns its release
        self.reserve = reserve

    def current(self) -> dict[str, str]:
        return read_rules(self.folder)

    def load(self) -> list[ExtensionRule]:
        """The kernel's start: the rules on disk, loaded and warmed (none: no sandbox)."""
        try:
            rules = self.current()
            if not rules:
                return []
            self.host = self._start(rules)
        except FluffyError as exc:
            log.error("the project's extension rules did not load: %s", exc.what)
            self.host = BrokenRules(f"{exc.what} ({exc.why})" if exc.why else exc.what)
        return [self.host]

    def candidate(self, rules: Mapping[str, str]) -> ExtensionHost | None:
        """A sandbox running ``rules`` (None: no rules).  Raises :class:`PolicyError`
        when they do not load: a set that cannot run is never swapped in."""
        if not rules:
            return None
        try:
            return self._start(rules)
        except FluffyError as exc:
            raise PolicyError(
                "the new extension rules did not load in the policy sandbox",
                why=(exc.why or exc.what)[-1500:],
                fix="Fix the rule (it must define evaluate(request)); nothing was changed.",
            ) from None

    def _start(self, rules: Mapping[str, str]) -> ExtensionHost:
        if self._manager is None:
            raise SandboxRunFailed(
                "no container engine to run them in",
                fix="Extension rules run in a policy sandbox: start the kernel with an engine.",
                why="extension rules run only in a policy sandbox, and this kernel has no "
                "container engine",
            )
        folder = stage(rules, self.scratch)
        host = ExtensionHost(self._manager(), folder)
        # counted from before it starts until it stops: never queued (it gates decisions)
        host.release_slot = self.reserve() if self.reserve is not None else None
        try:
            host.start()
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            if host.release_slot is not None:
                host.release_slot()
            raise
        return host

    @staticmethod
    def discard(host: Loaded | None) -> None:
        """Stop a policy sandbox and remove its staged rules."""
        if host is None:
            return
        host.stop()
        if isinstance(host, ExtensionHost):
            shutil.rmtree(host.rules_dir, ignore_errors=True)
            release, host.release_slot = host.release_slot, None
            if release is not None:
                release()

    def install(self, changes: RuleChanges, host: ExtensionHost | None) -> None:
        """Write the approved changes and make ``host`` the running set."""
        if self.folder.is_symlink():  # never write through a link (read_rules refuses too)
            raise _unreadable(".fluffy/rules is a link", "rules are written to the project's "
                              "own folder only")  # fmt: skip
        write_rules(self.folder, changes)
        old, self.host = self.host, host
        self.discard(old)

    def close(self) -> None:
        self.discard(self.host)
        self.host = None
