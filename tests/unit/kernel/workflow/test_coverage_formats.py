"""The three coverage formats (coverage.py JSON, Cobertura XML, lcov) and the budget.

The agreement test runs coverage.py for real on a tiny package and checks that all
three of its reports read back as the same numbers, equal to coverage's own totals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import CoverageFormatError
from fluffy.kernel.workflow import coverage as coverage_module
from fluffy.kernel.workflow.coverage import (
    MAX_REPORT_BYTES,
    CoverageReport,
    judge_budget,
    parse_coverage,
)

FUZZ = settings(max_examples=200, deadline=None)

# --- real reports, written by coverage.py itself -------------------------------------

CALC = """\
def sign(x):
    if x > 0:
        return "positive"
    if x < 0:
        return "negative"
    return "zero"


def never_called():
    total = 0
    for i in range(3):
        total += i
    return total
"""

TEXT = """\
def shout(text):
    return text.upper() + "!"


def whisper(text):
    return text.lower()
"""

TESTS = """\
from pkg.calc import sign
from pkg.text import shout


def test_sign():
    assert sign(2) == "positive"
    assert sign(0) == "zero"


def test_shout():
    assert shout("hi") == "HI!"
"""


@pytest.fixture(scope="module")
def real_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("covproject")
    (root / "pkg").mkdir()
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(CALC)
    (root / "pkg" / "text.py").write_text(TEXT)
    (root / "tests" / "test_pkg.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\n")  # root is the rootdir, whatever is above
    rc = root / "coveragerc"
    rc.write_text("[run]\nbranch = True\nsource = .\n")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE", "PYTEST", "PYTHON"))
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"

    def run(*args: str) -> None:
        cmd = [sys.executable, "-m", "coverage", *args]
        done = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"

    run("run", f"--rcfile={rc}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
    reports = {"json": root / "cov.json", "xml": root / "cov.xml", "lcov": root / "cov.lcov"}
    for kind, path in reports.items():
        run(kind, f"--rcfile={rc}", "-o", str(path))
    return reports


def test_real_reports_agree(real_reports: dict[str, Path]) -> None:
    parsed = {kind: parse_coverage(p.read_bytes(), name=p.name) for kind, p in real_reports.items()}
    assert parsed["json"].format == "coverage.py-json"
    assert parsed["xml"].format == "cobertura"
    assert parsed["lcov"].format == "lcov"

    own = json.loads(real_reports["json"].read_text())
    expected_files = {
        path: (entry["summary"]["covered_lines"], entry["summary"]["num_statements"])
        for path, entry in own["files"].items()
    }
    totals = own["totals"]
    for kind, report in parsed.items():
        assert report.covered_lines == totals["covered_lines"], kind
        assert report.total_lines == totals["num_statements"], kind
        assert dict(report.files) == expected_files, kind
        assert report.percent == 100 * totals["covered_lines"] / totals["num_statements"], kind

    # The project is really partly covered, so the agreement is not trivial.
    assert set(expected_files) == {
        "pkg/__init__.py",
        "pkg/calc.py",
        "pkg/text.py",
        "tests/test_pkg.py",
    }
    assert expected_files["pkg/__init__.py"] == (0, 0)
    covered, total = expected_files["pkg/calc.py"]
    assert 0 < covered < total
    assert 0 < parsed["json"].covered_lines < parsed["json"].total_lines


def test_real_reports_read_as_text_too(real_reports: dict[str, Path]) -> None:
    for path in real_reports.values():
        as_text = parse_coverage(path.read_text(encoding="utf-8"), name=path.name)
        assert as_text == parse_coverage(path.read_bytes(), name=path.name)


def test_real_reports_round_trip_through_json(real_reports: dict[str, Path]) -> None:
    for path in real_reports.values():
        report = parse_coverage(path.read_bytes())
        stored = json.loads(json.dumps(report.to_dict()))
        again = CoverageReport.from_dict(stored)
        assert again == report
        assert hash(again) == hash(report)
        assert again.percent == report.percent


# --- hand-written samples --------------------------------------------------------------

JSON_SAMPLE = {
    "meta": {"format": 3, "version": "7.5.0"},
    "files": {
        "a.py": {"summary": {"covered_lines": 3, "num_statements": 4, "percent_covered": 75.0}},
        "b/__init__.py": {"summary": {"covered_lines": 0, "num_statements": 0}},
        "c.py": {"summary": {"covered_lines": 2, "num_statements": 6}},
    },
    "totals": {"covered_lines": 5, "num_statements": 10, "percent_covered": 50.0},
}

# line-rate attributes lie on purpose; a.py spans two <class> elements that overlap on
# line 2 (covered in one of them), and <method> lines repeat class lines.
COBERTURA_SAMPLE = """<?xml version="1.0" ?>
<coverage line-rate="1" lines-valid="999" lines-covered="999" version="7.5">
  <!-- a comment -->
  <sources><source>/src</source></sources>
  <packages>
    <package name="." line-rate="1">
      <classes>
        <class name="a.py" filename="a.py" line-rate="1">
          <methods><method name="f"><lines><line number="1" hits="1"/></lines></method></methods>
          <lines>
            <line number="1" hits="1"/>
            <line number="2" hits="0"/>
            <line number="3" hits="0" branch="true" condition-coverage="0% (0/2)"/>
          </lines>
        </class>
        <class name="a.Inner" filename="a.py" line-rate="1">
          <lines><line number="2" hits="7"/><line number="4" hits="0"/></lines>
        </class>
        <class name="empty.py" filename="empty.py"><methods/><lines/></class>
      </classes>
    </package>
  </packages>
