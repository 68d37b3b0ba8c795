"""The kernel's IPC server: asyncio, Unix sockets, a closed method table.

One :class:`KernelServer` serves any number of listening sockets.  Each listener carries
a *binding*: the identity every connection on it has (``"cli"`` for the kernel's main
socket, a sandbox id for a per-sandbox socket).  Connections must handshake first; then
requests run concurrently (sync handlers inline, async ones as tasks) and are answered
by id; the server may push events.

Hostile input is refused with a structured error or a clean close and counted in
:attr:`KernelServer.stats`; nothing a peer sends can stop the server serving others.

This module is the listener side; :mod:`.connection` is one connection's protocol and
:mod:`.context` what a handler sees of its call (re-exported here).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from fluffy.ipc.protocol import DEFAULT_MAX_FRAME
from fluffy.ipc.transport import PeerCredentials, peer_identity
from fluffy.kernel.ipc.connection import Connection
from fluffy.kernel.ipc.context import (
    UNAUDITED,
    AsyncHandler,
    CallContext,
    CallRecord,
    Handler,
    Observer,
    note_decision,
)
from fluffy.kernel.ipc.syscalls import SyscallTable

__all__ = [
    "UNAUDITED",
    "AsyncHandler",
    "CallContext",
    "CallRecord",
    "Handler",
    "KernelServer",
    "Limits",
    "Listener",
    "Observer",
    "note_decision",
]


class Limits(msgspec.Struct, frozen=True):
    max_frame: int = DEFAULT_MAX_FRAME
    max_connections: int = 1024
    frame_deadline_s: float = 5.0  # a started frame must complete within this
    handshake_deadline_s: float = 10.0  # the handshake must arrive within this
    max_in_flight: int = 256  # per connection; reading pauses above it
    handshake_max_frame: int = 4096  # a handshake is ~150 bytes; nothing bigger before it
    max_write_buffer: int = 8 * 1024 * 1024  # a peer that never reads is cut off here


class Listener(msgspec.Struct):
    path: Path
    binding: str
    allowed_uids: frozenset[int] | None
    server: asyncio.AbstractServer


class KernelServer(msgspec.Struct):
    """Serves ``table`` (the kernel's syscalls, or a sandbox socket's own small table)."""

    table: SyscallTable
    limits: Limits = msgspec.field(default_factory=Limits)
    stats: collections.Counter[str] = msgspec.field(default_factory=collections.Counter)
    listeners: list[Listener] = msgspec.field(default_factory=list)
    connections: set[Connection] = msgspec.field(default_factory=set)
    credentials: PeerCredentials = peer_identity
    observer: Observer | None = None
    audit_head: Callable[[], dict[str, Any] | None] | None = None
    memory: Callable[[], dict[str, Any]] | None = None
    #: the scheduler's figures (limits, running and queued by template and priority)
    scheduler: Callable[[], dict[str, Any]] | None = None

    async def listen(
        self,
        path: Path,
        *,
        binding: str = "cli",
        allowed_uids: frozenset[int] | None = None,
        mode: int = 0o600,
        owner: tuple[int, int] | None = None,
        folder_mode: int = 0o700,
    ) -> Listener:
        """Listen on ``path``; every connection there gets ``binding`` as its identity.

        ``owner`` gives the socket (and accepts its folder) to another uid: a sandbox's
        own socket belongs to the sandbox user, in a 0700 folder of that user, inside the
        kernel's private state folder.
        """
        _private_dir(path.parent, owner[0] if owner else None, folder_mode)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        loop = asyncio.get_running_loop()
        binding_uids = allowed_uids

        def factory() -> Connection:
            return Connection(self, binding, binding_uids)

        # The folder is 0700 (or the sandbox's own): the socket is unreachable by others
        # between bind and chmod.  (No umask games: umask is process-wide.)  It is bound
        # under a short temporary name and renamed into place once it listens, so a
        # client that sees the path never meets a bound-but-not-listening socket.
        staging = path.with_name(f".{len(self.listeners)}.s")
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
        server = await loop.create_unix_server(factory, str(staging), backlog=512)
        if owner is not None:
            os.chown(staging, *owner)
        staging.chmod(mode)
        staging.replace(path)
        listener = Listener(path, binding, allowed_uids, server)
        self.listeners.append(listener)
        return listener

    async def close(self) -> None:
        for listener in self.listeners:
            listener.server.close()
        for connection in list(self.connections):
            connection.close()
        for listener in self.listeners:
            with contextlib.suppress(Exception):
                await listener.server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                listener.path.unlink()
        self.listeners.clear()

    def count(self, what: str) -> None:
        self.stats[what] += 1


def _private_dir(folder: Path, owner: int | None = None, mode: int = 0o700) -> None:
    """The socket's folder must be ours (or the socket owner's, a sandbox's) with ``mode``
    (0700; 0711 only for a sandbox's folder that lives inside the kernel's private one)."""
    from fluffy.errors import ConfigError

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.stat()
    if info.st_uid not in (os.geteuid(), owner):
        raise ConfigError(
            f"the socket folder {folder} belongs to uid {info.st_uid}, not to the kernel",
            why="another user could replace or reach the kernel's socket",
            fix="Use a folder the kernel's user owns (or remove this one).",
        )
    if info.st_mode & 0o777 != mode:
        folder.chmod(mode)
