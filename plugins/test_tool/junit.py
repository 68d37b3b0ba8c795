"""Test counts from a pytest JUnit XML report (for display; the kernel re-parses it).

The report is written by code under test, so it is untrusted: it is read by fluffy's one
JUnit reader (:func:`fluffy.junit.parse_junit`, which refuses document types, entity
declarations, oversized and malformed reports), as the kernel reads it.
"""

from __future__ import annotations

from fluffy.errors import EvidenceError, ToolFailed
from fluffy.junit import parse_junit
from fluffy.plugins.test_tool.canary import is_canary_name

EMPTY = {"found": 0, "run": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
_COUNTED = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}


def junit_counts(data: bytes, canary: str | None = None) -> dict[str, int]:
    """``{"found", "run", "passed", "failed", "errors", "skipped"}`` of a report, without
    the run's ``canary`` tests."""
    try:
        cases = parse_junit(data, name="the JUnit report")
    except EvidenceError as exc:
        raise ToolFailed(
            exc.what,
            why=exc.why,
            fix="Check that no test writes to junit.xml (or runs fewer tests at a time if "
            "it is too large), then run the tests again.",
        ) from None
    if canary is not None:
        cases = [c for c in cases if not is_canary_name(c.id.rpartition("::")[2], canary)]
    counts = dict(EMPTY)
    for case in cases:
        counts[_COUNTED[case.outcome]] += 1
    counts["found"] = len(cases)
    counts["run"] = counts["found"] - counts["skipped"]
    return counts
