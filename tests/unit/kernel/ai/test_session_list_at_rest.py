"""`fluffy session list` with no kernel running reads the stored sessions, read-only,
and starts no kernel."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fluffy.bootstrap.supervisor import paths
from fluffy.ipc.ai_types import Message, Usage
from fluffy.kernel.ai.conversation import ConversationStore
from fluffy.kernel.ai.memory import listed_sessions, sessions_at_rest
from fluffy.kernel.ai.usage import UsageLedger, upsert
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import WorkflowStore

pytestmark = pytest.mark.unit


async def _store_sessions(state: Path, project: Path) -> list[dict[str, object]]:
    """Two sessions as a kernel would leave them; what its session.list answered."""
    workflow_store = await WorkflowStore.open(state)
    conversations = await ConversationStore.open(state)
    try:
        workflow = Workflow(workflow_store, project)
        for task in ("Add error handling", "Rename the module"):
            session = await workflow.new_session()
            used = [upsert(session.id, "t1", "gpt-x", Usage(input_tokens=40, reported=True))]
            await conversations.append(session.id, [Message("user", task)], also=used)
        return await listed_sessions(
            workflow_store, conversations, UsageLedger(conversations.db), 20
        )
    finally:
        await conversations.close()
        await workflow_store.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_stored_sessions_read_without_a_kernel_and_without_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fluffy.cli import connect
    from fluffy.cli.main import main

    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("FLUFFY_HOME", str(home))
    state = paths(home, str(project.resolve()))["state"]
    state.mkdir(parents=True)
    by_kernel = asyncio.run(_store_sessions(state, project))
    assert [s["title"] for s in by_kernel] == ["Rename the module", "Add error handling"]
    before = _files(state)
    assert asyncio.run(sessions_at_rest(state, 20)) == by_kernel

    def no_kernel(*args: object, **kwargs: object) -> None:
        raise AssertionError("a listing must not start a kernel")

    monkeypatch.setattr(connect, "attached", no_kernel)
    assert main(["session", "list", "--json", "--project", str(project)]) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == by_kernel
    assert main(["session", "list", "--project", str(project)]) == 0
    assert "Rename the module" in capsys.readouterr().out
    assert _files(state) == before  # nothing created, changed or removed
    assert asyncio.run(sessions_at_rest(tmp_path / "never-started", 20)) == []


def test_a_crashed_kernel_s_log_is_read_too(tmp_path: Path) -> None:
    import shutil
    import sqlite3

    state, crashed = tmp_path / "state", tmp_path / "crashed"
    state.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    listed = asyncio.run(_store_sessions(state, project))
    writer = sqlite3.connect(state / "fluffy.db")  # a kernel's connection, then a crash:
    writer.execute("PRAGMA wal_autocheckpoint=0")  # its last commit only in the WAL
    writer.execute("UPDATE conversation_meta SET title = 'renamed at the end'")
    writer.commit()
    shutil.copytree(state, crashed)  # the files as the crash left them
    writer.close()
    assert (crashed / "fluffy.db-wal").stat().st_size > 0
    titles = [s["title"] for s in asyncio.run(sessions_at_rest(crashed, 20))]
    assert titles == ["renamed at the end"] * len(listed)
