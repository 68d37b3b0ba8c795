"""Coverage reports and the tech-debt budget.

Design rule (tech-debt budget): the coverage baseline is updated after each
strict-mode commit; a commit is judged by its change in line coverage, in percentage
points, against ``min_delta`` (0: coverage must not decrease), the warning threshold
(-2) and the lockout threshold (-5): at least ``min_delta`` -> ``ok``; less -> ``drop``
(shown and audited, commit allowed); more than 2 lower -> ``warn`` (a louder warning,
commit allowed); more than 5 lower -> ``lock`` (explore mode locked until strict-mode
tests restore coverage).  With the defaults, exactly 0.0 is ``ok``, -0.01 and exactly
-2.0 are ``drop``, and exactly -5.0 is ``warn`` (ADR-042).

Reading a report is the untrusted half.  :func:`parse_coverage` takes what
``coverage json`` / ``xml`` (Cobertura) / ``lcov`` write, detects the format from the
content and counts *lines* only.  Cobertura is counted from its <line> elements, not
its rounded ``line-rate`` attributes.  Anything malformed raises
:class:`~fluffy.errors.CoverageFormatError` and nothing else.  Input is capped at
64 MiB, and XML with a DOCTYPE is refused outright (no DTD, no entity declarations).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, cast

import msgspec

from fluffy.errors import CoverageFormatError
from fluffy.kernel.policy.tdd_settings import check_thresholds
from fluffy.pathnames import is_utf8, matchable

MAX_REPORT_BYTES = 64 * 1024 * 1024
FORMATS = ("coverage.py-json", "cobertura", "lcov")
_WHOLE = re.compile(r"[0-9]{1,18}")  # ASCII digits only: int() would also take "+1", "1_0", "٣"
_LCOV_LINE = re.compile(r"[A-Za-z_]+:|end_of_record\b")
_DOCTYPE = re.compile(r"<!DOCTYPE", re.IGNORECASE)


def _bad(name: str, detail: str, why: str | None = None) -> CoverageFormatError:
    return CoverageFormatError(f"cannot read {name}: {detail}", why=why)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _pair(covered: object, total: object, what: str, name: str) -> tuple[int, int]:
    for label, value in (("covered", covered), ("total", total)):
        if type(value) is not int or value < 0:  # bool is an int subclass, not a count
            raise _bad(name, f"{what} {label} lines is {_show(value)}, not a whole number >= 0")
    c, t = cast(int, covered), cast(int, total)
    if c > t:
        raise _bad(name, f"{what} claims {c} covered lines out of only {t}")
    return c, t


def _whole(text: str | None, what: str, name: str, why: str, *, minimum: int = 0) -> int:
    if text is None or not _WHOLE.fullmatch(text.strip()) or int(text.strip()) < minimum:
        kind = "a positive" if minimum else "a non-negative"
        raise _bad(name, f"{what} is {_show(text)}, not {kind} whole number", why)
    return int(text)


@dataclass(frozen=True)
class CoverageReport:
    """Line coverage of one test run: totals plus ``path -> (covered, total)``."""

    covered_lines: int
    total_lines: int
    files: Mapping[str, tuple[int, int]]
    format: str

    def __post_init__(self) -> None:
        name = "coverage report"
        if self.format not in FORMATS:
            raise _bad(name, f"format is {_show(self.format)}, not one of {', '.join(FORMATS)}")
        _pair(self.covered_lines, self.total_lines, "the totals'", name)
        if not isinstance(self.files, Mapping):
            raise _bad(name, f"files is {_show(self.files)}, not a mapping")
        files: dict[str, tuple[int, int]] = {}
        for path, pair in sorted(self.files.items(), key=lambda item: str(item[0])):
            if not isinstance(path, str) or not path:
                raise _bad(name, f"file name {_show(path)} is not a non-empty string")
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise _bad(name, f"{path} has {_show(pair)}, not a (covered, total) pair")
            files[path] = _pair(pair[0], pair[1], path, name)
        object.__setattr__(self, "files", MappingProxyType(files))

    def __hash__(self) -> int:
        return hash((self.covered_lines, self.total_lines, frozenset(self.files.items())))

    @property
    def percent(self) -> float:
        """Covered lines as a percentage; an empty report counts as fully covered."""
        return 100.0 * self.covered_lines / self.total_lines if self.total_lines else 100.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "covered_lines": self.covered_lines,
            "total_lines": self.total_lines,
            "files": {path: [c, t] for path, (c, t) in self.files.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoverageReport:
        """Inverse of :meth:`to_dict`; bad stored data raises CoverageFormatError."""
        keys = {"format", "covered_lines", "total_lines", "files"}
        if not isinstance(data, Mapping) or not keys <= data.keys():
            raise _bad("stored coverage report", f"{_show(data)} lacks one of {sorted(keys)}")
        return cls(data["covered_lines"], data["total_lines"], data["files"], data["format"])


def parse_coverage(data: bytes | str, *, name: str = "coverage report") -> CoverageReport:
    """Read a coverage.py JSON, Cobertura XML or lcov report (detected from content)."""
    if isinstance(data, str):
        try:
            data = data[: MAX_REPORT_BYTES + 1].encode("utf-8")  # any more is refused anyway
        except UnicodeEncodeError as exc:
            raise _bad(name, f"is not valid text ({exc.reason})") from None
    if not isinstance(data, bytes):
        raise _bad(name, f"is a {type(data).__name__}, not bytes or text")
    if len(data) > MAX_REPORT_BYTES:
        raise _bad(name, f"is over the {MAX_REPORT_BYTES // 2**20} MiB size limit")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _bad(name, f"is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    head = text.lstrip()
    if head.startswith("{"):
        return _parse_json(text, name)
    if head.startswith("<"):
        return _parse_cobertura(text, name)
    if _LCOV_LINE.match(head):
        return _parse_lcov(text, name)
    if not head:
        raise _bad(name, "is empty")
    raise _bad(name, f"is not JSON, XML or lcov (it starts with {_show(head[:20])})")


def _parse_json(text: str, name: str) -> CoverageReport:
    why = "coverage.py JSON needs totals and files with covered_lines/num_statements"
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _bad(name, "is JSON nested too deeply") from None
    except ValueError as exc:
        raise _bad(name, f"is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not {"totals", "files"} <= doc.keys():
        raise _bad(name, "is JSON but has no 'totals' and 'files' (not coverage.py JSON)", why)
    totals, entries = doc["totals"], doc["files"]
    if not isinstance(totals, dict) or not isinstance(entries, dict):
        raise _bad(name, "'totals' and 'files' must both be JSON objects", why)
    covered, total = _pair(
        totals.get("covered_lines"), totals.get("num_statements"), "totals", name
    )
    files: dict[str, tuple[int, int]] = {}
    for path, entry in entries.items():
        summary = entry.get("summary") if isinstance(entry, dict) else None
        if not path or not isinstance(summary, dict):
            raise _bad(name, f"file entry {_show(path)} has no 'summary' object", why)
        if not is_utf8(path):  # coverage.py traces no such file: the report was not its
            raise _bad(name, f"file entry {_show(matchable(path))} is not a UTF-8 name", why)
        files[path] = _pair(summary.get("covered_lines"), summary.get("num_statements"), path, name)
    report = _from_lines({}, files, "coverage.py-json")  # totals = sum of the files
    if (report.covered_lines, report.total_lines) != (covered, total):
        sums = f"{report.covered_lines}/{report.total_lines}"
        raise _bad(name, f"totals say {covered}/{total} lines, the files add up to {sums}", why)
    return report


def _parse_cobertura(text: str, name: str) -> CoverageReport:
    if _DOCTYPE.search(text):
        why = "a DTD can declare entities (entity bombs, external files); coverage XML has none"
        raise _bad(name, "contains a DOCTYPE declaration; refused", why)
    try:
        root = ET.fromstring(text)  # noqa: S314 - no DOCTYPE, so no entities; expat >= 2.4
    except (ET.ParseError, ValueError, LookupError, RecursionError) as exc:
        raise _bad(name, f"is not well-formed XML ({exc})") from None
    if root.tag != "coverage":
        raise _bad(name, f"is XML with root <{root.tag[:40]}>, not Cobertura's <coverage>")
    why = "a Cobertura <line> needs number >= 1 and hits >= 0, both whole numbers"
    seen: dict[str, dict[int, bool]] = {}
    for cls in root.iter("class"):
        path = cls.get("filename")
        if not path:
            raise _bad(name, f"has a <class> ({_show(cls.get('name'))}) without a filename")
        lines = seen.setdefault(path, {})  # a file may span several <class> elements
        for line in (ln for block in cls.findall("lines") for ln in block.findall("line")):
            number = _whole(line.get("number"), f"a line number in {path}", name, why, minimum=1)
            hits = _whole(line.get("hits"), f"hits of line {number} in {path}", name, why)
            lines[number] = lines.get(number, False) or hits > 0
    return _from_lines(seen, {}, "cobertura")


def _from_lines(
    seen: dict[str, dict[int, bool]], declared: Mapping[str, tuple[int, int] | None], fmt: str
) -> CoverageReport:
    """Per-file counts: ``declared`` ones win, else counted from line -> covered maps."""
    files = {p: (sum(ls.values()), len(ls)) for p, ls in seen.items()}
    files.update((p, pair) for p, pair in declared.items() if pair is not None)
    covered = sum(c for c, _ in files.values())
    return CoverageReport(covered, sum(t for _, t in files.values()), files, fmt)


def _parse_lcov(text: str, name: str) -> CoverageReport:
    """LH/LF when a file has one record that gives them, else the union of its DA lines."""
    why = "an lcov record runs from SF:<file> to end_of_record, with DA:<line>,<hits> lines"
    seen: dict[str, dict[int, bool]] = {}
    declared: dict[str, tuple[int, int] | None] = {}
    path: str | None = None
    found: int | None = None
    hit: int | None = None
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        tag, colon, value = line.partition(":")
        at = f"line {number}"
        if not line or (path is None and tag in ("TN", "VER") and colon):
            continue
        if path is None:
            if tag != "SF" or not colon or not value:
                raise _bad(name, f"{at}: {_show(line)} outside a record (expected SF:)", why)
            path, found, hit = value, None, None
            lines = seen.setdefault(path, {})  # repeated records of a file merge by union
        elif line == "end_of_record":
            if (found is None) != (hit is None):
                raise _bad(name, f"{at}: the record for {path} has only one of LF/LH", why)
            pair = None if found is None else _pair(hit, found, f"{path} (LH/LF)", name)
            declared[path] = None if path in declared else pair
            path = None
        elif tag == "SF":
            raise _bad(name, f"{at}: record for {path} is truncated (no end_of_record)", why)
        elif not colon:
            raise _bad(name, f"{at}: {_show(line)} is not a TAG:value line", why)
        elif tag == "DA":
            fields = value.split(",")
            if len(fields) < 2:
                raise _bad(name, f"{at}: {_show(line)} needs DA:<line>,<hits>", why)
            n = _whole(fields[0], f"{at}: the line number", name, why, minimum=1)
            hits = _whole(fields[1], f"{at}: the hit count", name, why)
            lines[n] = lines.get(n, False) or hits > 0
        elif tag in ("LF", "LH"):
            count = _whole(value, f"{at}: {tag}", name, why)
            found, hit = (count, hit) if tag == "LF" else (found, count)
    if path is not None:
        raise _bad(name, f"the record for {path} is truncated (no end_of_record)", why)
    return _from_lines(seen, declared, "lcov")


class BudgetVerdict(msgspec.Struct, frozen=True):
    """What the tech-debt budget says about one commit."""

    level: Literal["ok", "drop", "warn", "lock"]
    baseline_percent: float | None
    current_percent: float
    delta: float  # percentage points, current - baseline (0.0 without a baseline)
    message: str

    @property
    def ok(self) -> bool:
        return self.level == "ok"


_RESTORE = "switch to strict mode and write tests that restore coverage"


def _num(value: float) -> str:
    text = f"{value:.2f}"
    return text[:-1] if text.endswith("0") else text


def judge_budget(
    baseline: CoverageReport | None,
    current: CoverageReport,
    *,
    min_delta: float = 0.0,
    warning_threshold: float = -2.0,
    lockout_threshold: float = -5.0,
) -> BudgetVerdict:
    """Apply the budget: delta < lockout -> lock; < warning -> warn; < min_delta -> drop;
    else ok (``min_delta`` 0: any decrease is not ok)."""
    warn, lock = warning_threshold, lockout_threshold
    check_thresholds(min_delta, warn, lock)
    now = current.percent
    if baseline is None:
        message = f"no coverage baseline yet (now {_num(now)}%): commit allowed"
        return BudgetVerdict("ok", None, now, 0.0, message)
    before = baseline.percent
    delta = round(now - before, 9) + 0.0  # drop float noise (and -0.0)
    span = f"({_num(before)}% -> {_num(now)}%)"
    fell = f"coverage fell {_num(-delta)} points {span}"
    level: Literal["ok", "drop", "warn", "lock"] = "ok"
    if delta < lock:
        level, message = "lock", f"{fell}: explore mode locked; {_RESTORE}"
    elif delta < warn:
        level, message = "warn", f"{fell}: warning, commit allowed"
    elif delta < min_delta:
        changed = fell if delta < 0 else f"coverage changed by {_num(delta)} points {span}"
        level = "drop"
        message = (
            f"{changed}: below min_delta ({_num(min_delta)} points); commit allowed, "
            "with this notice on record"
        )
    elif delta > 0:
        message = f"coverage rose {_num(delta)} points {span}: commit allowed"
    elif delta < 0:
        message = f"{fell}: within min_delta ({_num(min_delta)} points), commit allowed"
    else:
        message = f"coverage unchanged at {_num(now)}%: commit allowed"
    return BudgetVerdict(level, before, now, delta, message)
