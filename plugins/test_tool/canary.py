"""The canary: a test that must fail, added to every test file a pytest run collects.

A run's outcome is written by the test process, and code in that process (a cloned
repository's ``conftest.py``, a plugin it loads, code that patches pytest) can turn
failures into passes.  So the test tool loads this plugin (``-p``) into each pytest
run, with a name the kernel draws anew for every run.  It adds to each collected test
file two tests of that name which always fail, one on an assertion and one on an error,
compiled as that file's code and run first of its tests: in place before the project's
own collection hooks and again after them, hidden from the terminal and from the exit
status.  They run under the same ``conftest.py`` hooks, plugins, marks and patches as
the file's own tests; the kernel reads the JUnit report and refuses the run as evidence
unless every file with a passing test also reports its canaries failed
(:mod:`fluffy.kernel.tools.testing.canary`).

The plugin runs in the project's interpreter, whatever pytest version it has, so it is
written as source for that interpreter (stdlib and pytest only) and kept small.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

#: A run's token: 32 decimal digits (no letters a project's skip-by-substring could match).
TOKEN = re.compile(r"[0-9]{32}")
MESSAGE = "fluffy's canary: this test must fail"
#: The suffixes of a file's two canaries: an assertion that fails, an error raised.
KINDS = ("a", "e")

SOURCE = """\
\"\"\"fluffy's canaries for one test run (see fluffy/plugins/test_tool/canary.py).\"\"\"
import re

import pytest

try:
    from pytest import File
except ImportError:  # pytest < 7
    from _pytest.nodes import File

NAME = "test_{token}"
#: the two ways a test fails: an assertion, and an error of the code under test
MESSAGE = {message!r}
KINDS = {{"a": "assert False, MESSAGE", "e": "raise LookupError(MESSAGE)"}}
_MADE = {{}}


def _template(kind):
    scope = {{"MESSAGE": MESSAGE}}
    exec("def {{}}():\\n    {{}}\\n".format(NAME + "_" + kind, KINDS[kind]), scope)
    return scope[NAME + "_" + kind]


_TEMPLATES = {{kind: _template(kind) for kind in KINDS}}


def _function(node, kind):
    # the canary's function, as the test file's own code (its traceback names the file)
    template = _TEMPLATES[kind]
    path = str(getattr(node, "path", None) or node.fspath)
    code = template.__code__.replace(co_filename=path)
    return type(template)(code, template.__globals__, template.__name__)


class FluffyCanary(pytest.Function):
    def reportinfo(self):
        return getattr(self.parent, "path", None) or self.parent.fspath, 0, self.name

    def repr_failure(self, excinfo, style=None):
        # the failure as one line: a traceback formatted for every file costs ~1.5 ms
        return "{{}}: {{}}".format(excinfo.typename, excinfo.value)


def _file_of(item):
    node = item
    while node is not None and not isinstance(node, File):
        node = node.parent
    return node


def _canaries(node, config):
    made = _MADE.get(node.nodeid)
    if made is None:
        made = _MADE[node.nodeid] = [
            FluffyCanary.from_parent(node, name=NAME + "_" + kind, callobj=_function(node, kind))
            for kind in KINDS
        ]
        for canary in made:
            config.hook.pytest_itemcollected(item=canary)
    return made


def _is_canary(nodeid):
    return nodeid.rpartition("::")[2].startswith(NAME + "_")


def _placed(items, config):
    \"\"\"``items`` without canaries, each file's canaries first of its tests.\"\"\"
    placed, seen = [], set()
    for item in items:
        if isinstance(item, FluffyCanary):
            continue
        node = _file_of(item)
        if node is not None and node.nodeid not in seen:
            seen.add(node.nodeid)
            placed.extend(_canaries(node, config))
        placed.append(item)
    return placed


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    # in place before the project's own hooks (they may wrap or mark every item) and
    # in place again after them (-k, -m, --lf and reordering plugins leave them out)
    items[:] = _placed(items, config)
    yield
    items[:] = _placed(items, config)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", None)
    if isinstance(stats, dict) and "deselected" in stats:
        stats["deselected"] = [i for i in stats["deselected"] if not isinstance(i, FluffyCanary)]
        if not stats["deselected"]:
            del stats["deselected"]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # --stepwise stops at the first failure: the first canary
    for option in ("stepwise", "stepwise_skip", "stepwise_reset"):
        if getattr(config.option, option, False):
            setattr(config.option, option, False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    # the progress shown ([ 40%]) counts the files' own tests only
    session.testscollected -= sum(1 for item in session.items if isinstance(item, FluffyCanary))


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report, config):
    if _is_canary(report.nodeid):
        return "", "", ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_logreport(report):
    _readable_names(report)
    yield  # after every other plugin's, the session's count of failures included
    session = _SESSION[0]
    if _is_canary(report.nodeid) and report.failed and session is not None:
        # not a failure of the run: its exit status says what the files' own tests did
        # (the test tool runs pytest with --maxfail=0: a canary never stops the run)
        session.testsfailed = max(0, session.testsfailed - 1)


