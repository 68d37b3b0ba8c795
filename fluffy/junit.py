"""pytest's JUnit XML report, read into one :class:`TestCase` per test.

:func:`parse_junit` is fluffy's one reader of a report: the kernel's evidence
(:mod:`fluffy.kernel.workflow.evidence` judges the cases it returns) and the test tool's
counts in its sandbox (``fluffy.plugins.test_tool``, which reads the same report first,
for display).  It refuses DOCTYPEs, reports over 32 MiB and malformed XML with
:class:`EvidenceError`.  Standard library and the error tree only: it ships in the L2
images too (images/spec.py, SANDBOX_PARTS).
"""

from __future__ import annotations

import re
from typing import Any, Literal, cast, get_args
from xml.parsers import expat

import msgspec

from fluffy.errors import EvidenceError
from fluffy.pathnames import matchable, unshown

Outcome = Literal["passed", "failed", "error", "skipped"]
#: Whose report: pytest's, another runner's (every ``<failure>`` an assertion), or a
#: JavaScript runner's (vitest, jest, node's, mocha's: the failure's ``type`` says).
Dialect = Literal["pytest", "junit", "javascript"]
#: The JavaScript runners whose JUnit report fluffy has a route to (the runner a project's
#: package.json names; None: none named, node's own), as people call them.  The kernel's
#: test command for each: :func:`fluffy.kernel.project.nodeenv.node_test_command`.
JS_RUNNERS: dict[str | None, str] = {
    "vitest": "vitest",
    "jest": "jest",
    "node": "node --test",
    None: "node --test",
}
OUTCOMES: tuple[str, ...] = get_args(Outcome)
MAX_REPORT_BYTES = 32 * 1024 * 1024
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
# pytest's crash message for an assertion: "assert x == y" (rewritten) or "AssertionError[: ..]".
_ASSERTION = re.compile(r"(assert\b|AssertionError\b)")
#: A JavaScript failure that is an assertion: its error class, or (a plain ``Error`` or
#: none named) how its message starts -- never a TypeError's "expect(...).x is not ...".
_JS_ASSERTION_TYPES = frozenset({"AssertionError", "JestAssertionError", "ERR_ASSERTION"})
_JS_ASSERTION = re.compile(r"(AssertionError\b|expect(ed)?\b|expect\()")
#: A JavaScript stack frame's file (``at f (file:///workspace/a.test.ts:3:9)``).
_JS_FRAME = re.compile(r"(?:file://)?((?:/|\.{0,2}/)?[^\s():'\"]{1,300}\.[cm]?[jt]sx?):\d+")
#: How much of a failure's text its frames are looked for in (the stack follows the
#: message; a test can make the message as long as it likes).
JS_STACK_CHARS = 32_768
#: The file whose import failed (Node: ``Cannot find module 'x' imported from /w/a.test.js``).
_JS_IMPORTER = re.compile(r"Cannot find module \S+ (?:imported )?from '?((?:file://)?[^\s']+)'?")
#: A JavaScript code file's name (vitest's classname is the test file; mocha's a title).
_JS_PATH = re.compile(r"\.[cm]?[jt]sx?$")
#: A stack's line naming the error (``AssertionError [ERR_ASSERTION]: Expected ...``):
#: what says a failure's class when the report gives no ``type`` (mocha's xunit).
_JS_ERROR_LINE = re.compile(r"^([A-Za-z_$][\w$]*(?:Error|Exception))(?: \[\w+\])?(?:: ?(.*))?$")
_JS_SCAN_LINES = 60
#: Where the project is in the test sandbox (a report's absolute paths start there).
WORKSPACE = "/workspace/"
_CRASH_LINE = re.compile(r"^E\s+([A-Za-z_][\w.]*(?::.*)?)$")


class TestCase(msgspec.Struct, frozen=True):
    """One test's result as pytest reported it in JUnit XML."""

    __test__ = False  # not a pytest test class

    id: str
    file: str
    outcome: Outcome
    assertion: bool
    message: str
    #: The file of the innermost traceback frame (where the failure was raised), as the
    #: report prints it; "" when the report has no traceback.
    origin: str = ""

    def raised_in_test(self) -> bool:
        """The failure was raised by the test's own file (not by code it called)."""
        origin = self.origin.removeprefix("/workspace/")
        if not origin:
            return False
        # a quoted file (fluffy.pathnames) is named in a traceback as the report's text
        # is written: U+FFFD for its surrogates, then pytest's #xNN for what XML refuses
        readable = matchable(unshown(self.file))
        files = (self.file, readable, _XML_REFUSED.sub(_xml_escape, readable))
        return any(origin == file or origin.endswith("/" + file) for file in files)


