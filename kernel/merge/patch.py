"""Unified diffs: strict parsing and application, and generation for review.

A sandbox in patch mode writes one unified diff per changed file (``--- a/<path>`` /
``+++ b/<path>``, ``/dev/null`` for a new or deleted file, ``\\ No newline at end of
file`` markers).  :func:`apply_patch` applies it STRICTLY to an in-memory text: no fuzz,
no offset search -- every context and removed line must be found, byte for byte, at the
position its hunk states.  Lines are split on ``\\n`` only, so ``\\r`` (CRLF files) and
other control characters are ordinary line content.
"""

from __future__ import annotations

import difflib
import re

import msgspec

from fluffy.errors import PatchRejected

NO_NEWLINE = "\\ No newline at end of file"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(?: .*)?$")
_PREAMBLE = (
    "diff ",
    "index ",
    "new file mode ",
    "deleted file mode ",
    "old mode ",
    "new mode ",
    "similarity index ",
)
_MAX_SHOWN = 120


class HunkLine(msgspec.Struct, frozen=True):
    op: str  # " " context, "-" removed, "+" added
    text: str  # without the line's "\n"
    eol: bool  # False: the last line of its file, with no newline after it


class Hunk(msgspec.Struct, frozen=True):
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[HunkLine, ...]


class FilePatch(msgspec.Struct, frozen=True):
    """One file's patch; ``path`` is the project-relative path (no a/ or b/ prefix)."""

    path: str
    hunks: tuple[Hunk, ...]
    is_new: bool
    is_deleted: bool


def _rejected(path: str, what: str, fix: str | None = None) -> PatchRejected:
    return PatchRejected(f"patch for {path!r} rejected: {what}", fix=fix)


def _malformed(path: str, what: str) -> PatchRejected:
    return PatchRejected(
        f"patch for {path!r} is malformed: {what}",
        why="the output is not a well-formed unified diff",
        fix="Write a standard unified diff (--- a/<path>, +++ b/<path>, @@ hunks).",
    )


