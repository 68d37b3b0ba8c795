"""A JavaScript project's test-support code among a session's changes (see
:mod:`fluffy.kernel.merge.support`): what the test process loads besides the tests, or what
reaches the run's report.

* the runners' and transpilers' configuration (``vitest.config.*``, ``vite.config.*``,
  ``jest.config.*``, ``babel.config.*``, ``.babelrc``, ``.mocharc.*``, a workspace file)
  and ``package.json`` (its ``jest``/``vitest``/``mocha`` sections, its scripts);
* setup files (``*setup*.{js,ts,...}``, ``*teardown*``) and ``__mocks__/`` (jest loads a
  mock in place of a module);
* any changed code file that names the report (``FLUFFY_JUNIT``, ``junit``,
  ``outputFile``), registers a reporter, or runs code when the process ends
  (``process.on('exit')``, ``beforeExit``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fluffy.kernel.project.nodelayout import CODE_EXTS

_CONFIG = re.compile(
    r"^(?:vitest|vite|jest|babel|playwright|vitest\.workspace|vitest\.projects)"
    r"(?:\.[\w-]+)?\.config\.[cm]?[jt]s$|^\.babelrc(?:\.\w+)?$|^\.mocharc(?:\.\w+)?$"
    r"|^jest\.(?:setup|preset)\.[cm]?[jt]sx?$|^vitest\.workspace\.[cm]?[jt]s$"
)
_SETUP = re.compile(r"(?:^|[._-])(?:setup|teardown)(?:[._-]|$)", re.IGNORECASE)
_REACHES = re.compile(
    r"FLUFFY_JUNIT|junit|outputFile|reporters?\b|process\.(?:on|once|prependListener)\(\s*"
    r"['\"](?:exit|beforeExit)['\"]|registerHooks|--test-reporter"
)
_TEST = re.compile(r"\.(?:test|spec)\.[cm]?[jt]sx?$")
_SUFFIXES = tuple(f".{ext}" for ext in CODE_EXTS)
MAX_READ = 2 * 1024 * 1024


def js_support(path: str, read: Callable[[str], bytes | None]) -> str | None:
    """Why ``path`` is a JavaScript project's test-support code (None: it is not)."""
    name = path.rsplit("/", 1)[-1]
    if _CONFIG.search(name):
        return "it configures the test runner or the transpiler (reporters, setup files)"
    if name == "package.json":
        return "its jest/vitest/mocha sections and scripts configure the test run"
    if not name.endswith(_SUFFIXES):
        return None
    if "__mocks__/" in f"/{path}":
        return "jest loads it in place of the module it mocks"
    is_test = _TEST.search(name) is not None
    if not is_test and _SETUP.search(name.rsplit(".", 1)[0]):
        return "a setup file: the runner loads it around the tests"
    data = read(path)
    if data is None or len(data) > MAX_READ:
        return None
    found = _REACHES.search(data.decode("utf-8", "replace"))
    if found is not None:
        return f"it reaches the test run's report or its end ({found.group(0)[:40]})"
    return None