#: What pytest's JUnit writer (``bin_xml_escape``) writes as ``#xNN``: XML 1.0 refuses it.
_XML_REFUSED = re.compile(
    "[^\u0009\u000a\u000d\u0020-\u007e\u0080-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)


def _xml_escape(found: re.Match[str]) -> str:
    point = ord(found.group())
    return f"#x{point:02X}" if point <= 0xFF else f"#x{point:04X}"


class _Refused(Exception):
    """Raised inside expat callbacks; mapped to :class:`EvidenceError`."""


def _node_id(classname: str, name: str, file: str) -> tuple[str, str]:
    """Rebuild pytest's node id (and file) from JUnit's dotted ``classname`` + ``name``.

    pytest writes ``tests/test_a.py::TestK::test_m`` as classname ``tests.test_a.TestK``,
    name ``test_m``, and a module's collection error as classname ``""``, name
    ``tests.test_a``.  xunit1's ``file`` attribute (``run_pytest`` asks for it) makes
    this exact; without it, trailing capitalised parts are taken to be ``Test*`` classes.
    """
    if file:
        if not file.startswith('"'):  # one quoted (not UTF-8: fluffy.pathnames) keeps its escapes
            file = file.replace("\\", "/")
        dotted = (file[:-3] if file.endswith(".py") else file).replace("/", ".")
        if not classname and name == dotted:
            return file, file
        if classname == dotted or classname.startswith(dotted + "."):
            rest = [p for p in classname[len(dotted) :].split(".") if p]
            return "::".join([file, *rest, name]), file
    if not classname:
        path = name.replace(".", "/") + ".py" if name else ""
        return path, path
    parts = classname.split(".")
    classes: list[str] = []
    while len(parts) > 1 and parts[-1][:1].isupper():
        classes.insert(0, parts.pop())
    path = "/".join(parts) + ".py"
    return "::".join([path, *classes, name]), path


#: A traceback frame's location: ``path:line: ...`` (pytest's long, short and line
#: styles) or ``File "path", line N`` (native).
_FRAME = re.compile(r'^(?:(?P<a>[^\s:"][^:]*):\d+: |\s*File "(?P<b>[^"]+)", line \d+)')


def _innermost(text: str) -> str:
    """The file of the last (innermost) frame of a traceback text, or ""."""
    found = ""
    for line in text.splitlines():
        match = _FRAME.match(line)
        if match:
            found = match.group("a") or match.group("b") or found
    return found


def _crash_line(text: str) -> str:
    """The last ``E   SomeError: ...`` line of a traceback text, or ``""``."""
    for line in reversed(text.splitlines()):
        match = _CRASH_LINE.match(line.strip()) if line.startswith("E ") else None
        if match:
            return match.group(1)
    return ""


def parse_junit(
    xml: bytes, *, name: str = "junit report", dialect: Dialect = "pytest"
) -> list[TestCase]:
    """Parse pytest's ``--junitxml`` output into one :class:`TestCase` per node id.

    A ``<failure>`` child means the test body failed (``outcome="failed"``); it counts as
    an assertion only when pytest's crash message is ``assert ...`` or
    ``AssertionError...``.  An ``<error>`` child (setup, teardown, collection) is
    ``"error"``; ``<skipped>`` (skip and xfail) is ``"skipped"``.  pytest reports a test
    that fails *and* errors in teardown twice; the worse outcome wins.  DOCTYPEs (and so
    entity declarations), reports over 32 MiB and malformed XML raise
    :class:`EvidenceError` -- never any other exception.  ``dialect="junit"``: a report of
    another test runner (a project's own command), where every ``<failure>`` is a failed
    assertion (JUnit's own meaning) and ``<error>`` an unexpected exception;
    ``"javascript"``: vitest's, jest's or node's (fluffy's reporters), or a JavaScript
    project's own command's (mocha's xunit), where a case's ``file`` (or a path-like
    ``classname``) is its test file and a ``<failure>`` is an assertion when its ``type``
    (or, with none given, its stack's error class) is an assertion error's.
    """
    if len(xml) > MAX_REPORT_BYTES:
        raise EvidenceError(f"{name} is too large", why=f"{len(xml)} bytes > {MAX_REPORT_BYTES}")
    cases: dict[str, TestCase] = {}
    current: dict[str, Any] | None = None
    capture: list[str] | None = None
    root: list[str] = []
    suites: list[str] = []  # each open <testsuite>'s file (mocha-junit-reporter names it)

    def refuse_doctype(*_: object) -> None:
        raise _Refused("it declares a DOCTYPE (refused: entity expansion)")

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal current, capture
        if not root:
            root.append(tag)
            if tag not in ("testsuites", "testsuite"):
                raise _Refused(f"its root element is <{tag}>, not <testsuites>")
        if tag == "testsuite":
            suites.append(attrs.get("file") or (suites[-1] if suites else ""))
        elif tag == "testcase":
            if current is not None:
                raise _Refused("a <testcase> is nested in another")
            suite = suites[-1] if suites else ""
            current = {"attrs": attrs, "kind": "passed", "message": "", "text": "", "suite": suite}
        elif current is not None and tag in ("failure", "error", "skipped"):
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            if _RANK[kind] > _RANK[current["kind"]]:
                current.update(kind=kind, message=attrs.get("message", ""), text="",
                               type=attrs.get("type", ""))  # fmt: skip
                capture = []

    def data(text: str) -> None:
        if capture is not None:
            capture.append(text)

    def end(tag: str) -> None:
        nonlocal current, capture
        if tag in ("failure", "error", "skipped") and current is not None and capture is not None:
            current["text"], capture = "".join(capture), None
        elif tag == "testcase" and current is not None:
            _add_case(cases, current, dialect)
            current = None
        elif tag == "testsuite" and suites:
            suites.pop()

    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = refuse_doctype
    parser.EntityDeclHandler = refuse_doctype
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = data
    try:
        parser.Parse(bytes(xml), True)
    except _Refused as exc:
        raise EvidenceError(f"{name} was refused", why=str(exc)) from None
    except (expat.ExpatError, ValueError, LookupError, TypeError) as exc:
        raise EvidenceError(f"{name} is not well-formed XML", why=str(exc)) from None
    return list(cases.values())


def _js_file(path: str) -> str:
    """A file as a JavaScript report names it, relative to the project when it is in it."""
    path = path.replace("\\", "/").removeprefix("file://")
    return "" if path == "undefined" else path.removeprefix(WORKSPACE)


def _js_said(raw: dict[str, Any]) -> tuple[str, str]:
    """(error class, message) of a failure: its ``type`` and ``message``, or, when the
    report gives no message (mocha's xunit writes the message and the stack as the
    text), read from the text: its first line, and the stack's line naming the class."""
    kind, said = str(raw.get("type", "")), str(raw["message"]).strip()
    if said or raw["kind"] not in ("failed", "error"):
        return kind, said
    lines = [line.strip() for line in str(raw["text"]).strip().splitlines()[:_JS_SCAN_LINES]]
    lines = [line for line in lines if line]
    for n, line in enumerate(lines):
        named = _JS_ERROR_LINE.match(line)
        if named is not None:
            return kind or named.group(1), lines[0] if n else (named.group(2) or line)
    return kind, lines[0] if lines else ""


def _js_case(raw: dict[str, Any]) -> tuple[str, str, bool, str, str]:
    """(node id, file, assertion, origin, message) of a JavaScript runner's case.

    The case's file is its ``file`` attribute, else its suite's, else its ``classname``
    when that is a code file's path (vitest's).  Another runner's classname is the
    suite's title (mocha's): the id is then ``file::title > name``, and a failure with no
    file named is placed in the outermost frame of its stack inside the project (the
    test's own function), so that a new test file's failure counts as that file's."""
    attrs: dict[str, str] = raw["attrs"]
    classname = attrs.get("classname", "")
    file = _js_file(attrs.get("file") or raw.get("suite") or "")
    if not file and _JS_PATH.search(classname):
        file = _js_file(classname)
    title = "" if _js_file(classname) == file else classname
    name = attrs["name"]
    test = " > ".join(part for part in (title, name) if part)
    node = file if name == file else "::".join(part for part in (file, test) if part)
    text = raw["text"][:JS_STACK_CHARS]
    frames = [f for f in _JS_FRAME.findall(text) if "node_modules/" not in f]
    if not file:  # the id stays the title's (the same whether the test passes or fails)
        inside = [_js_file(f) for f in frames]  # mocha shortens its frames to relative paths
        inside = [f for f in inside if not f.startswith(("/", "internal/"))]
        file = inside[-1] if inside else ""
    kind, said = _js_said(raw)
    assertion = (
        raw["kind"] == "failed"
        and (
            kind in _JS_ASSERTION_TYPES
            or (kind in ("", "Error") and bool(_JS_ASSERTION.match(said)))
        )
        and not said.startswith("New snapshot was not written")  # jest --ci: never green
    )
    importer = _JS_IMPORTER.search(said)  # a module the file imports failed
    origin = importer.group(1) if importer else frames[0] if frames else ""
    return node, file, assertion, origin.removeprefix("file://"), said


def _add_case(cases: dict[str, TestCase], raw: dict[str, Any], dialect: Dialect) -> None:
    attrs: dict[str, str] = raw["attrs"]
    if "name" not in attrs:
        raise _Refused("a <testcase> has no name attribute")
    outcome = cast(Outcome, raw["kind"])
    lines = str(raw["message"]).strip().splitlines()
    message = lines[0] if lines else ""
    if dialect == "javascript":
        node, file, assertion, origin, said = _js_case(raw)
        message = said.splitlines()[0] if said else ""
        if node in cases:  # two tests of one name (it.each, a repeated title): both count
            node = next(f"{node} [{n}]" for n in range(2, len(cases) + 3)
                        if f"{node} [{n}]" not in cases)  # fmt: skip
    else:
        node, file = _node_id(attrs.get("classname", ""), attrs["name"], attrs.get("file", ""))
        crash = _crash_line(raw["text"])
        if message in ("", "collection failure") and crash:
            message = f"{message}: {crash}" if message else crash
        assertion = outcome == "failed" and (dialect == "junit" or bool(_ASSERTION.match(message)))
        origin = ""
    old = cases.get(node)
    if old is None or _RANK[outcome] > _RANK[old.outcome]:
        origin = origin or _innermost(raw["text"])
        cases[node] = TestCase(node, file, outcome, assertion, message[:200], origin[:500])
