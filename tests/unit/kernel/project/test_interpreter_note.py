"""A test run names the interpreter when it is not the one the project asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluffy.kernel.project.interpreter import mismatch


@pytest.mark.parametrize(
    ("files", "running", "named"),
    [
        ({}, "3.11.2", False),
        ({".python-version": "3.11\n"}, "3.11.2", False),
        ({".python-version": "3.12\n"}, "3.11.2", True),
        ({".python-version": "3.11.7\n"}, "3.11.2", True),  # structlog's RecursionError case
        ({"pyproject.toml": "[project]\nrequires-python = '>=3.10'\n"}, "3.11.2", False),
        ({"pyproject.toml": "[project]\nrequires-python = '>=3.12'\n"}, "3.11.2", True),
        ({".python-version": "pypy3.10\n"}, "3.11.2", False),  # not a version: no claim
    ],
)
def test_a_mismatch_is_named_with_where_the_project_asks(
    tmp_path: Path, files: dict[str, str], running: str, named: bool
) -> None:
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    note = mismatch(tmp_path, running)
    assert (note is not None) is named
    if note:
        assert running in note and (".python-version" in note or "requires-python" in note)
