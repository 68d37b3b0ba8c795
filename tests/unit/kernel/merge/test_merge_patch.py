"""Strict unified diffs: round trips, property test, and every kind of refusal."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fluffy.errors import PatchRejected
from fluffy.kernel.merge.patch import (
    apply_patch,
    count_diff_lines,
    parse_patch,
    parse_single,
    unified_diff,
)


def roundtrip(path: str, old: str | None, new: str | None) -> str | None:
    text = unified_diff(path, old, new)
    if old == new:
        assert text == ""
        return old
    return apply_patch(parse_single(text, path), old)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("a\nb\nc\n", "a\nB\nc\n"),
        ("a\nb\nc\n", "a\nb\nc\nd\n"),
        ("a\nb\nc\n", "b\nc\n"),
        (None, "new\nfile\n"),  # new file
        (None, ""),  # new empty file
        ("gone\n", None),  # deleted file
        ("", None),  # deleted empty file
        ("x\ny", "x\ny\n"),  # adds the final newline
        ("x\ny\n", "x\ny"),  # removes it
        ("x\ny", "x\nz"),  # no newline on either side
        ("one\r\ntwo\r\nthree\r\n", "one\r\nTWO\r\nthree\r\n"),  # CRLF
        ("one\r\ntwo", "one\r\ntwo\r\n"),
        ("mac\rline\n", "mac\rLINE\n"),  # a lone CR is line content
        ("form\x0cfeed\n\x1c\n", "form\x0cfeed\nsep\x1c\n"),  # not line breaks here
        ("-- a\n+++ b\n--- c\n", "--- c\n-- a\n@@ x\n"),  # lines that look like headers
    ],
)
def test_roundtrip(old: str | None, new: str | None) -> None:
    assert roundtrip("src/mod.py", old, new) == new


def test_roundtrip_many_hunks() -> None:
    old = "".join(f"line {i}\n" for i in range(200))
    new_lines = [f"line {i}\n" for i in range(200)]
    new_lines[5] = "changed 5\n"
    new_lines[100:102] = ["x\n"]
    new_lines.append("tail")
    new = "".join(new_lines)
    text = unified_diff("f.txt", old, new)
    assert text.count("@@ -") == 3
    assert roundtrip("f.txt", old, new) == new


def test_no_newline_marker_and_headers() -> None:
    text = unified_diff("a.txt", "x\ny", "x\nz")
    assert text.startswith("--- a/a.txt\n+++ b/a.txt\n")
    assert "\n\\ No newline at end of file\n" in text
    assert unified_diff("n.txt", None, "1\n").startswith("--- /dev/null\n+++ b/n.txt\n")
    assert unified_diff("d.txt", "1\n", None).startswith("--- a/d.txt\n+++ /dev/null\n")


def test_applies_patches_made_by_git(tmp_path: Path) -> None:
    """The parser takes git's own output (diff --git, index and mode lines)."""
    old = "alpha\nbeta\ngamma\n"
    new = "alpha\nBETA\ngamma\ndelta"
    (tmp_path / "a").write_text(old)
    (tmp_path / "b").write_text(new)
    out = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "a", "b"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    ).stdout
    assert out.startswith("diff --git")
    patch = parse_patch(out.replace("a/a", "a/f").replace("b/b", "b/f"))
    assert len(patch) == 1 and patch[0].path == "f"
    assert apply_patch(patch[0], old) == new


lines = st.lists(
    st.text(alphabet=st.sampled_from(list("ab -+\\@\r\t é\x00")), max_size=6), max_size=12
)


@st.composite
def texts(draw: st.DrawFn) -> str | None:
    if draw(st.booleans()) and draw(st.booleans()):
        return None
    body = "\n".join(draw(lines))
    return body + ("\n" if draw(st.booleans()) else "")


@settings(max_examples=400, deadline=None)
@given(texts(), texts())
def test_roundtrip_property(old: str | None, new: str | None) -> None:
    assert roundtrip("p/q.txt", old, new) == new


@settings(max_examples=300, deadline=None)
@given(texts(), texts(), st.data())
def test_any_touched_line_changed_is_refused(
    old: str | None, new: str | None, data: st.DataObject
) -> None:
    """Strictness: alter one line a hunk reads (context or removed) and it never applies."""
    assume(old is not None and old != new)
    assert old is not None
    patch = parse_single(unified_diff("f", old, new), "f")
    touched: list[int] = []
    for hunk in patch.hunks:
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        touched += range(start, start + hunk.old_count)
    assume(touched)
    index = data.draw(st.sampled_from(touched))
    lines = old.split("\n")
    lines[index] += "~"
    with pytest.raises(PatchRejected):
        apply_patch(patch, "\n".join(lines))


