"""Folders of files for tests: a project, a package, a tree to compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_tree(root: Path, files: dict[str, Any]) -> Path:
    """Write ``files`` (relative path -> text, bytes, or a JSON value such as a
    package.json's object) below ``root``, making the folders they need; returns ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
    return root
