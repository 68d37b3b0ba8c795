"""The repository's tracked files, for tests that read the source (references, dangerous
calls, sizes): what a fresh clone has, not what a working tree happens to hold."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked(*patterns: str, skip: tuple[str, ...] = ()) -> list[Path]:
    """Tracked files matching git pathspecs ``patterns``, minus those under ``skip``."""
    out = subprocess.run(
        ["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines() if line and not line.startswith(skip)]
