"""The sandboxes' own sockets serve typed tables, checked before any handler runs.

On a real Unix socket, for each sandbox's socket: params of the wrong type or with an
unknown field are refused (``ipc.invalid_payload``, the field named), the handler never
runs, and the connection goes on to serve the next, well-formed call; a method of one
kind of sandbox is refused on any other socket (``ipc.peer_rejected``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

from fluffy.errors import InvalidPayload, PeerRejected
from fluffy.ipc.ai_types import StreamEvent, TextDelta
from fluffy.ipc.client import SyncClient
from fluffy.kernel.ai.provider import AI_SANDBOX, ProviderSession, _Job
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.policy.engine import Verdict
from fluffy.kernel.policy.extensions import POLICY_SANDBOX, ExtensionHost
from fluffy.sandboxes.policy_host import run_rules
from tests.unit.plugin_socket_support import plugin_call

pytestmark = pytest.mark.unit


PIECE = {"path": "a.txt", "offset": 0, "data": "eA=="}
PLUGIN_REFUSED = [
    (
        "tool.result",
        {"call_id": "c1", "ok": "yes", "result": {}},
        "tool.result: params.ok: expected `bool`, got `str`",
    ),
    (
        "tool.result",
        {"call_id": "c1", "ok": True, "result": {}, "extra": 1},
        "tool.result: params: unknown field extra",
    ),
    (
        "tool.files",
        {"call_id": "c1", "files": [{**PIECE, "offset": "0"}]},
        "tool.files: params.files[0].offset: expected `int`, got `str`",
    ),
    (
        "tool.files",
        {"call_id": "c1", "files": [{**PIECE, "mode": 0o755}]},
        "tool.files: params: unknown field files[0].mode",
    ),
    ("tool.next", {"wait": True}, "tool.next: params: unknown field wait"),
]


@pytest.mark.parametrize(("method", "params", "said"), PLUGIN_REFUSED)
def test_a_plugin_socket_decodes_params_strictly_before_its_handler_runs(
    tmp_path: Path, method: str, params: dict[str, Any], said: str
) -> None:
    async def main() -> dict[str, Any]:
        async with plugin_call(tmp_path, "tool:demo:c1") as (job, sock):

            def calls() -> None:
                with SyncClient(str(sock), plugin_name="demo") as host:
                    if method != "tool.next":
                        assert host.call("tool.next")["call_id"] == "c1"
                    with pytest.raises(InvalidPayload) as caught:
                        host.call(method, params)
                    assert caught.value.what == said
                    # nothing ran: no answer, no file, the call's files not refused
                    assert not job.future.done() and job.files_refused is None
                    assert job.handed is (method != "tool.next")
                    assert not (tmp_path / "out" / "c1").exists()
                    if method == "tool.next":  # the same connection is served on
                        assert host.call("tool.next")["call_id"] == "c1"
                    host.call("tool.files", {"call_id": "c1", "files": [PIECE]})
                    host.call("tool.result", {"call_id": "c1", "ok": True, "result": {}})

            await asyncio.to_thread(calls)
            return await asyncio.wait_for(job.future, 5)

    assert asyncio.run(main()) == {"call_id": "c1", "ok": True, "result": {}}
    assert (tmp_path / "out" / "c1" / "a.txt").read_bytes() == b"x"


def test_a_plugin_sockets_methods_are_refused_on_another_socket(tmp_path: Path) -> None:
    async def main() -> None:
        async with plugin_call(tmp_path, "cli") as (job, sock):

            def calls() -> None:
                with SyncClient(str(sock), plugin_name="demo") as client:
                    with pytest.raises(PeerRejected) as caught:
                        client.call("tool.next")
                    assert caught.value.what == (
                        "tool.next is served to a plugin sandbox on its own socket only"
                    )
                    assert "this connection is cli" in (caught.value.why or "")

            await asyncio.to_thread(calls)
            assert not job.waiting.is_set() and not job.handed  # the handler never ran

    asyncio.run(main())


@asynccontextmanager
async def ai_turn(
    tmp_path: Path, binding: str
) -> AsyncIterator[tuple[ProviderSession, _Job, list[StreamEvent], str]]:
    """A turn's socket with one job queued: (its session, the job, its events, the socket)."""
    session = ProviderSession(MagicMock(), binding, tmp_path)
    server = KernelServer(session.methods())
    seen: list[StreamEvent] = []

    async def on_event(event: StreamEvent) -> None:
        seen.append(event)

    job = _Job("j1", {"job_id": "j1", "messages": []}, on_event)
    await session.queue.put(job)
    sock = tmp_path / "ipc" / "kernel.sock"
    await server.listen(sock, binding=binding)
    try:
        yield session, job, seen, str(sock)
    finally:
        await server.close()


AI_REFUSED = [
    (
        "ai.event",
        {"job_id": "j1", "events": [{"type": "text_delta", "content": 5}]},
        "ai.event: params.events[0].content: expected `str`, got `int`",
    ),
    ("ai.event", {"job_id": 1, "events": []}, "ai.event: params.job_id: expected `str`, got `int`"),
    (
        "ai.result",
        {"job_id": "j1", "ok": True, "extra": 1},
        "ai.result: params: unknown field extra",
    ),
    (
        "ai.result",
        {"job_id": "j1", "ok": True, "response": {"text": ["hi"]}},
        "ai.result: params.response.text: expected `str`, got `array`",
    ),
]


