"""The kernel's allow-listing HTTP CONNECT proxy (the design's application-layer proxy).

Restricted sandboxes run with ``--network none``; the only way out is a Unix socket of
this proxy bind-mounted into them.  It tunnels ``CONNECT host:port`` to targets that
policy.yaml's ``network_whitelist`` admits (:class:`~fluffy.kernel.net.allowlist.AllowList`)
and refuses everything else.  A socket may be narrowed further (``start(..., hosts=)``:
an MCP server's own ``allowed_hosts``): a target must then be admitted by both lists.
It never terminates TLS: it sees the authority, never the content.

Answers: non-CONNECT -> 405 (``Allow: CONNECT``); malformed head or authority -> 400;
head too large -> 431; head too slow -> 408; not allow-listed (or not among the
socket's own hosts) -> 403; too many tunnels
or audit down -> 503; dial failure -> 502; otherwise ``200 Connection established``
and bytes both ways until both sides have closed (half-close is passed on).

Audit contract (``audit`` is awaited; it raising is logged and counted, never fatal):

* every answered request gets one record of ``phase="decision"`` *before* its answer
  is sent (so a refused request is on record before its 403);
* an allowed request gets its decision record before the proxy dials, and a second,
  ``phase="close"``, when the tunnel ends: ``decision="allow"`` with the byte counts
  and duration, or ``decision="error"`` with status 502 when the dial failed;
* the proxy fails closed: if the decision record of an allowed request cannot be
  written, the request is answered 503 and nothing is dialled;
* a connection that closes before sending a byte is not a request and is not audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import secrets
import socket
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from fluffy.errors import ConfigError
from fluffy.gate.net import public
from fluffy.kernel.net.allowlist import AllowList, AuthorityError, Target, parse_target
from fluffy.kernel.net.dial import Dial, DialRefused
from fluffy.kernel.net.head import HeadRejected, clip, linger, parse_head, read_head, respond

log = logging.getLogger("fluffy.kernel.net")

Decision = Literal["allow", "deny", "error"]
Phase = Literal["decision", "close"]
_CHUNK = 64 * 1024


class ProxyRecord(msgspec.Struct):
    """One audit record of the proxy (see the module docstring for when each is sent)."""

    tag: str  # the listening socket's tag: which sandbox asked
    phase: Phase
    decision: Decision
    status: int
    host: str = ""
    port: int = 0
    rule: str | None = None  # the network_whitelist entry that admitted it
    host_rule: str | None = None  # the socket's own entry that admitted it, if it has hosts
    reason: str = ""
    session: str | None = None  # session_of(tag), when the proxy was given one
    bytes_up: int = 0  # sandbox -> target
    bytes_down: int = 0  # target -> sandbox
    duration_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


AuditFn = Callable[[ProxyRecord], Awaitable[None]]


class _Listener(msgspec.Struct):
    path: Path
    tag: str
    server: asyncio.Server
    inode: int
    tasks: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    hosts: AllowList | None = None  # this socket's own narrower list (None: the policy's)


class ConnectProxy:
    """Serves any number of Unix sockets, one per sandbox, each with its ``tag``."""

    def __init__(
        self,
        allow: AllowList,
        audit: AuditFn,
        *,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float = 300.0,
        head_timeout_s: float = 10.0,
        max_header_bytes: int = 8192,
        max_tunnels: int = 64,  # connections at once, head reading included
        session_of: Callable[[str], str | None] | None = None,
        dial: Dial | None = None,  # the gate's dialler (kernel.net.dial) when in L1
    ) -> None:
        self._allow = allow
        self._dial = dial
        self._audit = audit
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.head_timeout_s = head_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_tunnels = max_tunnels
        self._session_of = session_of
        self._listeners: dict[Path, _Listener] = {}
        self._active = 0
        self.stats: Counter[str] = Counter()

    # -- lifecycle ---------------------------------------------------------------
    async def start(
        self,
        socket_path: str | Path,
        *,
        tag: str = "",
        mode: int = 0o660,
        owner: tuple[int, int] | None = None,
        hosts: AllowList | None = None,
    ) -> None:
        """Listen on ``socket_path``; its connections are audited under ``tag``.

        ``hosts`` narrows this socket: a target must be in it *and* in the policy's
        list (which :meth:`reload` may change; ``hosts`` stays as given).

        The socket is bound under a short temporary name in the same folder, given its
        mode (and owner), then renamed into place: a client never sees the path before
        it listens.  The folder is the caller's (it should be private to the sandbox).
        """
        path = Path(socket_path)
        if path in self._listeners:
            raise ConfigError(
                f"the proxy already listens on {path}",
                why="each sandbox gets its own proxy socket",
                fix="Give this sandbox another socket path.",
            )
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise ConfigError(
                    f"{path} exists and is not a socket",
                    fix="Remove it, or give the proxy another socket path.",
                    why="the proxy listens on a Unix socket and does not replace other files",
                )
        staging = path.with_name(f".{secrets.token_hex(4)}.s")
        listener_tasks: set[asyncio.Task[None]] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            listener_tasks.add(task)
            try:
                await self._serve(reader, writer, tag, hosts)
            except asyncio.CancelledError:
                # stop()/close() cut it; end quietly (asyncio 3.11 would log the cancel)
                pass
            finally:
                listener_tasks.discard(task)

        server = await asyncio.start_unix_server(serve, path=str(staging), backlog=256)
        try:
            if owner is not None:
                os.chown(staging, *owner)
            staging.chmod(mode)
            inode = staging.stat().st_ino
            staging.replace(path)
        except BaseException:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()
            raise
        self._listeners[path] = _Listener(path, tag, server, inode, listener_tasks, hosts)

    async def stop(self, socket_path: str | Path) -> None:
        """Stop one socket (a sandbox ended): its open tunnels are cut, the path removed."""
        listener = self._listeners.pop(Path(socket_path), None)
        if listener is not None:
            await self._shut(listener)

    async def close(self) -> None:
        """Stop every socket and cut every tunnel."""
        listeners = list(self._listeners.values())
        self._listeners.clear()
        await asyncio.gather(*(self._shut(listener) for listener in listeners))

    def reload(self, allow: AllowList) -> None:
        """Use ``allow`` for new requests; tunnels already open stay open."""
        self._allow = allow

    @property
    def allow(self) -> AllowList:
        return self._allow

    @property
    def paths(self) -> list[Path]:
        return list(self._listeners)

    async def _shut(self, listener: _Listener) -> None:
        listener.server.close()
        for task in list(listener.tasks):
            task.cancel()
        await asyncio.gather(*listener.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await listener.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            if listener.path.lstat().st_ino == listener.inode:  # still ours
                listener.path.unlink()

    # -- one connection ----------------------------------------------------------
    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        tag: str,
        hosts: AllowList | None = None,
    ) -> None:
        started = time.monotonic()
        self.stats["connections"] += 1
        record = ProxyRecord(tag, "decision", "error", 400)
        if self._session_of is not None:
            with contextlib.suppress(Exception):
                record.session = self._session_of(tag)
        self._active += 1
        tunnelled = False
        try:
            if self._active > self.max_tunnels:
                await self._refuse(writer, record, 503, f"more than {self.max_tunnels} tunnels")
                return
            target, early = await self._decide(reader, writer, record, hosts)
            if target is None:
                return
            tunnelled = True
            await self._tunnel(reader, writer, target, early, record, started, hosts)
        except HeadRejected as exc:
            await self._refuse(writer, record, exc.status, exc.reason)
        finally:
            self._active -= 1
            task = asyncio.current_task()
            try:
                if not tunnelled and not (task and task.cancelling()):
                    await linger(reader, writer)
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _decide(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        record: ProxyRecord,
        hosts: AllowList | None = None,
    ) -> tuple[Target | None, bytes]:
        """Read and judge the head; answer refusals here.  (target, early bytes) if allowed."""
        try:
            async with asyncio.timeout(self.head_timeout_s):
                got = await read_head(reader, self.max_header_bytes)
        except TimeoutError:
            raise HeadRejected(408, "the request head did not arrive in time") from None
        except ConnectionError:
            self.stats["empty"] += 1
            return None, b""
        if got is None:
            self.stats["empty"] += 1
            return None, b""
        head, early = got
        request = parse_head(head)
        if request.method != "CONNECT":
            await self._refuse(
                writer,
                record,
                405,
                f"method {request.method} {clip(request.target)}",
                body="fluffy: this proxy only tunnels (CONNECT host:port). Set HTTP_PROXY "
                "and HTTPS_PROXY for a client that tunnels every request, plain http:// too.",
                headers=(("Allow", "CONNECT"),),
                decision="deny",
            )
            return None, b""
        try:
            target = parse_target(request.target)
        except AuthorityError as exc:
            raise HeadRejected(400, f"bad CONNECT target: {clip(str(exc))}") from None
        record.host, record.port = target.host, target.port
        rule = self._allow.match(target)
        if rule is None:
            await self._refuse(
                writer,
                record,
                403,
                "not in network_whitelist",
                body=f"fluffy: {target.authority} is not in policy.yaml network_whitelist",
                decision="deny",
            )
            return None, b""
        own = hosts.match(target) if hosts is not None else None
        if hosts is not None and own is None:
            await self._refuse(
                writer,
                record,
                403,
                "not in the sandbox's allowed hosts",
                body=f"fluffy: {target.authority} is not among the hosts "
                f"{record.tag or 'this sandbox'} may reach",
                decision="deny",
            )
            return None, b""
        record.decision, record.status, record.rule = "allow", 200, rule
        record.host_rule = own
        if not await self._record(record):
            await respond(writer, 503, "fluffy: the audit log is unavailable; nothing is let out")
            return None, b""
        self.stats["allowed"] += 1
        return target, early

    async def _refuse(
        self,
        writer: asyncio.StreamWriter,
        record: ProxyRecord,
        status: int,
        reason: str,
        *,
        body: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        decision: Decision = "error",
    ) -> None:
        record.decision, record.status, record.reason = decision, status, reason
        self.stats["denied" if decision == "deny" else "errors"] += 1
        await self._record(record)
        await respond(writer, status, body or f"fluffy: {reason}", headers)

    async def _record(self, record: ProxyRecord) -> bool:
        try:
            await self._audit(msgspec.structs.replace(record))
        except Exception:
            self.stats["audit_failures"] += 1
            log.exception(
                "proxy audit callback failed (%s %s:%s)", record.tag, record.host, record.port
            )
            return False
        return True

    # -- the tunnel --------------------------------------------------------------
    async def _tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        target: Target,
        early: bytes,
        record: ProxyRecord,
        started: float,
        hosts: AllowList | None = None,
    ) -> None:
        record.phase = "close"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                up_reader, up_writer = await self._open(target, hosts)
        except DialRefused as exc:
            record.decision, record.status, record.reason = "deny", 403, clip(str(exc))
            record.duration_ms = round((time.monotonic() - started) * 1000, 3)
            self.stats["denied"] += 1
            await self._record(record)
            await respond(writer, 403, f"fluffy: {exc}")
            return
        except (OSError, TimeoutError) as exc:
            reason = "connect timed out" if isinstance(exc, TimeoutError) else str(exc)
            record.decision, record.status, record.reason = "error", 502, clip(reason)
            record.duration_ms = round((time.monotonic() - started) * 1000, 3)
            self.stats["errors"] += 1
            await self._record(record)
            await respond(writer, 502, f"fluffy: cannot reach {target.authority}: {clip(reason)}")
            return
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if early:  # sent right behind the head (a TLS hello, say)
                up_writer.write(early)
                record.bytes_up += len(early)
            record.reason = await self._splice(reader, writer, up_reader, up_writer, record)
        finally:
            up_writer.close()
            record.duration_ms = round((time.monotonic() - started) * 1000, 3)
            # shielded: a tunnel cut by stop()/close() still gets its close record
            await asyncio.shield(self._record(record))

    async def _open(
        self, target: Target, hosts: AllowList | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``target``: made by the gate when there is one (L1 has no
        network; the gate re-checks and resolves on the host), else dialled here."""
        if self._dial is not None:
            sock = await asyncio.to_thread(
                self._dial, target.host, target.port, self.connect_timeout_s
            )
            return await asyncio.open_connection(sock=sock)
        return await asyncio.open_connection(await self._address(target, hosts), target.port)

    async def _address(self, target: Target, hosts: AllowList | None = None) -> str:
        """The address to dial, resolved once (the connection goes to the address that was
        checked: no second lookup to rebind).  A name that resolves to a loopback, private,
        link-local or otherwise non-public address is refused (:class:`DialRefused`) unless
        an IP entry of the allow-list (and of the socket's own ``hosts``, when it has
        them) names that address: a hostname rule never opens the host's or the LAN's
        services by way of DNS."""
        if target.ip is not None:
            return str(target.ip)
        infos = await asyncio.get_running_loop().getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM
        )
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if public(address) or (
                self._allow.allows(str(address), target.port) is not None
                and (hosts is None or hosts.allows(str(address), target.port) is not None)
            ):
                return str(address)
        if not infos:
            raise OSError(f"{target.host} has no address")
        raise DialRefused(
            f"{target.host} resolves to a private or loopback address; only an IP entry in "
            "policy.yaml network_whitelist admits such an address"
        )

    async def _splice(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        record: ProxyRecord,
    ) -> str:
        """Copy both ways until both have ended, one fails, or both idle too long."""
        last = [time.monotonic()]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            while chunk := await src.read(_CHUNK):
                last[0] = time.monotonic()
                if up:
                    record.bytes_up += len(chunk)
                else:
                    record.bytes_down += len(chunk)
                dst.write(chunk)
                await dst.drain()
            if dst.can_write_eof():
                with contextlib.suppress(OSError):
                    dst.write_eof()

        pending = {
            asyncio.create_task(pump(reader, up_writer, True)),
            asyncio.create_task(pump(up_reader, writer, False)),
        }
        reason = "closed"
        try:
            while pending:
                remaining = self.idle_timeout_s - (time.monotonic() - last[0])
                if remaining <= 0:
                    reason = f"idle for {self.idle_timeout_s:g} s"
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=remaining, return_when=asyncio.FIRST_EXCEPTION
                )
                failed = [t.exception() for t in done if t.exception() is not None]
                if failed:
                    reason = f"aborted: {clip(repr(failed[0]))}"
                    break
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return reason