_SESSION = [None]


def pytest_sessionstart(session):
    _SESSION[0] = session
    cache = getattr(session.config, "cache", None)
    if cache is not None and hasattr(cache, "set"):  # its JSON is UTF-8 too (idempotent:
        # what it read back from a file is written again)
        store = cache.set
        cache.set = lambda key, value: store(key, _readable_value(value))
"""


#: Names in reports (source for the project's interpreter, appended to :data:`SOURCE`).
#: A file name that is not UTF-8 (surrogate escapes) or holds a control character
#: would stop pytest's JUnit writer (the report ended at its XML header): a test file's
#: path is quoted exactly as :func:`fluffy.pathnames.shown` quotes it (one-to-one, so two
#: files never share an id), every other text has U+FFFD for its surrogates.
NAMES = r"""

_SURROGATE = re.compile("[\ud800-\udfff]")
_NEEDS_QUOTES = re.compile("[\ud800-\udfff\x00-\x1f\x7f\ufffe\uffff]")


def _readable(value):
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    return value


def _quoted(value):
    if not isinstance(value, str) or not (value[:1] == '"' or _NEEDS_QUOTES.search(value)):
        return value
    out = []
    for char in value:
        point = ord(char)
        if 0xDC80 <= point <= 0xDCFF:
            out.append("\\%03o" % (point - 0xDC00))
        elif 0xD800 <= point <= 0xDFFF or point in (0xFFFE, 0xFFFF):
            out.append("".join("\\%03o" % b for b in char.encode("utf-8", "surrogatepass")))
        elif point < 0x20 or point == 0x7F:
            out.append("\\%03o" % point)
        elif char in '"\\':
            out.append("\\" + char)
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _readable_names(report):
    # before any plugin sees the report (the JUnit writer puts these in as they are);
    # once: a report a worker (xdist) sent is seen again, and quoting is not idempotent
    if getattr(report, "fluffy_named", False):
        return
    report.fluffy_named = True
    path, sep, rest = report.nodeid.partition("::")  # the file's path, quoted whole
    report.nodeid = _quoted(path) + sep + _readable(rest)
    location = vars(report).get("location")  # (a collect report's is its nodeid's)
    if isinstance(location, tuple):
        report.location = (_quoted(location[0]),) + tuple(map(_readable, location[1:]))


@pytest.hookimpl(hookwrapper=True)
def pytest_collectreport(report):
    _readable_names(report)
    yield


def _readable_value(value):
    # pytest's cache file (JSON, UTF-8): idempotent, what it read back is written again
    if isinstance(value, list):
        return [_readable_value(item) for item in value]
    if isinstance(value, dict):
        return dict((_readable(k), _readable_value(v)) for k, v in value.items())
    return _readable(value)


try:
    from _pytest import junitxml as _junitxml
except ImportError:  # pragma: no cover - every pytest fluffy runs has it
    _junitxml = None
if _junitxml is not None and hasattr(_junitxml, "bin_xml_escape"):
    _escape = _junitxml.bin_xml_escape
    # every text of the report passes through it (names, files, messages, output)
    _junitxml.bin_xml_escape = lambda arg: _escape(_readable(arg))
"""


def canary_token(settings: Mapping[str, object]) -> str | None:
    """The run's token from the kernel's settings (None: a run without a canary)."""
    token = settings.get("canary")
    return token if isinstance(token, str) and TOKEN.fullmatch(token) else None


def is_canary_name(name: str, token: str) -> bool:
    """Whether a test's name (the last part of its id) is one of the run's canaries."""
    return name.startswith(f"test_{token}_")


def module_name(token: str) -> str:
    """The plugin's module name for a run's token (``-p <name>``)."""
    return f"fluffy_canary_{token}"


def write_plugin(folder: Path, token: str) -> str:
    """Write the run's canary plugin into ``folder``; return its module name."""
    if not TOKEN.fullmatch(token):
        raise ValueError(f"a canary token is 32 decimal digits, not {token!r}")
    name = module_name(token)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(SOURCE.format(token=token, message=MESSAGE) + NAMES)
    return name