@pytest.mark.parametrize(("method", "params", "said"), AI_REFUSED)
def test_an_ai_socket_decodes_params_strictly_before_its_handler_runs(
    tmp_path: Path, method: str, params: dict[str, Any], said: str
) -> None:
    async def main() -> tuple[Any, list[StreamEvent]]:
        async with ai_turn(tmp_path, AI_SANDBOX.binding("s1", "t1")) as (session, job, seen, sock):

            def calls() -> None:
                with SyncClient(sock, plugin_name="ai-provider") as host:
                    assert host.call("ai.next") == {"job_id": "j1", "messages": []}
                    with pytest.raises(InvalidPayload) as caught:
                        host.call(method, params)
                    assert caught.value.what == said
                    assert seen == [] and not job.future.done()  # nothing ran
                    assert session._answered_at is None
                    event = {"type": "text_delta", "content": "hi"}
                    host.call("ai.event", {"job_id": "j1", "events": [event]})
                    host.call("ai.result", {"job_id": "j1", "ok": True, "response": {"text": "hi"}})

            await asyncio.to_thread(calls)
            return await asyncio.wait_for(job.future, 5), seen

    reply, seen = asyncio.run(main())
    assert seen == [TextDelta("hi")]
    assert reply.ok is True and reply.response is not None and reply.response.text == "hi"


def test_an_ai_sockets_methods_are_refused_on_another_socket(tmp_path: Path) -> None:
    async def main() -> None:
        async with ai_turn(tmp_path, "tool:demo:c1") as (session, _, _, sock):

            def calls() -> None:
                with SyncClient(sock, plugin_name="demo") as client:
                    with pytest.raises(PeerRejected) as caught:
                        client.call("ai.next")
                    assert caught.value.what == (
                        "ai.next is served to the ai-provider sandbox on its own socket only"
                    )

            await asyncio.to_thread(calls)
            assert not session.connected.is_set() and session.current is None

    asyncio.run(main())


@asynccontextmanager
async def policy_job(
    tmp_path: Path, binding: str
) -> AsyncIterator[tuple[ExtensionHost, Future[list[Verdict]], str]]:
    """The policy sandbox's socket (its host not started: no container, no thread of its
    own) with job 1 queued: (the host, the job's future, the socket)."""
    host = ExtensionHost(MagicMock(), tmp_path)
    host.jobs, host._connected = asyncio.Queue(), asyncio.Event()
    future: Future[list[Verdict]] = Future()
    host.pending["1"] = future
    await host.jobs.put(("1", {"syscall": "fs.read"}))
    sock = tmp_path / "ipc" / "kernel.sock"
    await host.server.listen(sock, binding=binding)
    try:
        yield host, future, str(sock)
    finally:
        await host.server.close()
        host.loop.close()


POLICY_REFUSED = [
    (
        {"job": "1", "verdicts": [{"rule": "r", "vote": "maybe", "reason": ""}]},
        "policy.verdict: params.verdicts[0].vote: invalid enum value 'maybe'",
    ),
    ({"job": 1, "verdicts": []}, "policy.verdict: params.job: expected `str`, got `int`"),
    ({"job": "1", "verdicts": [], "extra": 1}, "policy.verdict: params: unknown field extra"),
]


@pytest.mark.parametrize(("params", "said"), POLICY_REFUSED)
def test_the_policy_socket_decodes_params_strictly_before_its_handler_runs(
    tmp_path: Path, params: dict[str, Any], said: str
) -> None:
    async def main() -> list[Verdict]:
        async with policy_job(tmp_path, POLICY_SANDBOX.binding()) as (_, future, sock):

            def calls() -> None:
                with SyncClient(sock, plugin_name="policy-sandbox") as host:
                    job = host.call("policy.next")
                    assert job == {"job": "1", "request": {"syscall": "fs.read"}}
                    with pytest.raises(InvalidPayload) as caught:
                        host.call("policy.verdict", params)
                    assert caught.value.what == said
                    assert not future.done()  # nothing ran
                    vote = {"rule": "r", "vote": "deny", "reason": "no"}
                    host.call("policy.verdict", {"job": "1", "verdicts": [vote]})

            await asyncio.to_thread(calls)
            return future.result(5)

    assert asyncio.run(main()) == [Verdict("ext:r", "extension", "deny", "no")]


def test_the_policy_sockets_methods_are_refused_on_another_socket(tmp_path: Path) -> None:
    async def main() -> None:
        async with policy_job(tmp_path, AI_SANDBOX.binding("s1", "t1")) as (host, _, sock):

            def calls() -> None:
                with SyncClient(sock, plugin_name="ai-provider") as client:
                    with pytest.raises(PeerRejected) as caught:
                        client.call("policy.next")
                    assert caught.value.what == (
                        "policy.next is served to the policy sandbox on its own socket only"
                    )

            await asyncio.to_thread(calls)
            assert host._connected is not None and not host._connected.is_set()

    asyncio.run(main())


def test_the_policy_hosts_own_answers_decode(tmp_path: Path) -> None:
    """What fluffy's policy host sends (votes, a rule that raises, one that returns junk)
    is what policy.verdict declares."""

    def crash(request: dict[str, Any]) -> Any:
        raise RuntimeError("boom")

    rules = [
        ("votes", lambda request: [{"vote": "allow", "reason": request["syscall"]}]),
        ("abstains", lambda request: None),
        ("crashes", crash),
        ("junk", lambda request: {"vote": "maybe"}),
    ]

    async def main() -> list[Verdict]:
        async with policy_job(tmp_path, POLICY_SANDBOX.binding()) as (_, future, sock):

            def calls() -> None:
                with SyncClient(sock, plugin_name="policy-sandbox") as host:
                    job = host.call("policy.next")
                    verdicts = run_rules(rules, job["request"])
                    host.call("policy.verdict", {"job": job["job"], "verdicts": verdicts})

            await asyncio.to_thread(calls)
            return future.result(5)

    votes = [(v.rule, v.vote) for v in asyncio.run(main())]
    assert votes == [("ext:votes", "allow"), ("ext:crashes", "deny"), ("ext:junk", "deny")]
