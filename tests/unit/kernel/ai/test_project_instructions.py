"""The project's AGENTS.md / CLAUDE.md / .fluffy/instructions.md: read safely by the kernel,
capped, cleaned, framed in the system prompt, audited, and reported to /status."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from fluffy.errors import FluffyError
from fluffy.ipc.ai_types import Message
from fluffy.kernel.ai import instructions
from fluffy.kernel.ai.conversation import ConversationStore
from fluffy.kernel.ai.instructions import END, FRAME, MAX_TOTAL_BYTES, read_instructions
from fluffy.kernel.ai.memory import Memory
from fluffy.kernel.syscalls.ai import ai_methods
from fluffy.kernel.syscalls.assemble_ai import AiLayer
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from fluffy.settings import MIN_CONTEXT_WINDOW
from tests.unit.kernel.ai.test_ai_loop import _events, _script, run
from tests.unit.kernel.tools.test_tool_router import Harness

pytestmark = pytest.mark.unit


def test_the_files_are_read_in_order_with_sizes_and_digests(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("Use tabs.\n")
    (tmp_path / ".fluffy").mkdir()
    (tmp_path / ".fluffy" / "instructions.md").write_text("Run make test.\n")
    found = read_instructions(tmp_path)
    assert [f.path for f in found.files] == ["AGENTS.md", ".fluffy/instructions.md"]
    first = found.files[0]
    assert first.size == 10 and first.used == 10 and not first.truncated
    assert first.sha256 == hashlib.sha256(b"Use tabs.\n").hexdigest()
    section = found.section()
    assert section.index("--- AGENTS.md ---") < section.index("--- .fluffy/instructions.md ---")
    assert "Use tabs." in section and "Run make test." in section
    assert FRAME in section and section.endswith(END)
    assert len(found.digest) == 64


def test_no_files_means_no_section(tmp_path: Path) -> None:
    found = read_instructions(tmp_path)
    assert found.files == () and found.section() == "" and found.digest == ""


def test_the_total_is_capped_and_the_cut_is_said(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("a" * (MAX_TOTAL_BYTES - 100))
    (tmp_path / "CLAUDE.md").write_text("b" * 1000)
    found = read_instructions(tmp_path)
    agents, claude = found.files
    assert not agents.truncated and claude.truncated
    assert claude.size == 1000 and claude.used == 100
    assert found.truncated and found.view()["truncated"] is True
    section = found.section()
    assert "b" * 100 in section and "b" * 101 not in section
    assert "cut to 32768 bytes" in section and "CLAUDE.md is not shown" in section


def test_control_and_escape_characters_are_removed_and_secrets_redacted(tmp_path: Path) -> None:
    text = "Title\x1b]8;;http://evil\x07link\x1b[2J\u202eevil\u200b\r\n"
    text += "key sk-abcdefghijklmnopqrstuvwx\n"
    (tmp_path / "AGENTS.md").write_text(text)
    section = read_instructions(tmp_path).section()
    for bad in ("\x1b", "\x07", "\u202e", "\u200b", "\r", "sk-abcdefghijklmnop"):
        assert bad not in section
    assert "Title]8;;http://evillink[2Jevil\nkey [REDACTED:openai_key]" in section


def test_a_symlink_out_of_the_project_is_skipped_one_inside_is_read(tmp_path: Path) -> None:
    project, outside = tmp_path / "project", tmp_path / "secret.txt"
    project.mkdir()
    outside.write_text("the host's secret\n")
    (project / "AGENTS.md").symlink_to(outside)
    (project / "docs.md").write_text("inside\n")
    (project / "CLAUDE.md").symlink_to(project / "docs.md")
    found = read_instructions(project)
    agents, claude = found.files
    assert agents.skipped == "a symlink that leads outside the project"
    assert claude.skipped == "" and claude.size == 7
    assert "host's secret" not in found.section() and "inside" in found.section()


def test_a_linked_folder_out_of_the_project_is_skipped(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (elsewhere / "instructions.md").write_text("outside\n")
    (project / ".fluffy").symlink_to(elsewhere)
    (found,) = read_instructions(project).files
    assert found.skipped == "a symlink that leads outside the project"


def test_a_fifo_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "AGENTS.md")
    (found,) = read_instructions(tmp_path).files
    assert found.skipped == "not a regular file"


def test_the_section_fits_the_tokens_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("word " * 4000)
    found = read_instructions(tmp_path)
    cut = found.section(max_tokens=500)
    assert len(cut) <= 2000 and cut.endswith(END) and "cut to fit the context window" in cut


USER: Any = SimpleNamespace(binding="cli")
PLUGIN: Any = SimpleNamespace(binding="plugin")


def test_a_turn_carries_the_instructions_and_the_read_is_audited(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    (harness.project / "AGENTS.md").write_text("Always answer in French.\n")
    provider = _script(("Bonjour.", []))
    sent: list[list[Message]] = []

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> dict[str, Any]:
        original = ai.loop.memory.context

        async def watched(*args: Any, **kwargs: Any) -> list[Message]:
            messages = await original(*args, **kwargs)
            sent.append(messages)
            return messages

        ai.loop.memory.context = watched  # type: ignore[method-assign]
        await ai.loop.start(sid, "Say hello", provider)
        await _events(ai, sid)
        method = ai_methods(ai.loop)["session.instructions"]
        return await method(USER, {"session_id": sid})  # type: ignore[no-any-return]

    status = run(harness, body)
    system = sent[0][0]
    assert system.role == "system"
    assert "Always answer in French." in system.content and FRAME in system.content
    assert status["files"][0]["path"] == "AGENTS.md" and status["files"][0]["size"] == 25
    reads = harness.entries("project_instructions_read")
    assert len(reads) == 2  # the turn's read (kernel) and /status's (user)
    assert {r["caller"] for r in reads} == {"kernel", "user"}
    assert reads[0]["metadata"]["file:AGENTS.md"].startswith("size=25 used=25 sha256=")
    assert reads[0]["metadata"]["digest"] == status["digest"]


def test_only_the_user_asks_for_the_instructions(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> None:
        method = ai_methods(ai.loop)["session.instructions"]
        with pytest.raises(FluffyError, match="only the user"):
            await method(PLUGIN, {})

    run(harness, body)


def test_edits_count_from_the_next_turn(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    agents = harness.project / "AGENTS.md"
    agents.write_text("first version\n")
    sent: list[str] = []

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> None:
        original = ai.loop.memory.context

        async def watched(*args: Any, **kwargs: Any) -> list[Message]:
            messages = await original(*args, **kwargs)
            sent.append(messages[0].content)
            return messages

        ai.loop.memory.context = watched  # type: ignore[method-assign]
        await ai.loop.start(sid, "one", _script(("ok", [])))
        first = await _events(ai, sid)
        agents.write_text("second version\n")
        await ai.loop.start(sid, "two", _script(("ok", [])))
        after = first[-1]["seq"]
        for _ in range(30):
            # the events as the wire carries them (session.events)
            found = msgspec.to_builtins(await ai.loop.stream(sid).wait(after, 1.0))
            after = found[-1]["seq"] if found else after
            if any(e["type"] == "turn_end" for e in found):
                return
        raise AssertionError("the second turn did not end")

    run(harness, body)
    assert "first version" in sent[0] and "second version" in sent[-1]


@pytest.mark.parametrize(("window", "kept"), [(128_000, True), (MIN_CONTEXT_WINDOW, False)])
def test_the_instructions_are_paid_from_the_windows_spare_tokens(
    tmp_path: Path, window: int, kept: bool
) -> None:
    (tmp_path / "AGENTS.md").write_text("Keep functions short.\n" * 400)  # ~2,200 tokens
    found = read_instructions(tmp_path)

    async def main() -> list[Message]:
        store = await ConversationStore.open(tmp_path / "state")
        try:
            memory = Memory(store, context_window=window)
            await memory.append("s1", [Message("user", "hello")])
            return await memory.context(
                "s1", state="planning", mode="strict", tools=[], instructions=found
            )
        finally:
            await store.close()

    messages = asyncio.run(main())
    system = messages[0].content
    assert ("Keep functions short." in system) is kept
    assert messages[-1].content == "hello"  # the conversation still goes


def test_a_read_error_is_reported_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "AGENTS.md").write_text("unreadable\n")

    def broken(fd: int, size: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(instructions.os, "read", broken)
    (found,) = read_instructions(tmp_path).files
    assert found.skipped == "cannot be read: Input/output error"
