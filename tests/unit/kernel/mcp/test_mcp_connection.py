"""The kernel's side of an MCP server, against a real stdio server process: the official
SDK's session over the sandbox's socket, the host that hands the socket to the server,
the end of a server (crash, refused peer), and the manager's lazy start, restart and
circuit breaker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import (
    CircuitOpen,
    McpServerFailed,
    ToolFailed,
    ToolInputInvalid,
    ToolNotFound,
)
from fluffy.kernel.mcp.connection import McpConnection
from fluffy.kernel.mcp.record import McpTool, save_record
from fluffy.kernel.mcp.results import result_dict
from fluffy.kernel.mcp.servers import McpServers, split_name, tool_specs
from fluffy.kernel.tools.routing.breaker import BreakerBoard
from tests.unit.mcp_support import fake_server

pytestmark = pytest.mark.timeout(60)


def test_a_session_lists_the_tools_and_calls_one(local_manager: Any) -> None:
    async def run() -> tuple[list[str], str, dict[str, Any]]:
        connection = McpConnection(local_manager, fake_server(), start_timeout_s=20)
        await connection.start()
        try:
            answer = await connection.call("echo", {"text": "hello"}, 10)
            return [t.name for t in connection.tools], connection.server_info, answer
        finally:
            await connection.close()

    tools, info, answer = asyncio.run(run())
    assert tools == ["echo", "connect", "interfaces", "fail", "crash", "fetch", "sleep"]
    assert info == "fluffy-test-server 1.0"
    assert answer == {"is_error": False, "content": [{"type": "text", "text": "hello"}]}
    assert local_manager.destroyed  # closing destroys the sandbox


def test_a_server_that_exits_mid_call_fails_the_call_with_its_exit_code(
    local_manager: Any,
) -> None:
    async def run() -> McpServerFailed:
        connection = McpConnection(local_manager, fake_server(), start_timeout_s=20)
        await connection.start()
        try:
            with pytest.raises(McpServerFailed) as caught:
                await connection.call("crash", {}, 10)
            assert not connection.alive
            with pytest.raises(McpServerFailed):  # and later calls fail at once
                await connection.call("echo", {"text": "x"}, 10)
            return caught.value
        finally:
            await connection.close()

    error = asyncio.run(run())
    assert "exited during the call" in error.what
    assert "exit code 3" in error.why


def test_a_command_that_does_not_exist_fails_the_start_with_the_reason(
    local_manager: Any,
) -> None:
    async def run() -> McpServerFailed:
        server = fake_server(command=["no-such-mcp-server-here"])
        connection = McpConnection(local_manager, server, start_timeout_s=20)
        with pytest.raises(McpServerFailed) as caught:
            await connection.start()
        return caught.value

    error = asyncio.run(run())
    assert "exited while starting" in error.what
    assert "cannot start no-such-mcp-server-here" in error.why
    assert "exit code 127" in error.why


def test_a_peer_of_another_uid_gets_no_session(
    local_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket admits the sandbox user only: here the host runs as another uid than
    the one allowed, so it is closed at once and the server never starts a session."""
    import fluffy.kernel.mcp.connection as connection_module

    real = connection_module.sandbox_socket_dir

    def other_uid(root: Path, name: str) -> tuple[Path, dict[str, Any]]:
        folder, options = real(root, name)
        return folder, {**options, "allowed_uids": frozenset({os.getuid() + 1})}

    monkeypatch.setattr(connection_module, "sandbox_socket_dir", other_uid)

    async def run() -> McpServerFailed:
        connection = McpConnection(local_manager, fake_server(), start_timeout_s=20)
        with pytest.raises(McpServerFailed) as caught:
            await connection.start()
        return caught.value

    assert "exited while starting" in asyncio.run(run()).what


def _intrude(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        try:
            sock.sendall(b'{"jsonrpc":"2.0","id":9,"method":"tools/list"}\n')
            return sock.recv(100)
        except (ConnectionResetError, BrokenPipeError):  # closed at once: refused
            return b""


def test_a_second_connection_is_refused_and_the_session_goes_on(local_manager: Any) -> None:
    async def run() -> bytes:
        connection = McpConnection(local_manager, fake_server(), start_timeout_s=20)
        await connection.start()
        assert connection.folder is not None
        try:
            got = await asyncio.to_thread(_intrude, connection.folder / "mcp.sock")
            answer = await connection.call("echo", {"text": "still here"}, 10)
            assert answer["content"][0]["text"] == "still here"
            return got
        finally:
            await connection.close()

    assert asyncio.run(run()) == b""


def test_result_content_is_kept_to_what_the_model_may_read() -> None:
    from mcp import types

    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="a"),
            types.ImageContent(type="image", data="AAAA", mime_type="image/png"),
        ],
        structured_content={"k": 1},
        is_error=True,
    )
    out = result_dict(result)
    assert out["is_error"] is True
    assert out["content"][0] == {"type": "text", "text": "a"}
    assert out["content"][1]["type"] == "image" and "data" not in out["content"][1]
    assert out["structured"] == {"k": 1}


