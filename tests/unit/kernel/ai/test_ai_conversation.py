"""Conversation persistence on a real SQLite state database."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fluffy.errors import ConfigError, SessionNotFound
from fluffy.ipc.ai_types import Message, ProviderConfig, ToolCall
from fluffy.kernel.ai.conversation import DAY_MS, PINS_TOKENS, ConversationStore, title_of
from fluffy.kernel.audit.entry import now_ms
from fluffy.kernel.audit.store import db_path
from fluffy.kernel.workflow.store import WorkflowStore

pytestmark = pytest.mark.unit
T = TypeVar("T")


def with_store(state: Path, body: Callable[[ConversationStore], Awaitable[T]]) -> T:
    async def main() -> T:
        store = await ConversationStore.open(state)
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())


CALL = ToolCall(id="c1", name="fs.write", arguments={"path": "tests/test_a.py", "content": "x"})
HISTORY = [
    Message(role="user", content="Add error handling to parseConfig"),
    Message(role="assistant", content="Writing a test.", tool_calls=[CALL]),
    Message(role="tool", content='{"ok": true}', tool_call_id="c1", name="fs.write"),
    Message(role="assistant", content="Done."),
]


def test_messages_round_trip_in_order_across_connections(tmp_path: Path) -> None:
    async def write(store: ConversationStore) -> int:
        await store.append("s1", HISTORY[:2])
        return await store.append("s1", HISTORY[2:])

    assert with_store(tmp_path, write) == 4

    async def read(store: ConversationStore) -> tuple[list[Message], Any]:
        return await store.load("s1"), await store.meta("s1")

    loaded, meta = with_store(tmp_path, read)
    assert loaded == HISTORY
    assert meta.title == "Add error handling to parseConfig" and meta.turns == 1
    assert meta.messages == 4 and meta.summary == "" and meta.summarised_upto == 0
    with closing(sqlite3.connect(db_path(tmp_path))) as db:
        rows = db.execute("SELECT seq, role FROM conversation WHERE session_id = 's1' ORDER BY seq")
        assert list(rows) == [(0, "user"), (1, "assistant"), (2, "tool"), (3, "assistant")]


def test_shares_the_database_with_the_workflow_store(tmp_path: Path) -> None:
    async def body(store: ConversationStore) -> None:
        workflow = await WorkflowStore.open(tmp_path)
        try:
            await store.append("s1", HISTORY)
            assert await workflow.latest_session() is None  # its own tables, same file
        finally:
            await workflow.close()

    with_store(tmp_path, body)
    with closing(sqlite3.connect(db_path(tmp_path))) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"conversation", "conversation_meta", "conversation_archive", "sessions"} <= tables


def test_only_messages_are_accepted_never_a_provider_config(tmp_path: Path) -> None:
    config = ProviderConfig(name="openai", model="gpt-4o-mini", api_key="sk-" + "a" * 40)

    async def body(store: ConversationStore) -> list[Message]:
        with pytest.raises(TypeError, match="ProviderConfig"):
            await store.append("s1", [HISTORY[0], config])  # type: ignore[list-item]
        return await store.load("s1")

    assert with_store(tmp_path, body) == []  # nothing of the batch was written
    assert b"sk-aaaa" not in db_path(tmp_path).read_bytes()


def test_secrets_in_messages_are_redacted_before_they_are_stored(tmp_path: Path) -> None:
    key = "sk-proj-" + "b" * 40
    leaky = [
        Message(role="user", content=f"my key is {key}"),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="c", name="fs.write", arguments={"content": f"K={key}"})],
        ),
    ]

    async def body(store: ConversationStore) -> list[Message]:
        await store.append("s1", leaky)
        return await store.load("s1")

    loaded = with_store(tmp_path, body)
    assert key not in loaded[0].content and "[REDACTED" in loaded[0].content
    assert key not in str(loaded[1].tool_calls[0].arguments)
    for suffix in ("", "-wal"):
        path = Path(f"{db_path(tmp_path)}{suffix}")
        if path.exists():
            assert key.encode() not in path.read_bytes()


def test_title_is_the_first_user_message_cut_to_sixty_characters(tmp_path: Path) -> None:
    long = "Refactor the configuration loader so that it " + "really " * 20 + "works"
    assert len(title_of(long)) == 60 and title_of(long).endswith("...")
    assert title_of("  two\n lines ") == "two lines"

    async def body(store: ConversationStore) -> Any:
        await store.append("s1", [Message(role="assistant", content="hello")])
        await store.append("s1", [Message(role="user", content=long)])
        await store.append("s1", [Message(role="user", content="second")])
        return await store.meta("s1")

    meta = with_store(tmp_path, body)
    assert meta.title == title_of(long) and meta.turns == 2 and meta.messages == 3


def test_summary_covers_a_prefix_that_only_grows(tmp_path: Path) -> None:
    async def body(store: ConversationStore) -> Any:
        with pytest.raises(SessionNotFound):
            await store.set_summary("nobody", "x", 0)
        await store.append("s1", HISTORY)
        await store.set_summary("s1", "asked for error handling", 2)
        with pytest.raises(ValueError):
            await store.set_summary("s1", "older", 1)
        with pytest.raises(ValueError):
            await store.set_summary("s1", "beyond", 5)
        return await store.meta("s1")

    meta = with_store(tmp_path, body)
    assert (meta.summary, meta.summarised_upto) == ("asked for error handling", 2)


def test_pins_are_added_listed_removed_and_budgeted(tmp_path: Path) -> None:
    async def body(store: ConversationStore) -> list[str]:
        await store.append("s1", HISTORY)
        first = await store.add_pin("s1", "Use pytest, not unittest.")
        second = await store.add_pin("s1", "Never touch src/legacy.py")
        assert (first.id, second.id) == (1, 2)
        with pytest.raises(ConfigError, match="does not fit"):
            await store.add_pin("s1", "z" * (PINS_TOKENS * 4))
        with pytest.raises(ConfigError):
            await store.add_pin("s1", "   ")
        assert await store.remove_pin("s1", first.id)
        assert not await store.remove_pin("s1", first.id)
        return [pin.text for pin in await store.pins("s1")]

    assert with_store(tmp_path, body) == ["Never touch src/legacy.py"]


def test_sessions_are_listed_newest_first_with_a_limit(tmp_path: Path) -> None:
    async def body(store: ConversationStore) -> list[str]:
        for name in ("a", "b", "c"):
            await store.append(name, [Message(role="user", content=f"task {name}")])
        await store.append("a", [Message(role="assistant", content="more")])
        return [m.session_id for m in await store.list_sessions(limit=2)]

    assert with_store(tmp_path, body) == ["a", "c"]


def test_prune_archives_sessions_idle_for_thirty_days(tmp_path: Path) -> None:
    async def body(store: ConversationStore) -> None:
        await store.append("old", HISTORY)
        await store.append("new", HISTORY[:1])
        later = now_ms() + 31 * DAY_MS
        # "new" was last updated 31 days after "old": only "old" is idle for 30 days
        await store.db.execute(
            "UPDATE conversation_meta SET updated_at = ? WHERE session_id = 'new'", (later,)
        )
        await store.db.commit()
        assert await store.prune(later) == ["old"]
        assert await store.prune(later) == []  # idempotent
        listed = [m.session_id for m in await store.list_sessions()]
        assert listed == ["new"]
        everything = await store.list_sessions(include_archived=True)
        assert {m.session_id: m.archived for m in everything} == {"old": True, "new": False}
        assert await store.load("old") == HISTORY  # archived, not lost
        rows = await store.db.execute_fetchall(
            "SELECT COUNT(*) FROM conversation WHERE session_id = 'old'"
        )
        assert list(rows) == [(0,)]
        # continuing an archived session brings it back
        assert await store.append("old", [Message(role="user", content="again")]) == 5
        meta = await store.meta("old")
        assert meta is not None and not meta.archived and meta.turns == 2
        assert (await store.load("old"))[-1].content == "again"

    with_store(tmp_path, body)


def test_a_session_not_idle_long_enough_is_kept(tmp_path: Path) -> None:
    async def body(store: ConversationStore) -> list[str]:
        await store.append("s1", HISTORY)
        return await store.prune(now_ms() + 29 * DAY_MS)

    assert with_store(tmp_path, body) == []


def test_a_rounds_usage_commits_with_its_message_or_not_at_all(tmp_path: Path) -> None:
    from fluffy.ipc.ai_types import Usage
    from fluffy.kernel.ai.usage import UsageLedger, upsert

    used = Usage(input_tokens=120, output_tokens=8, reported=True)

    async def body(store: ConversationStore) -> tuple[list[Message], int, list[Message], int]:
        ledger = UsageLedger(store.db)
        assert await store.load("s1") == []  # loaded (and kept) before anything is written
        await store.append("s1", HISTORY[:1], also=[upsert("s1", "t1", "m", used)])
        ok = await store.load("s1"), (await ledger.session("s1"))[1].input_tokens
        broken = ("INSERT INTO no_such_table VALUES (?)", (1,))
        with pytest.raises(sqlite3.OperationalError):
            await store.append("s1", HISTORY[1:2], also=[upsert("s1", "t1", "m", used), broken])
        return *ok, await store.load("s1"), (await ledger.session("s1"))[1].input_tokens

    kept, tokens, after, tokens_after = with_store(tmp_path, body)
    assert kept == HISTORY[:1] and tokens == 120
    assert after == HISTORY[:1] and tokens_after == 120  # neither the message nor its usage
    assert with_store(tmp_path, lambda store: store.load("s1")) == HISTORY[:1]


def test_what_a_store_keeps_in_memory_follows_its_writes(tmp_path: Path) -> None:
    summary = ToolCall(id="c1", name="fs.write", arguments={"path": "tests/test_a.py"})

    async def body(store: ConversationStore) -> list[list[Message]]:
        seen = [await store.load("s1")]
        await store.append("s1", HISTORY[:2])
        seen.append(await store.load("s1"))
        assert await store.replace_calls("s1", {"c1": summary})
        seen.append(await store.load("s1"))
        await store.append("s1", HISTORY[2:])
        seen.append(await store.load("s1"))
        return seen

    empty, first, replaced, full = with_store(tmp_path, body)
    assert empty == [] and first == HISTORY[:2]
    assert replaced[1].tool_calls == [summary]
    assert full == [*replaced, *HISTORY[2:]]
    assert with_store(tmp_path, lambda store: store.load("s1")) == full  # as stored


def test_the_meta_a_store_keeps_is_what_its_writes_committed(tmp_path: Path) -> None:
    """A running session's meta is read every model round from what the store keeps:
    after each kind of write it is the row a fresh connection reads."""

    async def body(store: ConversationStore) -> list[tuple[Any, Any]]:
        fresh = await ConversationStore.open(tmp_path)
        pairs = []
        try:

            async def both() -> None:
                fresh._metas.clear()
                pairs.append((await store.meta("s1"), await fresh.meta("s1")))

            await store.append("s1", HISTORY[:2])
            await both()
            await store.append("s1", HISTORY[2:])
            await both()
            await store.set_summary("s1", "the first two", 2)
            await both()
            pin = await store.add_pin("s1", "keep the tests green")
            await both()
            assert await store.remove_pin("s1", pin.id)
            await both()
            assert await store.prune(now_ms() + 31 * DAY_MS) == ["s1"]
            await both()
            await store.append("s1", [Message(role="user", content="again")])
            await both()
        finally:
            await fresh.close()
        return pairs

    pairs = with_store(tmp_path, body)
    assert [kept for kept, _ in pairs] == [read for _, read in pairs]
    assert [kept.messages for kept, _ in pairs] == [2, 4, 4, 4, 4, 4, 5]
    assert pairs[2][0].summary == "the first two" and pairs[3][0].pins
    assert pairs[5][0].archived and not pairs[6][0].archived


def test_a_meta_read_overtaken_by_a_write_is_not_kept(tmp_path: Path) -> None:
    """A read queued before a write (which then commits, even for a caller that was
    cancelled) returns the row as it was: it is answered, never kept."""

    async def body(store: ConversationStore) -> tuple[Any, Any]:
        await store.append("s1", HISTORY[:2])
        store._metas.clear()
        reading = asyncio.ensure_future(store.meta("s1"))  # queued first
        await asyncio.sleep(0)
        writing = asyncio.ensure_future(store.append("s1", HISTORY[2:]))
        await asyncio.sleep(0)  # its trip to the database thread is queued
        writing.cancel()  # the caller gave up; the database thread still commits
        old = await reading
        with pytest.raises(asyncio.CancelledError):
            await writing
        await store.db.execute("SELECT 1")  # the append's trip has run by now
        return old, await store.meta("s1")

    old, now = with_store(tmp_path, body)
    assert old.messages in (2, 4)
    assert now.messages == 4  # read again: the stale row was not kept


KILLED_AFTER_APPEND = """
import asyncio, os, signal, sys
from pathlib import Path
from fluffy.ipc.ai_types import Message
from fluffy.kernel.ai.conversation import ConversationStore

