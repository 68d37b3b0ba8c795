"""A review's changes, file by file: from per-file entries or one unified diff.

The kernel may send ``files`` as ``[{path, added, removed, diff}]`` or as plain paths
with the whole unified diff in ``diff``; either way the CLI shows each file with its
+/- counts and its part of the diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class FileDiff:
    path: str
    added: int
    removed: int
    diff: str


def _path(header: str) -> str:
    name = header[4:].split("\t")[0].strip()
    return name[2:] if name[:2] in ("a/", "b/") else name


def _counts(lines: list[str]) -> tuple[int, int]:
    added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++ "))
    removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("--- "))
    return added, removed


def split_diff(diff: str) -> list[FileDiff]:
    """One section per file of a unified diff (``--- a/x`` / ``+++ b/x`` headers)."""
    lines = diff.splitlines()
    starts: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        nxt = lines[index + 1] if index + 1 < len(lines) else ""
        if line.startswith("--- ") and nxt.startswith("+++ "):
            new = _path(nxt)
            starts.append((index, _path(line) if new == "/dev/null" else new))
        elif line.startswith(("Binary files ", "Unreadable a/")):
            starts.append((index, line))
    sections: list[FileDiff] = []
    for number, (start, path) in enumerate(starts):
        end = starts[number + 1][0] if number + 1 < len(starts) else len(lines)
        body = lines[start:end]
        added, removed = _counts(body)
        sections.append(FileDiff(path, added, removed, "\n".join(body)))
    if not sections and lines:
        added, removed = _counts(lines)
        sections.append(FileDiff("(changes)", added, removed, diff))
    return sections


def review_files(event: dict[str, Any]) -> list[FileDiff]:
    """The files of a ``review`` event, whichever shape the kernel sent."""
    files = list(event.get("files") or [])
    if files and all(isinstance(item, dict) for item in files):
        return [
            FileDiff(
                str(item.get("path")),
                int(item.get("added") or 0),
                int(item.get("removed") or 0),
                str(item.get("diff") or ""),
            )
            for item in files
        ]
    sections = split_diff(str(event.get("diff") or ""))
    known = {section.path for section in sections}
    missing = [FileDiff(str(path), 0, 0, "") for path in files if str(path) not in known]
    return sections + missing
