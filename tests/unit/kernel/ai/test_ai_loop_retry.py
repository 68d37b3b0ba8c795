"""The session loop when a provider request fails: retries the user sees, cancellation
during a wait, and the context-length compaction (ADR-044).  Real kernel stack, the
scripted provider in a real ai_host child; the failures are injected at the kernel's
side of the sandbox (ProviderSession.request)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.errors import ContextTooLong, ProviderBusy
from fluffy.ipc.ai_types import Message
from fluffy.kernel.ai.provider import ProviderSession
from fluffy.kernel.syscalls.assemble_ai import AiLayer
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from tests.unit.kernel.ai.test_ai_loop import _events, _script, run
from tests.unit.kernel.tools.test_tool_router import Harness

pytestmark = pytest.mark.unit


def _inject(
    monkeypatch: pytest.MonkeyPatch,
    errors: list[Exception],
    *,
    at: int = 1,
    sent: list[list[Message]] | None = None,
) -> list[int]:
    """From request number ``at`` on, requests raise ``errors`` in order; the others run
    for real.  ``sent`` collects each request's messages."""
    real = ProviderSession.request
    calls = [0]

    async def request(self: ProviderSession, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if sent is not None:
            sent.append(list(args[1]))
        if calls[0] >= at and errors:
            raise errors.pop(0)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(ProviderSession, "request", request)
    return calls


def test_a_rate_limited_request_is_retried_and_the_user_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _inject(
        monkeypatch,
        [
            ProviderBusy(
                "the provider is rate limiting requests", kind="rate_limit", retry_after_s=4.0
            )
        ],
    )
    waits: list[float] = []

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[dict[str, Any]]:
        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        ai.loop.sleep = sleep
        await ai.loop.start(sid, "hello", _script(("Hello there.", [])))
        return await _events(ai, sid)

    events = run(Harness(tmp_path), body)
    (retry,) = [e for e in events if e["type"] == "retry"]
    assert retry["text"] == "rate limited, retrying in 4 s (attempt 2 of 5)"
    assert retry["restart"] is False
    assert waits == [4.0]
    assert calls[0] == 2
    assert events[-1]["status"] == "done" and events[-1]["text"] == "Hello there."


def test_cancelling_a_turn_that_waits_to_retry_ends_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inject(monkeypatch, [ProviderBusy("busy", kind="overloaded", retry_after_s=50.0)])

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> tuple[list[dict[str, Any]], float]:
        await ai.loop.start(sid, "hello", _script(("Hello there.", [])))
        seen: list[dict[str, Any]] = []
        after = 0
        while not any(e["type"] == "retry" for e in seen):
            # the events as the wire carries them (session.events)
            found = msgspec.to_builtins(await ai.loop.stream(sid).wait(after, 5.0))
            assert found, "no retry event came"
            seen += found
            after = found[-1]["seq"]
        started = time.monotonic()
        assert await ai.loop.cancel(sid)
        took = time.monotonic() - started
        return seen + await _events(ai, sid), took

    events, took = run(Harness(tmp_path), body)
    assert took < 5.0  # not the 50 s the provider asked for
    assert events[-1]["type"] == "turn_end" and events[-1]["status"] == "cancelled"


def test_retries_that_run_out_fail_the_turn_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _inject(monkeypatch, [ProviderBusy("the provider failed to answer", kind="server")] * 3)

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[dict[str, Any]]:
        async def sleep(seconds: float) -> None:
            await asyncio.sleep(0)

        ai.loop.sleep = sleep
        provider = msgspec.structs.replace(_script(("never", [])), max_retries=2)
        await ai.loop.start(sid, "hello", provider)
        return await _events(ai, sid)

    events = run(Harness(tmp_path), body)
    assert [e["attempt"] for e in events if e["type"] == "retry"] == [1, 2]
    end = events[-1]
    assert end["status"] == "failed"
    assert end["error"]["what"] == "the provider failed to answer (gave up after 3 attempt(s))"


READS = [("Reading.", [("fs.read", {"path": "/src/app.py"})])] * 4
TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"


def test_a_prompt_too_long_is_compacted_once_and_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[Message]] = []
    _inject(monkeypatch, [ContextTooLong("too long", why=TOO_LONG)], at=5, sent=sent)

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        await ai.loop.start(sid, "read it all", _script(*READS, ("Read enough.", [])))
        events = await _events(ai, sid)
        return events, await ai.store.meta(sid)

    events, meta = run(Harness(tmp_path), body)
    notices = [e for e in events if e["type"] == "notice"]
    assert [n["what"] for n in notices] == [
        "the conversation is too long for the model: compacting it and retrying once"
    ]
    assert notices[0]["why"] == TOO_LONG
    assert events[-1]["status"] == "done" and events[-1]["text"] == "Read enough."
    refused, compacted = sent[4], sent[5]
    assert len(compacted) < len(refused)  # older rounds left the window...
    assert meta.summarised_upto > 0 and meta.summary  # ...for the summary
    assert meta.summary in compacted[0].content  # the system prompt carries it


def test_a_prompt_still_too_long_after_compacting_fails_the_turn_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors: list[Exception] = [ContextTooLong("too long", why=TOO_LONG) for _ in range(2)]
    calls = _inject(monkeypatch, errors, at=3)

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[dict[str, Any]]:
        await ai.loop.start(sid, "read it all", _script(*READS))
        return await _events(ai, sid)

    events = run(Harness(tmp_path), body)
    end = events[-1]
    assert end["status"] == "failed"
    assert end["error"]["what"] == (
        "the conversation is too long for the model, even after compacting it"
    )
    assert end["error"]["code"] == "ai.context_too_long"
    assert "context_window" in end["error"]["fix"]
    assert calls[0] == 4  # two answered, then the refused one and its one compacted retry
