"""A session's data is one typed struct, stored as canonical JSON and chained.

Sessions written before the struct (the dict layout: a field at its default written out,
an empty tree snapshot) still verify and load with the same meaning; a field whose type
the workflow never writes is refused with the fix, even when the chain vouches for it;
``annotate`` takes only declared fields, and ``None`` puts one back to its default.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.errors import WorkflowError
from fluffy.kernel.workflow.sessiondata import Exemption, PendingExemption, SessionData
from fluffy.kernel.workflow.store import digest
from unit.workflow_support import make_project, open_kit

pytestmark = pytest.mark.anyio


async def _stored_as(state: Path, project: Path, raw: dict[str, Any]) -> str:
    """A session in code_writing whose data is ``raw``, written and chained the way the
    kernel writes a session (its row, then a state_log note with the digest)."""
    kit = await open_kit(state, project)
    try:
        sid = (await kit.workflow.new_session()).id
        store = kit.store
        await store.db.execute(
            "UPDATE sessions SET state = 'code_writing', data = ? WHERE id = ?",
            (msgspec.json.encode(raw).decode(), sid),
        )
        note = {"session": digest(["strict", "code_writing", raw])}
        await store._append(sid, "migrated", "idle", "code_writing", "strict", note)
        await store.db.commit()
        return sid
    finally:
        await kit.close()


async def test_a_session_in_the_dict_layout_loads_with_the_same_meaning(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    raw = {
        "merge_approved": False,  # the dict layout wrote defaults out
        "runs_since": 0,
        "tests_base": {},  # an empty tree is a snapshot: not "none taken"
        "sources_base": {"src/calc.py": "ab" * 32},
        "exemption_pending": {"category": "documentation", "paths": ["README.md"],
                              "reason": "typo"},  # before requests had ids
    }  # fmt: skip
    sid = await _stored_as(tmp_path / "s", project, raw)
    kit = await open_kit(tmp_path / "s", project)
    try:
        session = await kit.workflow.get(sid)
        assert session.state == "code_writing"
        assert session.data.tests_base == {} and session.data.tests_base is not None
        assert session.data.sources_base == {"src/calc.py": "ab" * 32}
        assert session.data.exemption_pending == PendingExemption(
            category="documentation", paths=["README.md"], reason="typo", request_id=""
        )
        assert session.data.merge_approved is False and session.data.runs_since == 0
    finally:
        await kit.close()


@pytest.mark.parametrize(
    "raw",
    [{"quarantined": 5}, {"tests_base": ["a"]}, {"exemption": {"category": "docs"}}],
)
async def test_data_of_a_type_the_workflow_never_writes_is_refused(
    tmp_path: Path, raw: dict[str, Any]
) -> None:
    project = make_project(tmp_path / "p")
    sid = await _stored_as(tmp_path / "s", project, raw)
    kit = await open_kit(tmp_path / "s", project)
    try:
        with pytest.raises(WorkflowError, match="holds data the workflow never writes") as e:
            await kit.workflow.get(sid)
        assert e.value.why and e.value.fix and "new session" in e.value.fix
    finally:
        await kit.close()


async def test_annotate_sets_declared_fields_and_none_restores_the_default(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    try:
        sid = (await kit.workflow.new_session()).id
        noted = await kit.workflow.annotate(
            sid, "review_required", review_required=["conftest.py changed"], quarantined="x"
        )
        assert noted.data.review_required == ["conftest.py changed"]
        assert noted.data.quarantined == "x"
        cleared = await kit.workflow.annotate(sid, "cleared", review_required=None)
        assert cleared.data.review_required == [] and cleared.data.quarantined == "x"
        with pytest.raises(TypeError):
            await kit.workflow.annotate(sid, "typo", quarantine="x")  # type: ignore[call-arg]
        kit.store._sessions.clear()  # read back from the database, verified
        assert (await kit.workflow.get(sid)).data == cleared.data
    finally:
        await kit.close()
    stored = sqlite3.connect(tmp_path / "s" / "fluffy.db").execute(
        "SELECT data FROM sessions WHERE id = ?", (sid,)
    )
    assert msgspec.json.decode(stored.fetchone()[0]) == {"quarantined": "x"}  # defaults left out


def test_the_struct_encodes_as_the_dict_layout_did() -> None:
    data = SessionData(
        exemption=Exemption(category="documentation", paths=["README.md"], reason="typo"),
        runs_since=3,
        tests_base={},
    )
    assert msgspec.json.decode(msgspec.json.encode(data)) == {
        "exemption": {"category": "documentation", "paths": ["README.md"], "reason": "typo",
                      "condition": ""},
        "runs_since": 3,
        "tests_base": {},
    }  # fmt: skip
