"""A three-way merge of text, line by line (``git merge-file`` semantics, clean or not).

The person edited a file while the model worked on it: the model's change was made
against ``base`` (the file when the session first staged it), the project now holds
``ours`` (the person's), the staging area ``theirs`` (the model's).  Regions where both
kept ``base``'s lines are stable; between them, a side that changed nothing gives way
to the other, identical changes are taken once, and two different changes to the same
(or adjacent) lines are a conflict: nothing is merged and the caller shows both.

:func:`carry` is the same merge seen from the commit: the session's change carried onto
HEAD's file, so the person's uncommitted lines stay out of the AI's commit (the git
tool runs it in its sandbox; this module is standard library only and in the L2 images).
"""

from __future__ import annotations

from difflib import SequenceMatcher

Region = tuple[int, int, int, int, int, int]  # base, base_end, a, a_end, b, b_end


def _sync_regions(base: list[bytes], a: list[bytes], b: list[bytes]) -> list[Region]:
    """Stretches of ``base`` unchanged in both ``a`` and ``b`` (and where they are)."""
    ours = SequenceMatcher(None, base, a, autojunk=False).get_matching_blocks()
    theirs = SequenceMatcher(None, base, b, autojunk=False).get_matching_blocks()
    out: list[Region] = []
    i = j = 0
    while i < len(ours) and j < len(theirs):
        a_base, a_at, a_len = ours[i]
        b_base, b_at, b_len = theirs[j]
        start, end = max(a_base, b_base), min(a_base + a_len, b_base + b_len)
        if start < end:
            a_sub, b_sub = a_at + (start - a_base), b_at + (start - b_base)
            out.append((start, end, a_sub, a_sub + end - start, b_sub, b_sub + end - start))
        if a_base + a_len < b_base + b_len:
            i += 1
        else:
            j += 1
    out.append((len(base), len(base), len(a), len(a), len(b), len(b)))
    return out


def merge3(base: bytes, ours: bytes, theirs: bytes) -> bytes | None:
    """The merged text, or None when the two changes overlap (a conflict)."""
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    lines = [text.splitlines(keepends=True) for text in (base, ours, theirs)]
    z, a, b = lines
    merged: list[bytes] = []
    iz = ia = ib = 0
    for zs, ze, as_, ae, bs, be in _sync_regions(z, a, b):
        mine, other, was = a[ia:as_], b[ib:bs], z[iz:zs]
        if mine == other or other == was:
            merged += mine
        elif mine == was:
            merged += other
        else:
            return None
        merged += z[zs:ze]
        iz, ia, ib = ze, ae, be
    return b"".join(merged)


def carry(
    content: bytes | None, base: bytes | None, new: bytes | None
) -> tuple[bool, bytes | None]:
    """One change (``base`` -> ``new``; None: absent) carried onto ``content``.

    This is how a commit takes only the session's change: ``content`` is the committed
    file (HEAD's), ``base`` what the session's change was made against (the working tree,
    with whatever the person had not committed) and ``new`` the change.  Returns
    ``(True, result)``, or ``(False, None)`` when the change cannot be told apart from
    what ``content`` lacks (the two overlap).  A removal is carried whatever ``content``
    holds: the file is gone from the working tree too.
    """
    if new is None or content == base:
        return True, new
    if content == new:
        return True, content
    if content is None or base is None or any(map(is_binary, (content, base, new))):
        return False, None  # a binary file is never merged line by line
    merged = merge3(base, new, content)
    return (merged is not None), merged


def is_binary(data: bytes | None) -> bool:
    """Not text: a NUL byte, or not UTF-8 (the merge, its review and the commit's carry
    all use this one test)."""
    if data is None:
        return False
    if b"\x00" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
