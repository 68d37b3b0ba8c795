"""Real git repositories for tests: git run with a fixed identity and no system config."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {
    "GIT_AUTHOR_NAME": "a",
    "GIT_AUTHOR_EMAIL": "a@example.invalid",
    "GIT_COMMITTER_NAME": "a",
    "GIT_COMMITTER_EMAIL": "a@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    """``git args`` in ``repo``: its output (bytes that are not UTF-8 kept as escapes)."""
    env = {**os.environ, "HOME": str(repo.parent), **IDENTITY}
    run = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, check=True)
    return run.stdout.decode("utf-8", "surrogateescape")