async def main():
    store = await ConversationStore.open(Path(sys.argv[1]))
    await store.append("s1", [Message(role="user", content="kept through a kill")])
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no checkpoint

asyncio.run(main())
"""


def test_a_message_appended_survives_the_kernel_being_killed_right_after(tmp_path: Path) -> None:
    """The conversation's commits do not wait for the disk (the audit's next commit syncs
    the shared WAL, ADR-079): what an append returned is in the file for the next kernel,
    whatever becomes of the process; the audit connection still syncs every commit."""
    import subprocess
    import sys

    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_APPEND, str(state)], check=False)
    assert done.returncode == -9
    loaded = with_store(state, lambda store: store.load("s1"))
    assert [m.content for m in loaded] == ["kept through a kill"]

    async def synchronous() -> tuple[int, int]:
        from fluffy.kernel.audit.log import AuditLog

        store = await ConversationStore.open(state)
        audit = await AuditLog.open(state)
        try:
            (ours,) = await (await store.db.execute("PRAGMA synchronous")).fetchone()
            (audits,) = await (await audit.db.execute("PRAGMA synchronous")).fetchone()
            return int(ours), int(audits)
        finally:
            await audit.close()
            await store.close()

    assert asyncio.run(synchronous()) == (1, 2)  # NORMAL here, FULL for the audit log
