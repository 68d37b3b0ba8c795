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

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from fluffy.errors import FluffyError, PolicyError, SandboxRunFailed
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
    """The rule files in ``folder`` by name (none: an empty mapping)."""
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.iterdir()):
        if path.suffix == ".py" and path.is_file() and not path.is_symlink():
            found[path.name] = path.read_text(encoding="utf-8", errors="replace")
    return found


def check_changes(current: Mapping[str, str], changes: object) -> dict[str, str]:
    """The rule set after ``changes`` (validated: names, sizes, count, Python syntax)."""
    if not isinstance(changes, dict):
        raise PolicyError(
            "rules must map file names to their new text (or null to remove)",
            fix='Send {"rules": {"no-secrets.py": "def evaluate(request): ..."}}.',
        )
    after = dict(current)
    for name, text in changes.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise PolicyError(
                f"{name!r} is not a rule file name",
                why="a rule is one file in .fluffy/rules: lower-case letters, digits, - "
                "and _, ending in .py",
                fix="Name it like `no-secrets.py`.",
            )
        if text is None:
            if name not in after:
                raise PolicyError(f"there is no rule {name} to remove", fix="List the rules.")
            del after[name]
            continue
        if not isinstance(text, str):
            raise PolicyError(f"{name}: a rule's text must be a string")
        if len(text.encode()) > MAX_RULE_BYTES:
            raise PolicyError(
                f"{name} is {len(text.encode())} bytes; a rule may have {MAX_RULE_BYTES}",
                fix="Keep a rule small; split it in two.",
            )
        try:
            compile(text, name, "exec")  # syntax only: the code runs in the sandbox
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            raise PolicyError(
                f".fluffy/rules/{name}" + (f":{line}" if line else "") + f": {exc}",
                why="the rule is not valid Python",
                fix="Fix the rule; nothing was changed.",
            ) from None
        after[name] = text
    if len(after) > MAX_RULES:
        raise PolicyError(f"{len(after)} rules; a project may have {MAX_RULES}")
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
    """Apply ``changes`` to the project's rules folder, each file atomically."""
    for name, text in changes.items():
        target = folder / name
        if text is None:
            target.unlink(missing_ok=True)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            Path(tmp).chmod(0o644)
            Path(tmp).replace(target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class BrokenRules:
    """The extension rule when the project's rules could not load: every decision the
    rules would see is denied, with the reason (fail closed)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.__name__ = "extension-rules"

    def __call__(self, request: Request) -> Iterator[Verdict]:
        raise SandboxRunFailed(f"the project's extension rules did not load: {self.reason}")

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
        rules = self.current()
        if not rules:
            return []
        try:
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
        write_rules(self.folder, changes)
        old, self.host = self.host, host
        self.discard(old)

    def close(self) -> None:
        self.discard(self.host)
        self.host = None
