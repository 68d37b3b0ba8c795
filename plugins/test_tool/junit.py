"""Test counts from a pytest JUnit XML report (for display; the kernel re-parses it).

The report is written by code under test, so it is untrusted: a document type or
entity declaration (the way to an entity-expansion bomb) is refused before parsing.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET  # declarations are refused before parsing

from fluffy.errors import ToolFailed

MAX_REPORT_BYTES = 64 * 1024 * 1024
EMPTY = {"found": 0, "run": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}


def junit_counts(data: bytes) -> dict[str, int]:
    """``{"found", "run", "passed", "failed", "errors", "skipped"}`` of a report."""
    if len(data) > MAX_REPORT_BYTES:
        raise ToolFailed(
            f"the JUnit report is over {MAX_REPORT_BYTES} bytes",
            fix="Run fewer tests at a time (paths, keyword).",
        )
    upper = data.upper()
    if b"<!DOCTYPE" in upper or b"<!ENTITY" in upper:
        raise ToolFailed(
            "the JUnit report declares a document type or entities",
            why="pytest never writes one: the tests tampered with their own report",
            fix="Find the test that writes junit.xml and stop it.",
        )
    try:
        root = ET.fromstring(data)  # noqa: S314 - no DTD, no entities (checked above)
    except ET.ParseError as exc:
        raise ToolFailed(
            f"the JUnit report is not valid XML: {exc}",
            fix="Check that no test writes to junit.xml; run the tests again.",
        ) from None
    counts = dict(EMPTY)
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            counts["failed"] += 1
        elif "error" in kinds:
            counts["errors"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
        counts["found"] += 1
    counts["run"] = counts["found"] - counts["skipped"]
    return counts