def test_count_diff_lines() -> None:
    text = unified_diff("f", "a\nb\nc\n", "a\nB\nc\nd\n") + unified_diff("g", None, "x\ny\n")
    assert count_diff_lines(text) == 2 + 1 + 2
    # removed lines that look like headers are still counted
    assert count_diff_lines(unified_diff("h", "-- x\n++ y\n", "")) == 2
    assert count_diff_lines("") == 0


# -- refusals -------------------------------------------------------------------------


def test_context_mismatch_names_file_and_line() -> None:
    patch = parse_single(unified_diff("src/a.py", "1\n2\n3\n4\n", "1\n2\nthree\n4\n"), "src/a.py")
    with pytest.raises(PatchRejected) as info:
        apply_patch(patch, "1\n2\nTHREE\n4\n")
    assert "src/a.py" in info.value.what
    assert "line 3" in info.value.what and "THREE" in info.value.what


def test_no_offset_search() -> None:
    """GNU patch would find the hunk one line lower; a strict apply refuses."""
    patch = parse_single(unified_diff("f", "a\nb\nc\n", "a\nX\nc\n"), "f")
    with pytest.raises(PatchRejected):
        apply_patch(patch, "new first line\na\nb\nc\n")


def test_no_fuzz_on_newline_at_eof() -> None:
    patch = parse_single(unified_diff("f", "a\nb\n", "a\nc\n"), "f")
    with pytest.raises(PatchRejected, match="final newline"):
        apply_patch(patch, "a\nb")


def test_crlf_must_match_exactly() -> None:
    patch = parse_single(unified_diff("f", "a\r\nb\r\n", "a\r\nc\r\n"), "f")
    with pytest.raises(PatchRejected):
        apply_patch(patch, "a\nb\n")


def test_new_file_patch_on_existing_file_and_edit_of_missing_file() -> None:
    with pytest.raises(PatchRejected, match="already exists"):
        apply_patch(parse_single(unified_diff("f", None, "x\n"), "f"), "")
    with pytest.raises(PatchRejected, match="does not exist"):
        apply_patch(parse_single(unified_diff("f", "x\n", "y\n"), "f"), None)


def test_delete_patch_must_remove_everything() -> None:
    patch = parse_single(unified_diff("f", "a\n", None), "f")
    with pytest.raises(PatchRejected):
        apply_patch(patch, "a\nb\n")


def test_path_mismatch() -> None:
    text = unified_diff("src/other.py", "a\n", "b\n")
    with pytest.raises(PatchRejected, match=r"src/other\.py"):
        parse_single(text, "src/a.py")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage\n",
        "--- a/f\n",  # no +++
        "--- a/f\n+++ b/g\n@@ -1 +1 @@\n-a\n+b\n",  # rename
        "--- a/f\n+++ b/f\n",  # no hunks
        "--- f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n",  # no a/ prefix
        "--- /dev/null\n+++ /dev/null\n",
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+b\n",  # hunk ends early
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n+c\n",  # more lines than the header says
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n\\ something else\n+b\n",
        "--- a/f\n+++ b/f\n@@ -x +1 @@\n-a\n+b\n",
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n*a\n+b\n",
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\ntrailing junk\n",
    ],
)
def test_malformed(text: str) -> None:
    with pytest.raises(PatchRejected):
        apply_patch(parse_single(text, "f"), "a\n")


def test_two_file_patches_for_one_change() -> None:
    text = unified_diff("f", "a\n", "b\n") + unified_diff("f", "b\n", "c\n")
    assert len(parse_patch(text)) == 2
    with pytest.raises(PatchRejected, match="expected one"):
        parse_single(text, "f")


def test_hunks_out_of_order_and_wrong_new_start() -> None:
    text = "--- a/f\n+++ b/f\n@@ -3 +3 @@\n-c\n+C\n@@ -1 +1 @@\n-a\n+A\n"
    with pytest.raises(PatchRejected, match="out of order"):
        apply_patch(parse_single(text, "f"), "a\nb\nc\n")
    text = "--- a/f\n+++ b/f\n@@ -2 +5 @@\n-b\n+B\n"
    with pytest.raises(PatchRejected, match="new line 5"):
        apply_patch(parse_single(text, "f"), "a\nb\nc\n")


def test_missing_newline_in_the_middle_is_refused() -> None:
    text = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+A\n\\ No newline at end of file\n b\n"
    with pytest.raises(PatchRejected):
        apply_patch(parse_single(text, "f"), "a\nb\n")
