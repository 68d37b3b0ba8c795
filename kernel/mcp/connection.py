"""One running MCP server: its sandbox, its socket, and the MCP client session.

The server runs in a long-lived ``mcp-server`` sandbox; :mod:`fluffy.sandboxes.
mcp_host` connects to this sandbox's own socket and makes the connection the server's
stdin and stdout, so the kernel speaks MCP's stdio transport (one JSON-RPC message per
line) with the server itself.  Only the sandbox user may connect (SO_PEERCRED), once.
A server with ``allowed_hosts`` also gets ``proxy.sock`` in its folder: a socket of the
kernel's CONNECT proxy narrowed to those hosts (and the policy's network_whitelist),
which the host turns into ``HTTP(S)_PROXY`` on the sandbox's loopback (its seccomp
profile is then ``standard-net``: IP sockets, on a sandbox whose only interface is
``lo``); a server without them has no way out at all.
The lines are the transport of the official ``mcp`` SDK's
:class:`~mcp.client.session.ClientSession` (the stream pair its stdio client builds), so
the protocol -- initialisation, version negotiation, ``tools/list``, ``tools/call`` --
is the SDK's, never a copy.

The session lives in a task of its own (anyio task groups end in the task that began
them); calls come from any task.  The server's end -- its connection closed -- fails
the calls in flight with :class:`McpServerFailed`, naming the sandbox's exit code and
the tail of its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.shared.message import SessionMessage

from fluffy.errors import FluffyError, McpServerFailed, ToolFailed, ToolTimeout
from fluffy.ipc.transport import peer_identity
from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.sandboxio import output_tail
from fluffy.kernel.containers.sandboxio import socket_dir as sandbox_socket_dir
from fluffy.kernel.mcp import PROXY_TAG
from fluffy.kernel.mcp.record import McpServer, McpTool
from fluffy.kernel.mcp.results import result_dict, usable_tools
from fluffy.kernel.net.allowlist import AllowList

log = logging.getLogger("fluffy.kernel.mcp")

START_TIMEOUT_S = 60.0
#: Largest message (one JSON-RPC line) read from a server.
MAX_LINE = 4 * 1024 * 1024
#: How often a running server's relay connection is looked at (a sandbox killed from
#: outside says nothing: its connection just goes).
WATCH_S = 0.5
SERVER_PATH = "/opt/mcp/venv/bin:/usr/local/bin:/usr/bin:/bin"
SERVER_DIR = "/opt/mcp/server"
#: fluffy's own interpreter: the server's venv comes first on the PATH it is given
HOST_COMMAND = ["/opt/fluffy/venv/bin/python3", "-I", "-m", "fluffy.sandboxes.mcp_host"]
#: The proxy's socket as the sandbox sees it (its folder is mounted at /run/fluffy).
PROXY_SOCKET = "/run/fluffy/proxy.sock"
#: Starts a proxy socket (path, tag, mode, owner, the server's hosts); returns its stop.
McpProxyStarter = Callable[
    [Path, str, int, "tuple[int, int] | None", AllowList], Awaitable[Callable[[], Awaitable[None]]]
]


def server_environment(server: McpServer) -> dict[str, str]:
    """What the server's process sees: its own venv first, a private HOME, its env."""
    return {
        # the project belongs to another uid than the sandbox's: git-based servers
        # (mcp-server-git) would refuse it as "dubious ownership" without this
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        **server.env,
        "PATH": SERVER_PATH,
        "HOME": "/tmp",  # noqa: S108 - the sandbox's own tmpfs
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


class _Session(ClientSession):
    """The SDK's session without its check of structured results against the tool's
    output schema: that schema is the server's (its patterns could stall the kernel's
    loop), and the kernel trusts no result anyway (it is sanitised and shown as data)."""

    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        return None


class McpConnection:
    """Start with :meth:`start`, call tools with :meth:`call`, end with :meth:`close`."""

    def __init__(
        self,
        manager: ContainerManager,
        server: McpServer,
        *,
        project: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        start_proxy: McpProxyStarter | None = None,
    ) -> None:
        self.manager = manager
        self.server = server
        self.project = project
        #: None: the server runs without network even if it has allowed_hosts (the probe
        #: of `fluffy mcp add` only lists tools)
        self.start_proxy = start_proxy
        self.stop_proxy: Callable[[], Awaitable[None]] | None = None
        self.start_timeout_s = start_timeout_s
        self.listener: asyncio.AbstractServer | None = None
        self.allowed_uid: int | None = None
        self.stream: asyncio.StreamWriter | None = None
        self.sandbox: Sandbox | None = None
        self.folder: Path | None = None
        self.session: ClientSession | None = None
        self.tools: list[McpTool] = []
        self.skipped: dict[str, str] = {}  # tools not offered, and why
        self.stopped_by = ""  # the kernel stopped it (not a crash): why
        self.server_info = ""
        self.started_at = 0.0
        self.start_ms = 0.0
        self.exit: tuple[int | None, str] | None = None  # (code, why) once it ended
        self._ended = asyncio.Event()
        self._attached = asyncio.Event()
        self._ready: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._read_send: Any = None
        self._write_recv: Any = None
        self._sandbox_id: str | None = None  # kept after the sandbox is gone

    @property
    def sandbox_id(self) -> str | None:
        return self.sandbox.sandbox_id if self.sandbox is not None else self._sandbox_id

    @property
    def alive(self) -> bool:
        return self.session is not None and not self._ended.is_set()

    # -- the server's side ----------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            peer = peer_identity(sock)
        except OSError:
            peer = None
        if self.stream is not None or peer is None or peer.uid != self.allowed_uid:
            log.warning("MCP server %s: refused a connection (%s)", self.server.name, peer)
            writer.close()
            return
        self.stream = writer
        self._attached.set()
        try:
            await self._read(reader)
        finally:
            self._end(None, "the server's connection closed (it exited)")
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while not self._ended.is_set():
            try:
                line = await reader.readline()
            except ValueError:  # over the limit: the stream cannot be resynchronised
                self._end(None, f"the server wrote a message over {MAX_LINE} bytes")
                return
            except ConnectionError:
                return
            if not line:
                return
            if not line.strip() or self._read_send is None:
                continue
            try:
                item: SessionMessage | Exception = SessionMessage(
                    types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                )
            except ValueError as exc:  # the session hands it to its message handler
                item = exc
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await self._read_send.send(item)

    def _end(self, code: int | None, why: str) -> None:
        if self.exit is None:
            self.exit = (code, why)
        self._ended.set()
        if self._read_send is not None:
            self._read_send.close()

    async def _writer(self) -> None:
        """The session's messages, one line each, to the server."""
        async with self._write_recv:
            async for message in self._write_recv:
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                stream = self.stream
                if stream is None or stream.is_closing():
                    self._end(None, "the server's connection is gone")
                    return
                stream.write(line.encode() + b"\n")
                try:
                    await stream.drain()
                except ConnectionError:
                    self._end(None, "the server's connection broke")
                    return

    async def _listen(self, folder: Path, options: dict[str, Any]) -> None:
        """Listen on mcp.sock in ``folder``, for the sandbox user only (bound under a
        temporary name, then renamed: a client never meets a socket not yet ready)."""
        path, staging = folder / "mcp.sock", folder / ".mcp.s"
        self.allowed_uid = next(iter(options["allowed_uids"]))
        self.listener = await asyncio.start_unix_server(
            self._accept, path=str(staging), limit=MAX_LINE
        )
        if options.get("owner") is not None:
            os.chown(staging, *options["owner"])
        staging.chmod(options["mode"])
        staging.replace(path)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        started = time.perf_counter()
        try:
            self.folder, options = sandbox_socket_dir(
                self.manager.root, f"mcp-{self.server.name}-{uuid.uuid4().hex[:8]}"
            )
            await self._listen(self.folder, options)
            hosts = self.server.hosts()
            if hosts is not None and self.start_proxy is not None:
                self.stop_proxy = await self.start_proxy(
                    self.folder / "proxy.sock",
                    PROXY_TAG + self.server.name,
                    options["mode"],
                    options.get("owner"),
                    hosts,
                )
            config = template_config(
                "mcp-server",
                plugin_name=f"mcp-{self.server.name}",
                image=self.server.image,
                project_dir=self.project,
                kernel_socket_dir=self.folder,
                environment=server_environment(self.server),
                # with the proxy: IP sockets, to reach the forwarder on the sandbox's
                # loopback (still --network none: lo is the only interface)
                **({"seccomp_profile": "standard-net"} if self.stop_proxy is not None else {}),
            )
            # a --path server starts in its folder; others in the project (read-only)
            cwd = SERVER_DIR if self.server.path else "/workspace" if self.project else "/tmp"  # noqa: S108
            proxy = ["--proxy", PROXY_SOCKET] if self.stop_proxy is not None else []
            command = [*HOST_COMMAND, "--cwd", cwd, *proxy, "--", *self.server.command]
            self.sandbox = await self._create(config, command)
            self._sandbox_id = self.sandbox.sandbox_id
            watch = asyncio.create_task(self._watch_start())
            try:
                await self._wait(self._attached.wait(), "did not connect to the kernel")
                self._ready = asyncio.get_running_loop().create_future()
                self._task = asyncio.create_task(self._run(), name=f"mcp-{self.server.name}")
                await self._wait(asyncio.shield(self._ready), "did not answer initialize")
            finally:
                watch.cancel()
        except BaseException:
            await asyncio.shield(self.close())
            raise
        self.started_at = time.time()
        self.start_ms = round((time.perf_counter() - started) * 1000, 1)

    async def _create(self, config: Any, command: list[str]) -> Sandbox:
        """The sandbox, made in a thread; if the start is cancelled meanwhile, the
        sandbox made after all is destroyed (never left running unowned)."""
        making = asyncio.ensure_future(asyncio.to_thread(self.manager.create, config, command))
        try:
            return await asyncio.shield(making)
        except asyncio.CancelledError:

            def late(done: asyncio.Future[Sandbox]) -> None:
                if not done.cancelled() and done.exception() is None:
                    made = done.result()
                    threading.Thread(target=self.manager.destroy, args=(made,), daemon=True).start()

            making.add_done_callback(late)
            raise

    async def _watch_start(self) -> None:
        """While starting: a sandbox that exits (a host that cannot start) ends the wait."""
        runtime = self.manager.runtime
        while self.sandbox is not None and self.sandbox.container_id:
            await asyncio.sleep(WATCH_S)
            try:
                state = await asyncio.to_thread(runtime.inspect, self.sandbox.container_id)
            except FluffyError:
                continue
            if state.status != "running":
                oom = " (out of memory)" if state.oom_killed else ""
                self._end(state.exit_code, f"the sandbox exited{oom}")
                return

    async def _wait(self, waiting: Any, what: str) -> None:
        ended = asyncio.ensure_future(self._ended.wait())
        task = asyncio.ensure_future(waiting)
        try:
            done, _ = await asyncio.wait(
                {task, ended}, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
            if not task.done():
                task.cancel()
        if task in done:
            task.result()  # a failed initialize raises here
            return
        code, why = self.exit or (None, "")
        said = "exited while starting" if self.exit else f"{what} within {self.start_timeout_s:g} s"
        raise McpServerFailed(
            f"the MCP server {self.server.name} {said}",
            why=await self._why(code, why),
            fix="Check the server's command and packages: run it once by hand, then "
            "`fluffy mcp add` it again.",
        )

    async def _why(self, code: int | None, why: str) -> str:
        """The exit code and the output's tail; a server whose connection just closed gets
        a moment to finish exiting (its last words are in the output)."""
        tail = ""
        if self.sandbox is not None and self.sandbox.container_id:
            container, runtime = self.sandbox.container_id, self.manager.runtime
            for _ in range(20):  # the server is the sandbox's process: its exit is the code
                try:
                    state = await asyncio.to_thread(runtime.inspect, container)
                except Exception:
                    break
                if state.status != "running":
                    code = state.exit_code if code is None else code
                    break
                await asyncio.sleep(0.05)
            tail = await asyncio.to_thread(output_tail, runtime, container)
        said = f"exit code {code}" if code is not None else "no exit code"
        return f"{said}; {why}; its output: {tail}" if why else f"{said}; its output: {tail}"

    async def _run(self) -> None:
        assert self._ready is not None
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](64)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](64)
        self._read_send, self._write_recv = read_send, write_recv
        writer = asyncio.create_task(self._writer())
        try:
            async with _Session(read_recv, write_send) as session:
                result = await session.initialize()
                listed = await session.list_tools()
                self.tools, self.skipped = usable_tools(listed.tools)
                info = result.server_info
                self.server_info = f"{info.name} {info.version}"[:200] if info else ""
                self.session = session
                self._ready.set_result(None)
                while not self._ended.is_set():
                    await self._ended.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(self._start_error(exc))
                self._ready.exception()  # retrieved: start() reports the end, not this
            if not isinstance(exc, Exception):
                raise
            log.info("MCP server %s: session ended: %s", self.server.name, exc)
        finally:
            self.session = None
            self._end(*(self.exit or (None, "the session ended")))
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer

    def _start_error(self, exc: BaseException) -> Exception:
        """What a failed initialise or tools/list is to the caller: never an
        ExceptionGroup of the SDK's task group, always the server's failure."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, FluffyError):
            return exc
        if not isinstance(exc, Exception):
            return McpServerFailed(f"the start of the MCP server {self.server.name} was cancelled")
        return McpServerFailed(
            f"the MCP server {self.server.name} did not initialise",
            why=f"{type(exc).__name__}: {str(exc)[:500]}",
            fix="Check that the command starts a stdio MCP server (it must answer "
            "initialize and tools/list on its standard output).",
        )

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """``tools/call``; the server's end fails it at once (the SDK fails the requests
        in flight when the connection closes)."""
        session = self.session
        if session is None or self._ended.is_set():
            raise await self.failure("is not running")
        try:
            result = await asyncio.wait_for(session.call_tool(tool, arguments), timeout_s)
        except TimeoutError:
            if self._ended.is_set():
                raise await self.failure("exited during the call") from None
            raise ToolTimeout(
                f"mcp.{self.server.name}.{tool} did not answer within {timeout_s:g} s",
                why="each MCP call has the tool call limit (tools.call_timeout in policy.yaml)",
                fix="Retry with less work, or raise the limit.",
            ) from None
        except FluffyError:
            raise
        except Exception as exc:  # an MCP error answer, or the connection's end
            if self._ended.is_set():
                raise await self.failure("exited during the call") from None
            # the server answered with an error: the tool failed, the server is fine
            raise ToolFailed(
                f"mcp.{self.server.name}.{tool} failed: {str(exc)[:300]}",
                why=f"the MCP server answered with an error ({type(exc).__name__})",
                fix="Check the arguments against the tool's schema and try again, or do "
                "something else.",
            ) from None
        return result_dict(result)

    async def failure(self, what: str) -> McpServerFailed:
        if self.stopped_by:  # the kernel ended it: nothing for the caller to fix
            return McpServerFailed(
                f"the MCP server {self.server.name} was stopped during the call",
                why=self.stopped_by,
                fix="Call the tool again: the server starts anew.",
            )
        code, why = self.exit or (None, "")
        return McpServerFailed(
            f"the MCP server {self.server.name} {what}",
            why=await self._why(code, why),
            fix="Call the tool again: the kernel starts the server anew (after repeated "
            "failures it waits a while first).",
        )

    async def close(self) -> None:
        self._end(*(self.exit or (None, "stopped by the kernel")))
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 5)
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            with contextlib.suppress(FluffyError):
                await asyncio.to_thread(self.manager.destroy, sandbox)
        if self.stream is not None:
            self.stream.close()
        if self.stop_proxy is not None:  # its tunnels are cut with the sandbox gone
            stop, self.stop_proxy = self.stop_proxy, None
            with contextlib.suppress(Exception):
                await stop()
        if self.listener is not None:
            self.listener.close()
            with contextlib.suppress(Exception):
                await self.listener.wait_closed()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
