"""A review's changes, file by file, from its paths and one unified diff.

The kernel's ``review`` event names the changed files and carries the whole unified
diff; the CLI shows each file with its +/- counts and its part of the diff.
"""

from __future__ import annotations

from dataclasses import dataclass


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


def review_files(files: list[str], diff: str) -> list[FileDiff]:
    """A review's files (``files``, the whole ``diff``), each with its part of the diff."""
    sections = split_diff(diff)
    known = {section.path for section in sections}
    missing = [FileDiff(path, 0, 0, "") for path in files if path not in known]
    return sections + missing
