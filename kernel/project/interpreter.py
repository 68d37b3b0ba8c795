"""Which Python the project asks for, beside the one its tests run with in the sandbox.

Fluffy's images carry Debian's Python (3.11 on bookworm); a project may ask for another
(``requires-python`` in pyproject.toml, ``.python-version``).  Nothing else can be had on
this machine without a download, so a test run names the mismatch instead of hiding it:
a RecursionError's wording or a deprecation that differs between versions is then read
for what it is.
"""

from __future__ import annotations

from pathlib import Path

from fluffy.kernel.project.files import read_text, read_toml, table


def asked_for(project: Path) -> tuple[str, str] | None:
    """(what the project asks for, where it says so), None when it says nothing."""
    pinned = (read_text(project, ".python-version", 4096) or "").strip().splitlines()
    if pinned and pinned[0].strip():
        return pinned[0].strip(), ".python-version"
    requires = table(read_toml(project, "pyproject.toml") or {}, "project").get("requires-python")
    if isinstance(requires, str) and requires.strip():
        return requires.strip(), "pyproject.toml requires-python"
    return None


def mismatch(project: Path, running: str) -> str | None:
    """A note when the sandbox's Python (``running``, e.g. "3.11.2") is not what the
    project asks for; None when it is (or the project says nothing)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    found = asked_for(project)
    if found is None or not running:
        return None
    asked, where = found
    try:
        have = Version(running)
    except InvalidVersion:
        return None
    try:
        if asked[:1].isdigit():  # .python-version: 3.12, 3.11.7, 3.12-dev
            want = Version(asked.split("-")[0])
            parts = len(want.release)
            fits = have.release[:parts] == want.release
        else:
            fits = SpecifierSet(asked).contains(have, prereleases=True)
    except (InvalidVersion, InvalidSpecifier):
        return None
    if fits:
        return None
    return (
        f"the tests ran with Python {running}; the project asks for {asked} ({where}), "
        "which this machine cannot provide: a failure that depends on the version (an "
        "error message's wording, a deprecation) may not be the code's"
    )