</coverage>
"""

LCOV_SAMPLE = """TN:
SF:a.py
FN:1,3,f
FNDA:1,f
DA:1,1
DA:2,0,abcdefgh
DA:3,5
BRDA:3,0,0,1
BRF:1
BRH:1
LF:3
LH:2
end_of_record
TN:other
SF:b.py
DA:1,0
DA:2,1
end_of_record
SF:empty.py
end_of_record
"""


def test_json_sample() -> None:
    report = parse_coverage(json.dumps(JSON_SAMPLE))
    assert (report.covered_lines, report.total_lines) == (5, 10)
    assert dict(report.files) == {"a.py": (3, 4), "b/__init__.py": (0, 0), "c.py": (2, 6)}
    assert report.percent == 50.0
    assert report.format == "coverage.py-json"


def test_json_with_bom_and_whitespace() -> None:
    data = b"\xef\xbb\xbf \n\t" + json.dumps(JSON_SAMPLE).encode()
    assert parse_coverage(data).covered_lines == 5


def test_cobertura_counts_lines_not_rates() -> None:
    report = parse_coverage(COBERTURA_SAMPLE.encode())
    assert dict(report.files) == {"a.py": (2, 4), "empty.py": (0, 0)}
    assert (report.covered_lines, report.total_lines) == (2, 4)
    assert report.percent == 50.0
    assert report.format == "cobertura"


def test_cobertura_ignores_the_encoding_declaration_of_text() -> None:
    text = '<?xml version="1.0" encoding="utf-16"?><coverage><packages/></coverage>'
    report = parse_coverage(text)
    assert (report.covered_lines, report.total_lines, dict(report.files)) == (0, 0, {})
    assert report.percent == 100.0


def test_deeply_nested_xml_is_fine() -> None:
    document = "<coverage>" + "<a>" * 100_000 + "</a>" * 100_000 + "</coverage>"
    assert parse_coverage(document).total_lines == 0


def test_lcov_sample() -> None:
    report = parse_coverage(LCOV_SAMPLE)
    assert dict(report.files) == {"a.py": (2, 3), "b.py": (1, 2), "empty.py": (0, 0)}
    assert (report.covered_lines, report.total_lines) == (3, 5)
    assert report.format == "lcov"


def test_lcov_crlf_and_no_final_newline() -> None:
    data = LCOV_SAMPLE.strip().replace("\n", "\r\n").encode()
    assert parse_coverage(data) == parse_coverage(LCOV_SAMPLE)


def test_lcov_prefers_lh_lf_over_da_count() -> None:
    report = parse_coverage("SF:x.py\nDA:1,1\nLF:10\nLH:7\nend_of_record\n")
    assert dict(report.files) == {"x.py": (7, 10)}


def test_lcov_repeated_file_is_the_union_of_its_lines() -> None:
    data = (
        "TN:one\nSF:x.py\nDA:1,1\nDA:2,0\nDA:3,0\nLF:3\nLH:1\nend_of_record\n"
        "TN:two\nSF:x.py\nDA:2,4\nDA:3,0\nDA:4,0\nLF:3\nLH:1\nend_of_record\n"
    )
    assert dict(parse_coverage(data).files) == {"x.py": (2, 4)}


# --- malformed input ---------------------------------------------------------------------


def _json(**changes: object) -> str:
    doc = json.loads(json.dumps(JSON_SAMPLE))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for key in parents:
            node = node[key.replace("_DOT_", ".")]
        node[last.replace("_DOT_", ".")] = value
    return json.dumps(doc)


def _lcov_record(*lines: str) -> str:
    return "\n".join(["SF:x.py", *lines, "end_of_record"]) + "\n"


def _xml_line(attrs: str) -> str:
    line = f'<class filename="x.py"><lines><line {attrs}/></lines></class>'
    return f"<coverage><packages><package><classes>{line}</classes></package></packages></coverage>"


MALFORMED: list[tuple[str, bytes | str, str]] = [
    ("empty", b"", "is empty"),
    ("blank", " \n\t\n", "is empty"),
    ("prose", "hello, this is not coverage", "starts with 'hello"),
    ("json-array", "[1, 2, 3]", "starts with '["),
    ("not-utf8", b"{\xff\xfe\x00}", "not UTF-8"),
    ("lone-surrogate", "SF:\ud800\n", "not valid text"),
    ("json-syntax", '{"totals": {', "not valid JSON"),
    ("json-nesting", '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ("json-huge-int", '{"totals": {"covered_lines": 1' + "0" * 5000 + "}}", "not valid JSON"),
    ("json-foreign", '{"name": "package.json"}', "no 'totals' and 'files'"),
    ("json-totals-list", _json(totals=[1, 2]), "must both be JSON objects"),
    ("json-files-list", _json(files=["a.py"]), "must both be JSON objects"),
    ("json-string-count", _json(totals__covered_lines="5"), "not a whole number"),
    ("json-float-count", _json(totals__num_statements=10.0), "not a whole number"),
    ("json-bool-count", _json(totals__covered_lines=True), "not a whole number"),
    ("json-null-count", _json(totals__covered_lines=None), "not a whole number"),
    ("json-negative", _json(totals__covered_lines=-1), "-1"),
    ("json-covered-over-total", _json(totals__covered_lines=11), "11 covered lines out of only 10"),
    ("json-no-summary", _json(files__c_DOT_py={"executed_lines": []}), "no 'summary'"),
    (
        "json-file-negative",
        _json(files__c_DOT_py__summary={"covered_lines": 2, "num_statements": -6}),
        "c.py total lines",
    ),
    ("json-totals-lie", _json(totals__covered_lines=9), "files add up to 5/10"),
    ("xml-syntax", "<coverage><packages></coverage>", "not well-formed XML"),
    ("xml-garbage", "<<<>>>", "not well-formed XML"),
    ("xml-root", "<report><class filename='a.py'/></report>", "not Cobertura's <coverage>"),
    ("xml-no-filename", "<coverage><class name='a'/></coverage>", "without a filename"),
    ("xml-negative-hits", _xml_line('number="3" hits="-1"'), "hits of line 3 in x.py"),
    ("xml-word-hits", _xml_line('number="3" hits="many"'), "'many'"),
    ("xml-float-hits", _xml_line('number="3" hits="1.0"'), "'1.0'"),
    ("xml-missing-hits", _xml_line('number="3"'), "None"),
    ("xml-line-zero", _xml_line('number="0" hits="1"'), "positive whole number"),
    ("lcov-truncated", "SF:x.py\nDA:1,1\nLF:1\n", "truncated"),
    ("lcov-sf-in-record", "SF:x.py\nDA:1,1\nSF:y.py\nend_of_record\n", "truncated"),
    ("lcov-da-outside", "DA:1,1\nend_of_record\n", "outside a record"),
    ("lcov-end-outside", "end_of_record\n", "outside a record"),
    ("lcov-empty-sf", "SF:\nend_of_record\n", "outside a record"),
    ("lcov-da-short", _lcov_record("DA:1"), "needs DA:<line>,<hits>"),
    ("lcov-da-negative", _lcov_record("DA:1,-1"), "hit count"),
    ("lcov-da-word", _lcov_record("DA:one,1"), "line number"),
    ("lcov-lf-word", _lcov_record("LF:x", "LH:0"), "LF"),
    ("lcov-lf-only", _lcov_record("DA:1,1", "LF:1"), "only one of LF/LH"),
    ("lcov-lh-over-lf", _lcov_record("LF:2", "LH:3"), "3 covered lines out of only 2"),
    ("lcov-no-colon", _lcov_record("DA:1,1", "garbage"), "not a TAG:value line"),
]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [pytest.param(data, fragment, id=case) for case, data, fragment in MALFORMED],
)
def test_malformed_input_is_a_coverage_format_error(data: bytes | str, fragment: str) -> None:
    with pytest.raises(CoverageFormatError) as caught:
        parse_coverage(data, name="build/cov.report")
    error = caught.value
    assert error.code == "workflow.coverage_invalid"
    assert error.what.startswith("cannot read build/cov.report: ")
    assert fragment in error.what
    assert error.why
    assert error.fix


@pytest.mark.parametrize(
    "document",
    [
        '<?xml version="1.0"?>\n<!DOCTYPE coverage SYSTEM "coverage-04.dtd">\n<coverage/>',
        '<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
        "<coverage><sources><source>&lol2;</source></sources></coverage>",
        '<!DOCTYPE c [<!ENTITY x SYSTEM "file:///etc/passwd">]><coverage>&x;</coverage>',
        "<!doctype coverage><coverage/>",
        "<coverage/>\n<!DOCTYPE late>",
    ],
)
def test_doctype_is_refused(document: str) -> None:
    for data in (document, document.encode()):
        with pytest.raises(CoverageFormatError, match="DOCTYPE") as caught:
            parse_coverage(data, name="cov.xml")
        assert "entities" in caught.value.why


def test_size_cap() -> None:
    assert MAX_REPORT_BYTES == 64 * 1024 * 1024
    for data in (b" " * (MAX_REPORT_BYTES + 1), " " * (MAX_REPORT_BYTES + 1)):
        with pytest.raises(CoverageFormatError, match="64 MiB"):
            parse_coverage(data, name="huge.json")


def test_size_cap_counts_encoded_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coverage_module, "MAX_REPORT_BYTES", 100)
    ok = "SF:x.py\nend_of_record\n"
    assert parse_coverage(ok).files == {"x.py": (0, 0)}
    with pytest.raises(CoverageFormatError, match="size limit"):
        parse_coverage("SF:" + "é" * 60 + "\nend_of_record\n")  # 78 characters, 138 bytes


def test_wrong_argument_type_is_a_coverage_format_error() -> None:
    with pytest.raises(CoverageFormatError, match="not bytes or text"):
        parse_coverage(123)  # type: ignore[arg-type]


# --- fuzzing -----------------------------------------------------------------------------


def _check(data: bytes | str) -> None:
    try:
        report = parse_coverage(data, name="fuzz")
    except CoverageFormatError as exc:
        assert exc.what.startswith("cannot read fuzz: ")
        return
    assert 0 <= report.covered_lines <= report.total_lines
    assert 0.0 <= report.percent <= 100.0
    assert report.format in ("coverage.py-json", "cobertura", "lcov")
    assert sum(c for c, _ in report.files.values()) == report.covered_lines
    assert sum(t for _, t in report.files.values()) == report.total_lines
    assert CoverageReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


@FUZZ
@given(st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _check(data)


@FUZZ
@given(st.sampled_from(["{", "<", "SF:", "TN:\n", "<coverage>", "\ufeff"]), st.text(max_size=500))
def test_fuzz_format_prefixes(prefix: str, rest: str) -> None:
    _check(prefix + rest)


LCOV_LINES = st.sampled_from(
    [
        "TN:",
        "SF:a.py",
        "SF:b.py",
        "DA:1,1",
        "DA:2,0",
        "DA:1,0,hash",
        "DA:0,1",
        "DA:x",
        "DA:3,-2",
        "LF:2",
        "LF:0",
        "LH:1",
        "LH:3",
        "FN:1,f",
        "BRDA:1,0,0,-",
        "end_of_record",
        "",
        "junk",
        "VER:2",
    ]
)


@FUZZ
@given(st.lists(LCOV_LINES, max_size=30))
def test_fuzz_lcov_structure(lines: list[str]) -> None:
    _check("\n".join(lines))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 12) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
COUNTS = st.integers(-1, 12) | JSON_VALUES


@FUZZ
@given(
    st.fixed_dictionaries({"covered_lines": COUNTS, "num_statements": COUNTS}),
    st.dictionaries(
        st.sampled_from(["a.py", "b.py", ""]),
        st.fixed_dictionaries(
            {"summary": st.fixed_dictionaries({"covered_lines": COUNTS, "num_statements": COUNTS})}
        )
        | JSON_VALUES,
        max_size=3,
    ),
)
def test_fuzz_coverage_json_structure(totals: object, files: object) -> None:
    _check(json.dumps({"totals": totals, "files": files}))


XML_LINE = st.builds(
    lambda n, h: f'<line number="{n}" hits="{h}"/>',
    st.sampled_from(["1", "2", "0", "-1", "x", " 3 "]),
    st.sampled_from(["0", "1", "9", "-1", "1.5", ""]),
)
XML_CLASS = st.builds(
    lambda f, lines: f"<class {f}><lines>{''.join(lines)}</lines></class>",
    st.sampled_from(['filename="a.py"', 'filename="b.py"', 'filename=""', 'name="n"']),
    st.lists(XML_LINE, max_size=5),
)


@FUZZ
@given(st.sampled_from(["coverage", "report"]), st.lists(XML_CLASS, max_size=4), st.booleans())
def test_fuzz_cobertura_structure(root: str, classes: list[str], truncate: bool) -> None:
    body = f"<packages><package><classes>{''.join(classes)}</classes></package></packages>"
    document = f"<{root}>{body}</{root}>"
    _check(document[: len(document) // 2] if truncate else document)


# --- the report value ------------------------------------------------------------------


def test_report_is_immutable_and_sorted() -> None:
    report = CoverageReport(1, 3, {"z.py": (1, 2), "a.py": [0, 1]}, "lcov")  # type: ignore[dict-item]
    assert list(report.files) == ["a.py", "z.py"]
    assert report.files["a.py"] == (0, 1)
    with pytest.raises(TypeError):
        report.files["b.py"] = (0, 0)  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        report.covered_lines = 3  # type: ignore[misc]


def test_empty_report_is_fully_covered() -> None:
    assert CoverageReport(0, 0, {}, "cobertura").percent == 100.0


@pytest.mark.parametrize(
    ("stored", "fragment"),
    [
        ([], "lacks one of"),
        ({"format": "lcov", "covered_lines": 1, "total_lines": 2}, "lacks one of"),
        ({"format": "gcov", "covered_lines": 1, "total_lines": 2, "files": {}}, "'gcov'"),
        ({"format": "lcov", "covered_lines": 3, "total_lines": 2, "files": {}}, "out of only 2"),
        ({"format": "lcov", "covered_lines": 1, "total_lines": 2, "files": []}, "not a mapping"),
        ({"format": "lcov", "covered_lines": 0, "total_lines": 0, "files": {"a": 1}}, "pair"),
        ({"format": "lcov", "covered_lines": 0, "total_lines": 0, "files": {"": [0, 0]}}, "''"),
        (
            {"format": "lcov", "covered_lines": 0, "total_lines": 0, "files": {"a": [2, 1]}},
            "a claims 2",
        ),
    ],
)
def test_from_dict_rejects_bad_stored_data(stored: object, fragment: str) -> None:
    with pytest.raises(CoverageFormatError) as caught:
        CoverageReport.from_dict(stored)  # type: ignore[arg-type]
    assert fragment in caught.value.what


# --- the tech-debt budget ------------------------------------------------------------------


def _at(covered: int, total: int = 10_000) -> CoverageReport:
    return CoverageReport(covered, total, {}, "coverage.py-json")


BASELINE = _at(8_000)  # 80.0 %


@pytest.mark.parametrize(
    ("covered", "level", "delta"),
    [
        (8_100, "ok", 1.0),
        (8_000, "ok", 0.0),
        (7_999, "drop", -0.01),  # min_delta 0: any decrease is not ok
        (7_900, "drop", -1.0),
        (7_800, "drop", -2.0),
        (7_799, "warn", -2.01),
        (7_690, "warn", -3.1),
        (7_500, "warn", -5.0),
        (7_499, "lock", -5.01),
        (0, "lock", -80.0),
    ],
)
def test_budget_boundaries(covered: int, level: str, delta: float) -> None:
    verdict = judge_budget(BASELINE, _at(covered))
    assert verdict.level == level
    assert verdict.delta == pytest.approx(delta, abs=1e-9)
    assert verdict.baseline_percent == 80.0
    assert verdict.current_percent == covered / 100


def test_budget_messages() -> None:
    assert (
        judge_budget(BASELINE, _at(7_690)).message
        == "coverage fell 3.1 points (80.0% -> 76.9%): warning, commit allowed"
    )
    lock = judge_budget(BASELINE, _at(7_499)).message
    assert lock.startswith("coverage fell 5.01 points (80.0% -> 74.99%): explore mode locked")
    assert "strict mode" in lock
    assert judge_budget(BASELINE, _at(7_900)).message == (
        "coverage fell 1.0 points (80.0% -> 79.0%): below min_delta (0.0 points); "
        "commit allowed, with this notice on record"
    )
    within = judge_budget(BASELINE, _at(7_900), min_delta=-1).message
    assert "within min_delta (-1.0 points)" in within
    assert "rose 1.0 points" in judge_budget(BASELINE, _at(8_100)).message
    assert (
        judge_budget(BASELINE, _at(8_000)).message == "coverage unchanged at 80.0%: commit allowed"
    )


def test_budget_without_baseline_is_ok() -> None:
    verdict = judge_budget(None, _at(1_000))
    assert (verdict.level, verdict.baseline_percent, verdict.delta) == ("ok", None, 0.0)
    assert verdict.current_percent == 10.0
    assert "no coverage baseline" in verdict.message
    with pytest.raises(AttributeError):
        verdict.level = "lock"  # type: ignore[misc]


def test_budget_float_noise_does_not_cross_a_boundary() -> None:
    # 17/51 -> 47/150 is exactly 2 points lower, but the floats differ by -2.0000000000000036.
    baseline, current = CoverageReport(17, 51, {}, "lcov"), CoverageReport(47, 150, {}, "lcov")
    assert current.percent - baseline.percent < -2.0
    verdict = judge_budget(baseline, current)
    assert (verdict.level, verdict.delta) == ("drop", -2.0)
    assert judge_budget(baseline, current, min_delta=-2).level == "ok"


def test_budget_min_delta_is_honoured_exactly() -> None:
    assert judge_budget(BASELINE, _at(7_999)).ok is False  # the default: no decrease
    assert judge_budget(BASELINE, _at(7_900), min_delta=-1).level == "ok"
    assert judge_budget(BASELINE, _at(7_899), min_delta=-1).level == "drop"
    rise = {"min_delta": 0.5}  # a policy may ask every commit to raise coverage
    assert judge_budget(BASELINE, _at(8_050), **rise).level == "ok"
    short = judge_budget(BASELINE, _at(8_049), **rise)
    assert short.level == "drop"
    assert short.message.startswith("coverage changed by 0.49 points")
    assert judge_budget(BASELINE, _at(8_000), **rise).level == "drop"


def test_budget_custom_thresholds() -> None:
    assert judge_budget(BASELINE, _at(7_950), warning_threshold=-0.5, min_delta=-0.5).level == (
        "ok"
    )
    assert judge_budget(BASELINE, _at(7_940), warning_threshold=-0.5).level == "warn"
    strict = {"warning_threshold": 0.0, "lockout_threshold": 0.0}
    assert judge_budget(BASELINE, _at(8_000), **strict).level == "ok"
    assert judge_budget(BASELINE, _at(7_999), **strict).level == "lock"


@pytest.mark.parametrize(
    ("warning", "lockout"),
    [
        (1.0, -5.0),
        (-2.0, 0.5),
        (-5.0, -2.0),
        (float("nan"), -5.0),
        (-2.0, float("nan")),
        (-2.0, float("-inf")),
    ],
)
def test_budget_rejects_bad_thresholds(warning: float, lockout: float) -> None:
    with pytest.raises(ValueError, match="lockout <= warning <= 0"):
        judge_budget(BASELINE, _at(1), warning_threshold=warning, lockout_threshold=lockout)


@pytest.mark.parametrize("min_delta", [-2.5, float("nan"), float("inf")])
def test_budget_rejects_min_delta_below_the_warning(min_delta: float) -> None:
    with pytest.raises(ValueError, match="warning <= min_delta"):
        judge_budget(BASELINE, _at(1), min_delta=min_delta)


def test_policy_checks_the_tech_debt_settings() -> None:
    from fluffy.kernel.policy.tdd_settings import TechDebtSettings

    assert TechDebtSettings().baseline_file == ".fluffy/coverage-baseline.json"
    with pytest.raises(ValueError, match="warning <= min_delta"):
        TechDebtSettings(min_delta=-3)
    for outside in ("coverage.json", "../x.json", ".fluffy/../src/x.json", "/abs.json", ".fluffy/"):
        with pytest.raises(ValueError, match=r"inside \.fluffy/"):
            TechDebtSettings(baseline_file=outside)
    assert TechDebtSettings(baseline_file=".fluffy/cov_2.base-line.json").baseline_file == (
        ".fluffy/cov_2.base-line.json"
    )


@pytest.mark.parametrize(
    "owned",
    [
        ".fluffy/policy.yaml",  # the kernel would overwrite what it owns
        ".fluffy/audit.db",
        ".fluffy/state.db",
        ".fluffy/config.yaml",
        ".fluffy/rules/no-secrets.py",
        ".fluffy/rules/x.json",
        ".fluffy/backups/x",
        ".fluffy/./policy.json",
        ".fluffy/.hidden.json",
        ".fluffy/.json",
        ".fluffy/a b.json",
        ".fluffy/x.json/",
        ".fluffy//x.json",
    ],
)
def test_the_baseline_file_is_a_plain_json_file_in_fluffy(owned: str) -> None:
    from fluffy.errors import PolicyError
    from fluffy.kernel.policy.model import parse_policy
    from fluffy.kernel.policy.tdd_settings import TechDebtSettings

    with pytest.raises(ValueError, match=r"\.fluffy/<name>\.json"):
        TechDebtSettings(baseline_file=owned)
    text = f"capabilities: []\ntech_debt:\n  min_delta: 0\n  baseline_file: '{owned}'\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert "p.yaml:4: tech_debt.baseline_file" in info.value.what


def test_the_baseline_leaves_the_worktree_as_the_commit_left_it(tmp_path: Path) -> None:
    """A project that commits .fluffy/ (its policy) stays clean after fluffy writes the
    baseline; a .gitignore of the user's own in .fluffy/ is never touched."""
    from fluffy.kernel.workflow.baseline import write_baseline

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    git("init", "-q")
    (tmp_path / ".fluffy").mkdir()
    (tmp_path / ".fluffy" / "policy.yaml").write_text("capabilities: []\n")
    git("add", "-A")
    git("commit", "-qm", "policy")
    report = CoverageReport(8, 10, {"a.py": (8, 10)}, "coverage.py-json")
    write_baseline(tmp_path, ".fluffy/coverage-baseline.json", report, "s1")
    assert (tmp_path / ".fluffy" / "coverage-baseline.json").is_file()
    assert git("status", "--porcelain") == ""  # nothing new for the next commit to take
    own = "# mine\n*.log\n"
    (tmp_path / ".fluffy" / ".gitignore").write_text(own)
    write_baseline(tmp_path, ".fluffy/coverage-baseline.json", report, "s2")
    assert (tmp_path / ".fluffy" / ".gitignore").read_text() == own
