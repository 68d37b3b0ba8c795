"""The report an environment build leaves in its image, read as untrusted input.

The build runs the repository's own install (its build backend, its ``setup.py``), and
that code can rewrite anything the build writes: ``env.json`` and the files under
``generated/`` (what the install made in the project, e.g. a version file, laid into
each test view).  So the host takes from the report only what has the expected shape:
typed fields, and generated files that are plain relative paths naming regular files
inside the extracted folder, reached through no link.  Everything else is dropped, with
a warning in the environment's record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints, ValidationError

from fluffy.errors import EnvironmentFailed, FluffyError
from fluffy.kernel.confined_files import plain_file, read_regular
from fluffy.safetext import visible

#: More than any real install makes; a longer list is the build's invention.
MAX_GENERATED = 1000
MAX_FIELD = 20_000
#: env.json of a large environment is a few hundred KiB.
MAX_REPORT_BYTES = 8 * 1024 * 1024
#: A name, a path or a warning.
Text = Annotated[str, StringConstraints(max_length=4096)]


class EnvReport(BaseModel):
    """``env.json`` as the host accepts it (unknown keys are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    packages: dict[Text, Text] = Field(default_factory=dict, max_length=MAX_FIELD)
    modules: list[Text] = Field(default_factory=list, max_length=MAX_FIELD)
    generated: list[Text] = Field(default_factory=list, max_length=MAX_FIELD)
    warnings: list[Text] = Field(default_factory=list, max_length=100)
    missing_build: list[Text] = Field(default_factory=list, max_length=100)
    project_installed: StrictBool = False
    python: str = Field(default="", max_length=40)


def read_report(folder: Path) -> dict[str, Any]:
    """The validated report in ``folder`` (env.json + generated/), generated files checked."""
    try:
        raw = read_regular(folder, "env.json", MAX_REPORT_BYTES)
        report = EnvReport.model_validate(json.loads(raw))
    except (OSError, ValueError, ValidationError, FluffyError) as exc:
        raise EnvironmentFailed(
            "the environment build left a report fluffy cannot use",
            why=f"its env.json is missing or malformed ({str(exc)[:300]}); the repository's "
            "install may have rewritten it",
            fix="Run `fluffy env build` again; if it persists, the project's setup code "
            "changes the build's report and its environment cannot be trusted.",
        ) from exc
    kept, dropped = checked_generated(folder / "generated", report.generated)
    warnings = [visible(w) for w in report.warnings]  # the build's words, shown as text
    if len(kept) >= MAX_GENERATED:
        warnings.append(f"the build named more than {MAX_GENERATED} generated files; the "
                        f"first {MAX_GENERATED} are used")  # fmt: skip
        dropped = [rel for rel in dropped if rel not in report.generated[MAX_GENERATED:]]
    if dropped:
        shown = ", ".join(repr(rel[:80]) for rel in dropped[:5])
        warnings.append(
            f"the build named {len(dropped)} generated file(s) that are not plain files in "
            f"its own folder; ignored: {shown}"
        )
    return {**report.model_dump(), "generated": kept, "warnings": warnings}


def checked_generated(root: Path, named: list[str]) -> tuple[list[str], list[str]]:
    """The named generated files that are safe to lay into a view, and the others."""
    kept: list[str] = []
    dropped: list[str] = []
    for rel in dict.fromkeys(named):
        if len(kept) < MAX_GENERATED and plain_file(root, rel):
            kept.append(rel)
        else:
            dropped.append(rel)
    return kept, dropped


def remove_links(root: Path) -> None:
    """Remove every symbolic link under ``root`` (nothing in a report needs one)."""
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            if path.is_symlink():
                path.unlink()
