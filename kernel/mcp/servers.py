"""The kernel's MCP servers: their tools offered, each server started when first called.

The records (``.fluffy/mcp/*.json``) say which servers the project uses and which tools
each listed when it was added; those tools are offered to the model as
``mcp.NAME.TOOL`` with their JSON schemas without starting anything.  A server's
sandbox is started on its first call (lazily), kept while it is used, stopped after
``idle_s`` without calls and at kernel stop.  A server that exits or breaks is started
again on the next call; after ``threshold`` failures in a row its circuit opens and calls
are refused (with the reason and when it will be tried again) until the cool-down ends.

Only the router calls :meth:`McpServers.call` -- after the policy engine, and with the
sanitiser and the audit log after it -- so an MCP tool is a tool like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fluffy.errors import (
    EngineUnavailable,
    FluffyError,
    McpServerFailed,
    McpServerNotFound,
    ToolInputInvalid,
    ToolNotFound,
    ToolTimeout,
)
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.mcp.record import McpServer, load_records
from fluffy.kernel.mcp.schema import argument_errors, validator_for
from fluffy.kernel.tools.core.registry import ToolSpec
from fluffy.kernel.tools.routing.breaker import BreakerBoard

if TYPE_CHECKING:  # the MCP SDK loads with the first server, not with the kernel
    from fluffy.kernel.mcp.connection import McpConnection, McpProxyStarter

log = logging.getLogger("fluffy.kernel.mcp")

PREFIX = "mcp."
IDLE_S = 15 * 60.0
#: Calls one server runs at once (more wait their turn).
CONCURRENT_CALLS = 4
THRESHOLD = 3
COOLDOWN_S = 30.0
Record = Callable[[Event], Any]


def split_name(tool: str) -> tuple[str, str]:
    """``mcp.NAME.TOOL`` -> (NAME, TOOL)."""
    parts = tool.split(".", 2)
    if len(parts) != 3 or parts[0] != "mcp" or not parts[1] or not parts[2]:
        raise ToolNotFound(f"{tool!r} is not an MCP tool name (mcp.SERVER.TOOL)")
    return parts[1], parts[2]


def tool_specs(server: McpServer) -> list[ToolSpec]:
    specs = []
    for tool in server.tools:
        note = f"[MCP server {server.name}: runs in its own sandbox, may read the project, changes none of it] "  # noqa: E501
        specs.append(
            ToolSpec(
                name=f"{PREFIX}{server.name}.{tool.name}",
                kind="external",
                route="mcp",
                description=note + tool.description,
                input_schema=tool.input_schema,
                plugin=f"mcp-{server.name}",
                template="mcp-server",
                tags=frozenset({"mcp", "third_party"}),
            )
        )
    return specs


class _Running:
    def __init__(self, connection: McpConnection) -> None:
        self.connection = connection
        self.last_used = time.monotonic()
        self.calls = asyncio.Semaphore(CONCURRENT_CALLS)
        self.in_flight = 0


class McpServers:
    def __init__(
        self,
        project: Path,
        manager: Callable[[], ContainerManager] | None,
        *,
        record: Record | None = None,
        idle_s: float = IDLE_S,
        breakers: BreakerBoard | None = None,
        start_timeout_s: float | None = None,
    ) -> None:
        self.project = project
        self.manager = manager
        self.record = record
        self.idle_s = idle_s
        self.breakers = breakers or BreakerBoard(threshold=THRESHOLD, cooldown_s=COOLDOWN_S)
        self.start_timeout_s = start_timeout_s
        #: the kernel's CONNECT proxy, for servers with allowed_hosts (set once the AI
        #: layer, which owns the proxy, is assembled); None: they run without network
        self.start_proxy: McpProxyStarter | None = None
        self.servers: dict[str, McpServer] = {}
        self.problems: dict[str, str] = {}
        self.running: dict[str, _Running] = {}
        self.starts: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._validators: dict[str, Any] = {}
        self._reaper: asyncio.Task[None] | None = None
        #: connections being closed: a close runs to its end even when its caller is
        #: cancelled (the reaper at kernel stop), and close() waits for them all
        self._closing: set[asyncio.Task[None]] = set()
        #: a start that failed, and when (calls that waited for it fail with it)
        self._start_failed: dict[str, tuple[float, McpServerFailed]] = {}

    # -- the records ---------------------------------------------------------------------
    def load(self) -> list[ToolSpec]:
        """Read the records; the tools they offer (a record that does not load: none)."""
        self.servers, self.problems = load_records(self.project)
        self._validators.clear()
        for name, problem in self.problems.items():
            log.warning("MCP server record %s not loaded: %s", name, problem)
        return [spec for server in self.servers.values() for spec in tool_specs(server)]

    async def reload(self) -> tuple[list[ToolSpec], list[str], list[str]]:
        """Read the records again; stop servers removed or changed.  (specs, stopped,
        changed: every server whose record is new, different or gone)."""
        before = dict(self.servers)
        specs = self.load()
        changed = sorted(
            n for n in {*before, *self.servers} if before.get(n) != self.servers.get(n)
        )
        stopped = []
        for name in list(self.running):
            if name in changed:
                await self.stop(name, "its registration changed")
                stopped.append(name)
        for name in changed:
            self._start_failed.pop(name, None)
        return specs, stopped, changed

    # -- calling -------------------------------------------------------------------------
    def check_arguments(self, tool: str, args: Any) -> None:
        """The arguments against the tool's schema, before policy or the server see them
        (in linear time: :mod:`fluffy.kernel.mcp.schema`)."""
        if not isinstance(args, dict):
            raise ToolInputInvalid(f"{tool}: arguments must be an object")
        name, short = split_name(tool)
        server = self.servers.get(name)
        found = next((t for t in server.tools if t.name == short), None) if server else None
        if found is None:
            raise ToolNotFound(f"there is no MCP tool {tool!r}")
        if tool not in self._validators:
            self._validators[tool] = validator_for(found.input_schema)
        validator = self._validators[tool]
        errors = argument_errors(validator, args) if validator is not None else []
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.path) or "(the arguments)"
            raise ToolInputInvalid(
                f"{tool}: {where}: {first.message[:300]}",
                why=f"{len(errors)} problem(s) against the tool's input schema",
                fix="Call it again with arguments that match its schema.",
            )

    async def call(self, tool: str, args: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        name, short = split_name(tool)
        if name not in self.servers:
            raise McpServerNotFound(
                f"there is no MCP server {name!r} in this project",
                why="the tool's name starts with a server that has no .fluffy/mcp/ record",
            )
        ticket = self.breakers.before(f"mcp:{name}")
        running: _Running | None = None
        try:
            running = await self._running(name)
            running.in_flight += 1
            try:
                async with running.calls:
                    running.last_used = time.monotonic()
                    if short not in {t.name for t in running.connection.tools}:
                        raise ToolNotFound(
                            f"the MCP server {name} no longer lists {short}",
                            fix="Ask the user to add the server again (`fluffy mcp add`) "
                            "to refresh its tools.",
                        )
                    result = await running.connection.call(short, args, timeout_s)
            finally:
                running.last_used = time.monotonic()
                running.in_flight -= 1
        except McpServerFailed as exc:
            self.breakers.failure(ticket, exc)
            if running is not None:
                await self._failed(name, running, exc)
            raise
        except ToolTimeout as exc:  # a server that hangs is started anew for the next call
            self.breakers.failure(ticket, exc)
            if running is not None:
                await self._stop(name, running, "a call timed out")
            raise
        except BaseException:  # the tool said no, or the caller gave up: the server is fine
            self.breakers.release(ticket)
            raise
        self.breakers.success(ticket)
        return result

    def sandbox_of(self, tool: str) -> str | None:
        """The sandbox id of the running server behind ``tool`` (mcp.NAME.TOOL)."""
        running = self.running.get(split_name(tool)[0])
        return running.connection.sandbox_id if running is not None else None

    async def _running(self, name: str) -> _Running:
        running = self.running.get(name)
        if running is not None and running.connection.alive:
            return running
        waited = time.monotonic()
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            running = self.running.get(name)
            if running is not None and running.connection.alive:
                return running
            failed = self._start_failed.get(name)
            if failed is not None and failed[0] >= waited:
                raise failed[1]  # it failed while this call waited: no second try now
            if running is not None:  # it ended: say so, then start it again
                await self._failed(name, running, await running.connection.failure("had exited"))
            try:
                return await self._start(name)
            except McpServerFailed as exc:
                self._start_failed[name] = (time.monotonic(), exc)
                said = {"exit_code": "", "why": exc.why[:400], "when": "starting"}
                self._audit("mcp_server_failed", name, exc.what, None, said)
                raise

    async def _start(self, name: str) -> _Running:
        if self.manager is None:
            raise EngineUnavailable(
                f"the MCP server {name} needs a sandbox, and this kernel has no engine",
                fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
            )
        manager = await asyncio.to_thread(self.manager)
        server = self.servers[name]
        kwargs = {} if self.start_timeout_s is None else {"start_timeout_s": self.start_timeout_s}
        from fluffy.kernel.mcp.connection import McpConnection

        connection = McpConnection(
            manager, server, project=self.project, start_proxy=self.start_proxy, **kwargs
        )
        if server.allowed_hosts and self.start_proxy is None:
            log.warning("MCP server %s: no proxy in this kernel, it runs without network", name)
        await connection.start()
        if self.servers.get(name) is not server:  # reloaded meanwhile: not this record
            await connection.close()
            raise McpServerFailed(
                f"the MCP server {name} was changed or removed while it started",
                why="its record was read again (fluffy mcp add or remove)",
                fix="Call the tool again if it is still offered.",
            )
        running = _Running(connection)
        self.running[name] = running
        self.starts[name] = self.starts.get(name, 0) + 1
        listed = sorted(t.name for t in connection.tools)
        recorded = sorted(t.name for t in server.tools)
        self._audit(
            "mcp_server_started",
            name,
            f"MCP server {name} started ({connection.start_ms:.0f} ms, {len(listed)} tools)",
            connection.sandbox_id,
            {
                "image": server.image,
                "start": str(self.starts[name]),
                "start_ms": str(connection.start_ms),
                "tools": ",".join(listed)[:400],
                "tools_changed": "yes" if listed != recorded else "no",
                "server_info": connection.server_info,
                "allowed_hosts": ",".join(server.allowed_hosts)[:400]
                if connection.stop_proxy is not None
                else "",
            },
        )
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="mcp-idle")
        return running

    def _take(self, name: str, running: _Running) -> bool:
        """Forget ``running`` if it is still the server's (a newer one is left alone)."""
        if self.running.get(name) is running:
            del self.running[name]
            return True
        return False

    async def _failed(self, name: str, running: _Running, exc: FluffyError) -> None:
        if not self._take(name, running):
            return
        code = running.connection.exit[0] if running.connection.exit else None
        sandbox_id = running.connection.sandbox_id
        await self._close(running)
        self._audit(
            "mcp_server_failed", name, exc.what, sandbox_id,
            {"exit_code": str(code), "why": exc.why[:400]},
        )  # fmt: skip

    async def stop(self, name: str, reason: str) -> None:
        running = self.running.get(name)
        if running is not None:
            await self._stop(name, running, reason)

    async def _stop(self, name: str, running: _Running, reason: str) -> None:
        if not self._take(name, running):
            return
        sandbox_id = running.connection.sandbox_id
        running.connection.stopped_by = reason
        await self._close(running)
        self._audit(
            "mcp_server_stopped", name, f"MCP server {name} stopped: {reason}",
            sandbox_id, {"reason": reason},
        )  # fmt: skip

    async def _close(self, running: _Running) -> None:
        task = asyncio.create_task(running.connection.close(), name="mcp-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        await asyncio.shield(task)

    async def _reap(self) -> None:
        while self.running:
            await asyncio.sleep(min(30.0, max(self.idle_s / 4, 0.05)))
            now = time.monotonic()
            for name, running in list(self.running.items()):
                if not running.in_flight and now - running.last_used > self.idle_s:
                    await self.stop(name, f"idle for {self.idle_s:g} s")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for name in list(self.running):
            await self.stop(name, "the kernel stopped")
        if self._closing:  # a stop the reaper began finishes before the kernel goes
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- what the user sees --------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        rows = []
        for name, server in sorted(self.servers.items()):
            running = self.running.get(name)
            breaker = self.breakers.breaker(f"mcp:{name}").status()
            rows.append(
                {
                    "name": name,
                    "command": server.command,
                    "image": server.image,
                    "tools": [t.name for t in server.tools],
                    "allowed_hosts": server.allowed_hosts,
                    "running": bool(running and running.connection.alive),
                    "sandbox_id": running.connection.sandbox_id if running else None,
                    "starts": self.starts.get(name, 0),
                    "circuit": breaker.to_dict(),
                }
            )
        for name, problem in sorted(self.problems.items()):
            rows.append({"name": name, "error": problem})
        return rows

    def _audit(
        self, kind: str, name: str, summary: str, sandbox_id: str | None,
        metadata: dict[str, str],
    ) -> None:  # fmt: skip
        if self.record is None:
            return
        self.record(
            Event(
                kind,
                caller="kernel",
                tool_name=f"mcp.{name}",
                input_summary=summary[:500],
                sandbox_id=sandbox_id,
                metadata={"server": name, **metadata},
            )
        )
