"""Modules of a few hundred lines, split by concern: every tracked source file of fluffy
(tests aside) stays at or under 500 lines, so a newcomer can read one in a sitting.
A file that grows past it fails here until it is split (CONTRIBUTING.md)."""

from __future__ import annotations

from tests.repo_files import ROOT, tracked

MAX_LINES = 500


def test_every_source_file_is_at_most_500_lines() -> None:
    sources = tracked("*.py", skip=("tests/", "docs/design/"))
    assert len(sources) > 250, "the tracked source files were not found"
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in sources
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"split these files (at most {MAX_LINES} lines each): {too_long}"