def _show(text: str) -> str:
    return repr(text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...")


def split_lines(text: str) -> list[tuple[str, bool]]:
    """``text`` as (line without "\\n", has "\\n") pairs; only the last may lack it."""
    if text == "":
        return []
    parts = text.split("\n")
    if parts[-1] == "":
        return [(part, True) for part in parts[:-1]]
    return [(part, True) for part in parts[:-1]] + [(parts[-1], False)]


def join_lines(lines: list[tuple[str, bool]]) -> str:
    return "".join(text + ("\n" if eol else "") for text, eol in lines)


def _header_path(line: str, marker: str, prefix: str, shown: str) -> str | None:
    value = line[len(marker) :].rstrip("\n").split("\t", 1)[0]
    if value == "/dev/null":
        return None
    if not value.startswith(prefix) or len(value) == len(prefix):
        raise _malformed(shown, f"header {line.rstrip()!r} does not start with {prefix!r}")
    return value[len(prefix) :]


def _lines_of(text: str) -> list[str]:
    """Patch text split after each "\\n" (the last element may lack it)."""
    if text == "":
        return []
    parts = text.split("\n")
    out = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _parse_hunk(lines: list[str], at: int, shown: str) -> tuple[Hunk, int]:
    header = lines[at].rstrip("\n")
    match = _HUNK.match(header)
    if match is None:
        raise _malformed(shown, f"bad hunk header {header!r}")
    old_start, new_start = int(match[1]), int(match[3])
    old_count = 1 if match[2] is None else int(match[2])
    new_count = 1 if match[4] is None else int(match[4])
    old_left, new_left = old_count, new_count
    body: list[HunkLine] = []
    at += 1
    while old_left > 0 or new_left > 0:
        if at >= len(lines):
            raise _malformed(shown, f"hunk {header!r} ends early")
        raw = lines[at]
        op, text = raw[:1], raw[1:].removesuffix("\n")
        if op == " ":
            old_left, new_left = old_left - 1, new_left - 1
        elif op == "-":
            old_left -= 1
        elif op == "+":
            new_left -= 1
        else:
            raise _malformed(shown, f"line {at + 1} of the patch is not part of hunk {header!r}")
        if old_left < 0 or new_left < 0:
            raise _malformed(shown, f"hunk {header!r} has more lines than its header says")
        at += 1
        eol = True
        if at < len(lines) and lines[at].startswith("\\"):
            if lines[at].rstrip("\n") != NO_NEWLINE:
                raise _malformed(shown, f"unknown marker {lines[at].rstrip()!r}")
            eol = False
            at += 1
        body.append(HunkLine(op, text, eol))
    return Hunk(old_start, old_count, new_start, new_count, tuple(body)), at


def parse_patch(text: str) -> list[FilePatch]:
    """Every file patch in ``text``; PatchRejected when anything is not unified diff."""
    lines = _lines_of(text)
    patches: list[FilePatch] = []
    at = 0
    while at < len(lines):
        line = lines[at]
        if line.startswith(_PREAMBLE):
            at += 1
            continue
        if not line.startswith("--- "):
            raise _malformed("?", f"line {at + 1} is {_show(line.rstrip())}, expected '--- '")
        if at + 1 >= len(lines) or not lines[at + 1].startswith("+++ "):
            raise _malformed("?", f"line {at + 1}: '--- ' is not followed by '+++ '")
        old = _header_path(line, "--- ", "a/", "?")
        new = _header_path(lines[at + 1], "+++ ", "b/", "?")
        if old is None and new is None:
            raise _malformed("/dev/null", "both sides are /dev/null")
        if old is not None and new is not None and old != new:
            raise _malformed(new, f"it renames {old!r} to {new!r} (renames are not supported)")
        path = new if new is not None else old
        assert path is not None
        at += 2
        hunks: list[Hunk] = []
        while at < len(lines) and lines[at].startswith("@@"):
            hunk, at = _parse_hunk(lines, at, path)
            hunks.append(hunk)
        if not hunks and old is not None and new is not None:
            raise _malformed(path, "it has no hunks")
        patches.append(FilePatch(path, tuple(hunks), old is None, new is None))
    if not patches:
        raise _malformed("?", "it contains no file patch")
    return patches


def apply_patch(patch: FilePatch, content: str | None) -> str | None:
    """``content`` with ``patch`` applied exactly; None when the patch deletes the file."""
    path = patch.path
    if patch.is_new and content is not None:
        raise _rejected(path, "it creates the file, which already exists")
    if not patch.is_new and content is None:
        raise _rejected(path, "the file does not exist", fix="Create it with a new-file patch.")
    old = split_lines(content or "")
    out: list[tuple[str, bool]] = []
    pos = 0
    for hunk in patch.hunks:
        start = hunk.old_start - 1 if hunk.old_count > 0 else hunk.old_start
        if start < pos or start > len(old):
            raise _rejected(
                path, f"hunk at line {hunk.old_start} is out of order or past the end of file"
            )
        out.extend(old[pos:start])
        new_at = len(out) + 1 if hunk.new_count > 0 else len(out)
        if new_at != hunk.new_start:
            raise _malformed(path, f"hunk at line {hunk.old_start} says new line {hunk.new_start}")
        at = start
        for line in hunk.lines:
            if line.op in " -":
                found = old[at] if at < len(old) else None
                if found != (line.text, line.eol):
                    raise _rejected(path, _mismatch(at + 1, line, found))
                at += 1
            if line.op in " +":
                out.append((line.text, line.eol))
        pos = at
    out.extend(old[pos:])
    if any(not eol for _, eol in out[:-1]):
        raise _rejected(path, "a line without newline is not the last line of the result")
    if patch.is_deleted:
        if out:
            raise _rejected(path, f"it deletes the file but leaves {len(out)} lines")
        return None
    return join_lines(out)


def _mismatch(number: int, line: HunkLine, found: tuple[str, bool] | None) -> str:
    if found is None:
        return f"line {number} is past the end of the file (expected {_show(line.text)})"
    if found[0] == line.text:
        return f"line {number} differs in its final newline ({_show(line.text)})"
    return f"line {number} is {_show(found[0])}, the patch expects {_show(line.text)}"


def parse_single(text: str, path: str) -> FilePatch:
    """The one file patch in ``text``, which must be for ``path`` (normalised)."""
    patches = parse_patch(text)
    if len(patches) != 1:
        raise _malformed(path, f"it holds {len(patches)} file patches, expected one")
    if patches[0].path != path:
        raise _rejected(
            path,
            f"the patch is for {patches[0].path!r}, the change names {path!r}",
            fix="Name the same path in the change list and in the patch headers.",
        )
    return patches[0]


def unified_diff(path: str, old: str | None, new: str | None, *, context: int = 3) -> str:
    """A unified diff from ``old`` to ``new`` (None: absent) that :func:`apply_patch` takes."""
    if old == new:
        return ""
    before = [text + ("\n" if eol else "") for text, eol in split_lines(old or "")]
    after = [text + ("\n" if eol else "") for text, eol in split_lines(new or "")]
    fromfile = "/dev/null" if old is None else f"a/{path}"
    tofile = "/dev/null" if new is None else f"b/{path}"
    out = [f"--- {fromfile}\n", f"+++ {tofile}\n"]
    body = difflib.unified_diff(before, after, n=context, lineterm="\n")
    for number, line in enumerate(body):
        if number < 2:  # difflib's own header lines
            continue
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n" + NO_NEWLINE + "\n")
    return "".join(out)


def count_diff_lines(text: str) -> int:
    """Added plus removed lines of a unified diff (hunks read by their counts)."""
    count = 0
    lines = _lines_of(text)
    at = 0
    while at < len(lines):
        match = _HUNK.match(lines[at].rstrip("\n"))
        at += 1
        if match is None:
            continue
        old_left = 1 if match[2] is None else int(match[2])
        new_left = 1 if match[4] is None else int(match[4])
        while (old_left > 0 or new_left > 0) and at < len(lines):
            op = lines[at][:1]
            if op == "-":
                old_left, count = old_left - 1, count + 1
            elif op == "+":
                new_left, count = new_left - 1, count + 1
            elif op == " ":
                old_left, new_left = old_left - 1, new_left - 1
            elif op != "\\":
                break
            at += 1
    return count
