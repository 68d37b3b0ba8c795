"""The record of what a session merged and has not committed (kernel/merge/landed.py):
a change is pending until its merge settles it, and the change and its pending mark are
one write, so a kill between them cannot leave either alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fluffy.kernel.merge.landed import Change, Landed

pytestmark = pytest.mark.unit


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_merge_keeps_what_it_wrote_and_takes_back_the_rest(tmp_path: Path) -> None:
    record = Landed(tmp_path / "s")
    record.add({"a.py": Change(sha(b"a\n"), b"a\n", b"a2\n")})
    record.settle(["a.py"])
    record.add({"a.py": Change(sha(b"a2\n"), b"a2\n", b"a3\n"), "b.py": Change(None, None, b"b")})
    assert record.unsettled()
    reopened = Landed(tmp_path / "s")  # a kernel killed here reads both, or neither
    assert reopened.unsettled() and len(reopened.paths()["a.py"]) == 2
    reopened.settle(["b.py"])  # the merge wrote b.py only
    assert reopened.paths() == {
        "a.py": [(sha(b"a\n"), sha(b"a2\n"))],
        "b.py": [(None, sha(b"b"))],
    }
    assert not reopened.unsettled() and reopened.blob(sha(b"a2\n")) == b"a2\n"
    reopened.settle([])  # nothing pending: nothing changes
    assert len(reopened.paths()) == 2


def test_a_damaged_hash_is_never_read_as_a_removal(tmp_path: Path) -> None:
    record = Landed(tmp_path / "s")
    record.add({"a.py": Change(None, None, b"x")})
    data = json.loads(record.index.read_text())
    data["changes"]["a.py"] = [[None, "not a hash"]]
    record.index.write_text(json.dumps(data))
    assert record.paths() == {"a.py": [(None, "")]}  # the git tool leaves it out
