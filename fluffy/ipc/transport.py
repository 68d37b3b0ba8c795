"""Peer identity on a Unix socket (design: IPC Transport Abstraction).

Linux: ``SO_PEERCRED`` gives the peer's pid, uid and gid as seen from the listener's pid
namespace.  A peer in a sibling container (another pid namespace) shows ``pid == 0``
while uid and gid stay real (docs/environment.md), so fluffy binds identity to the *socket*
(one socket per sandbox, docs/ipc.md) and uses the pid only where it is visible.
macOS (``LOCAL_PEERCRED``) and Windows named pipes have a place here but no
implementation yet: the kernel runs in a Linux container on every platform.
"""

from __future__ import annotations

import re
import socket
import struct
import sys
from pathlib import Path
from typing import Protocol

import msgspec

_UCRED = struct.Struct("3i")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")


class PeerIdentity(msgspec.Struct, frozen=True):
    pid: int  # 0 when the peer is in a pid namespace the listener cannot see
    uid: int
    gid: int


class PeerCredentials(Protocol):
    """How a platform tells who is on the other end of a connection (design:
    ``IpcTransport.getPeerIdentity``).  Linux: SO_PEERCRED.  macOS (LOCAL_PEERCRED) and
    Windows (GetNamedPipeClientProcessId) would be further implementations."""

    def __call__(self, sock: socket.socket) -> PeerIdentity: ...


def linux_peer_credentials(sock: socket.socket) -> PeerIdentity:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerIdentity(pid, uid, gid)


def peer_identity(sock: socket.socket) -> PeerIdentity:
    """The platform's peer credentials for ``sock``."""
    if sys.platform.startswith("linux"):
        return linux_peer_credentials(sock)
    raise NotImplementedError(  # pragma: no cover - fluffy's kernel runs on Linux
        f"peer credentials on {sys.platform} (LOCAL_PEERCRED / named pipes) are not implemented"
    )


def container_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The container id a visible pid runs in (from its cgroup path), if any."""
    if pid <= 0:
        return None
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        match = _CONTAINER_ID.search(line)
        if match:
            return match[1]
    return None
