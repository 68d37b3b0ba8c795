"""The canary: a test that must fail, added to every test file a pytest run collects.

A run's outcome is written by the test process, and code in that process (a cloned
repository's ``conftest.py``, a plugin it loads, code that patches pytest) can turn
failures into passes.  So the test tool loads this plugin (``-p``) into each pytest
run, with a name the kernel draws anew for every run.  After every other collection
hook, it adds to each collected test file one test of that name which always fails:
run first of the file's tests, hidden from the terminal and from the exit status.  Each
canary runs under the same ``conftest.py`` hooks, plugins and patches as the file's own
tests; the kernel reads the JUnit report and refuses the run as evidence unless every
file with a passing test also reports its canary failed
(:mod:`fluffy.kernel.tools.testing.canary`).

The plugin runs in the project's interpreter, whatever pytest version it has, so it is
written as source for that interpreter (stdlib and pytest only) and kept small.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

#: What a canary's name looks like: ``test_`` and the run's 32 hex digits.
TOKEN = re.compile(r"[0-9a-f]{32}")
MESSAGE = "fluffy's canary: this test must fail"

SOURCE = '''\
"""fluffy's canary for one test run (see fluffy/plugins/test_tool/canary.py)."""
import pytest

try:
    from pytest import File
except ImportError:  # pytest < 7
    from _pytest.nodes import File

NAME = "test_{token}"


def _fail():
    pytest.fail("{message}", pytrace=False)


class FluffyCanary(pytest.Function):
    def iter_markers_with_node(self, name=None):
        # the file's and class's marks (skip, xfail, usefixtures) are not the canary's
        return iter(())

    def reportinfo(self):
        return getattr(self.parent, "path", None) or self.parent.fspath, None, NAME


def _file_of(item):
    node = item
    while node is not None and not isinstance(node, File):
        node = node.parent
    return node


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    ordered, seen = [], set()
    for item in items:  # each file's canary runs first of its tests: -x stops after it
        node = _file_of(item)
        if node is not None and node.nodeid not in seen:
            seen.add(node.nodeid)
            ordered.append(FluffyCanary.from_parent(node, name=NAME, callobj=_fail))
        ordered.append(item)
    items[:] = ordered


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    # the progress shown ([ 40%]) counts the file's own tests only
    session.testscollected -= sum(1 for item in session.items if item.name == NAME)


def _is_canary(report):
    return report.nodeid.rpartition("::")[2] == NAME


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report, config):
    if _is_canary(report):
        return "", "", ""


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    session = _SESSION[0]
    if _is_canary(report) and report.failed and session is not None:
        # not a failure of the run: its exit status says what the file's own tests did
        # (the test tool runs pytest with --maxfail=0: a canary never stops the run)
        session.testsfailed = max(0, session.testsfailed - 1)


_SESSION = [None]


def pytest_sessionstart(session):
    _SESSION[0] = session
'''


def canary_token(settings: Mapping[str, object]) -> str | None:
    """The run's token from the kernel's settings (None: a run without a canary)."""
    token = settings.get("canary")
    return token if isinstance(token, str) and TOKEN.fullmatch(token) else None


def module_name(token: str) -> str:
    """The plugin's module name for a run's token (``-p <name>``)."""
    return f"fluffy_canary_{token}"


def write_plugin(folder: Path, token: str) -> str:
    """Write the run's canary plugin into ``folder``; return its module name."""
    if not TOKEN.fullmatch(token):
        raise ValueError(f"a canary token is 32 hex digits, not {token!r}")
    name = module_name(token)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(SOURCE.format(token=token, message=MESSAGE))
    return name