def _servers(project: Path, manager: Any, **kwargs: Any) -> McpServers:
    save_record(project, fake_server("fake"))
    servers = McpServers(project, lambda: manager, start_timeout_s=20, **kwargs)
    servers.load()
    return servers


def test_the_manager_starts_a_server_on_its_first_call_and_restarts_it_after_a_crash(
    tmp_path: Path, local_manager: Any
) -> None:
    events: list[Any] = []
    servers = _servers(tmp_path, local_manager, record=events.append)
    assert not local_manager.created  # loading starts nothing

    async def run() -> None:
        try:
            first = await servers.call("mcp.fake.echo", {"text": "one"}, 10)
            assert first["content"][0]["text"] == "one"
            with pytest.raises(McpServerFailed):
                await servers.call("mcp.fake.crash", {}, 10)
            again = await servers.call("mcp.fake.echo", {"text": "two"}, 10)
            assert again["content"][0]["text"] == "two"
        finally:
            await servers.close()

    asyncio.run(run())
    assert len(local_manager.created) == 2
    kinds = [e.event_type for e in events]
    assert kinds == ["mcp_server_started", "mcp_server_failed", "mcp_server_started",
                     "mcp_server_stopped"]  # fmt: skip
    assert events[2].metadata["start"] == "2"
    assert "exit code 3" in events[1].metadata["why"]


def test_repeated_crashes_open_the_circuit(tmp_path: Path, local_manager: Any) -> None:
    board = BreakerBoard(threshold=2, cooldown_s=60)
    servers = _servers(tmp_path, local_manager, breakers=board)

    async def run() -> CircuitOpen:
        try:
            for _ in range(2):
                with pytest.raises(McpServerFailed):
                    await servers.call("mcp.fake.crash", {}, 10)
            with pytest.raises(CircuitOpen) as caught:
                await servers.call("mcp.fake.echo", {"text": "x"}, 10)
            return caught.value
        finally:
            await servers.close()

    error = asyncio.run(run())
    assert len(local_manager.created) == 2  # the open circuit started nothing more
    assert "mcp:fake" in error.what


def test_an_idle_server_is_stopped(tmp_path: Path, local_manager: Any) -> None:
    servers = _servers(tmp_path, local_manager, idle_s=0.2)

    async def run() -> None:
        try:
            await servers.call("mcp.fake.echo", {"text": "x"}, 10)
            assert servers.running
            for _ in range(100):
                if not servers.running:
                    break
                await asyncio.sleep(0.05)
            assert not servers.running
        finally:
            await servers.close()

    asyncio.run(run())
    assert local_manager.destroyed


def test_a_kernel_stop_during_an_idle_stop_still_removes_the_sandbox(
    tmp_path: Path, local_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the reaper is cancelled at kernel stop; a stop it had begun must still end
    # with the sandbox destroyed (a slow engine makes the window wide)
    destroy = local_manager.destroy

    def slow_destroy(sandbox: Any) -> Any:
        time.sleep(0.5)
        return destroy(sandbox)

    monkeypatch.setattr(local_manager, "destroy", slow_destroy)
    servers = _servers(tmp_path, local_manager, idle_s=0.1)

    async def run() -> None:
        await servers.call("mcp.fake.echo", {"text": "x"}, 10)
        for _ in range(100):
            if not servers.running:
                break
            await asyncio.sleep(0.02)
        assert not servers.running and not local_manager.destroyed  # the stop is under way
        await servers.close()

    asyncio.run(run())
    assert len(local_manager.destroyed) == 1


def test_arguments_are_checked_against_the_tool_schema_before_anything_runs(
    tmp_path: Path, local_manager: Any
) -> None:
    servers = _servers(tmp_path, local_manager)
    with pytest.raises(ToolInputInvalid) as caught:
        servers.check_arguments("mcp.fake.echo", {"text": 5})
    assert "text" in caught.value.what and "string" in caught.value.what
    with pytest.raises(ToolInputInvalid):
        servers.check_arguments("mcp.fake.echo", {})
    with pytest.raises(ToolNotFound):
        servers.check_arguments("mcp.fake.nothing", {})
    servers.check_arguments("mcp.fake.echo", {"text": "ok"})
    assert not local_manager.created


def test_tool_names_and_specs() -> None:
    assert split_name("mcp.git.log_entries") == ("git", "log_entries")
    with pytest.raises(ToolNotFound):
        split_name("mcp.git")
    specs = tool_specs(fake_server("fake"))
    assert [s.name for s in specs] == [
        "mcp.fake.echo",
        "mcp.fake.crash",
        "mcp.fake.sleep",
        "mcp.fake.fail",
    ]
    assert {s.kind for s in specs} == {"external"} and {s.route for s in specs} == {"mcp"}
    assert all("mcp" in s.tags and "third_party" in s.tags for s in specs)


def test_a_server_that_refuses_to_initialise_fails_with_the_reason(local_manager: Any) -> None:
    async def run() -> McpServerFailed:
        server = fake_server(command=[*fake_server().command, "--broken-init"])
        connection = McpConnection(local_manager, server, start_timeout_s=20)
        with pytest.raises(McpServerFailed) as caught:  # never an ExceptionGroup
            await connection.start()
        return caught.value

    error = asyncio.run(run())
    assert "did not initialise" in error.what
    assert "this server cannot start" in error.why and error.fix


def test_a_tool_error_leaves_the_server_running_and_the_circuit_closed(
    tmp_path: Path, local_manager: Any
) -> None:
    board = BreakerBoard(threshold=2, cooldown_s=60)
    servers = _servers(tmp_path, local_manager, breakers=board)

    async def run() -> None:
        try:
            for _ in range(3):
                with pytest.raises(ToolFailed) as caught:
                    await servers.call("mcp.fake.fail", {}, 10)
                assert "the arguments make no sense" in caught.value.what
            assert (await servers.call("mcp.fake.echo", {"text": "ok"}, 10))["content"]
        finally:
            await servers.close()

    asyncio.run(run())
    assert len(local_manager.created) == 1


def test_a_call_cancelled_while_it_waits_for_its_turn_is_not_counted_as_running(
    tmp_path: Path, local_manager: Any
) -> None:
    servers = _servers(tmp_path, local_manager)

    async def run() -> int:
        try:
            busy = [
                asyncio.ensure_future(servers.call("mcp.fake.sleep", {"seconds": 0.5}, 10))
                for _ in range(4)
            ]
            await asyncio.sleep(0.3 if servers.running else 0)
            while not servers.running:
                await asyncio.sleep(0.05)
            waiting = asyncio.ensure_future(servers.call("mcp.fake.echo", {"text": "x"}, 10))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await asyncio.gather(*busy, return_exceptions=True)
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            return next(iter(servers.running.values())).in_flight
        finally:
            await servers.close()

    assert asyncio.run(run()) == 0


def test_a_hostile_schema_pattern_cannot_stall_the_kernel(tmp_path: Path) -> None:
    """``^(a+)+$`` backtracks for hours in Python's re on 40 characters; the kernel's
    check runs RE2 (linear), and a schema with patternProperties is not used at all."""
    evil = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(a+)+$"}}}
    both = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}},
            "additionalProperties": False}  # fmt: skip
    tools = [McpTool(name="evil", input_schema=evil), McpTool(name="both", input_schema=both)]
    save_record(tmp_path, fake_server("bad", tools=tools))
    servers = McpServers(tmp_path, None)
    servers.load()
    started = time.perf_counter()
    with pytest.raises(ToolInputInvalid) as caught:
        servers.check_arguments("mcp.bad.evil", {"q": "a" * 40 + "!"})
    servers.check_arguments("mcp.bad.evil", {"q": "aaaa"})
    servers.check_arguments("mcp.bad.both", {"a" * 40 + "!": "x"})  # the server checks it
    assert time.perf_counter() - started < 1.0
    assert "does not match" in caught.value.what


def test_a_tool_whose_schema_is_no_json_schema_is_left_out(tmp_path: Path) -> None:
    from mcp import types

    from fluffy.kernel.mcp.results import usable_tools

    listed = [
        types.Tool(name="good", input_schema={"type": "object"}),
        types.Tool(name="broken", input_schema={"type": "object", "properties": 5}),
        types.Tool(name="bad.name", input_schema={"type": "object"}),
    ]
    tools, skipped = usable_tools(listed)
    assert [t.name for t in tools] == ["good"]
    assert set(skipped) == {"broken", "bad.name"} and "JSON schema" in skipped["broken"]


def test_a_server_sees_its_own_venv_first_and_may_read_a_project_of_another_uid() -> None:
    from fluffy.kernel.mcp.connection import server_environment

    env = server_environment(fake_server(env={"TZ": "UTC", "GIT_CONFIG_COUNT": "0"}))
    assert env["PATH"].startswith("/opt/mcp/venv/bin:") and env["HOME"] == "/tmp"
    assert env["TZ"] == "UTC" and env["GIT_CONFIG_COUNT"] == "0"  # the record's own wins
    default = server_environment(fake_server())
    assert (default["GIT_CONFIG_KEY_0"], default["GIT_CONFIG_VALUE_0"]) == ("safe.directory", "*")
