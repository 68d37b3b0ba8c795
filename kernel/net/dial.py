"""How the CONNECT proxy reaches a target when L1 has no network: the gate dials it.

In L1 (network none) the proxy asks the engine gate's dialler (:mod:`fluffy.gate.net`, on
the host) for a socket connected to the target; the gate re-checks the target against
the allow-list fluffy started with, resolves names on the host, and passes the connected
socket back over its Unix socket (SCM_RIGHTS).  Outside L1 (``fluffy kernel serve`` on
the host, tests) the proxy dials itself.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

Dial = Callable[[str, int, float], socket.socket]
_MAX_ANSWER = 4096


class DialRefused(Exception):
    """The target is not admitted (the proxy answers 403 and says why)."""


def gate_dialler() -> Dial | None:
    """The gate's dialler beside the engine gate's socket, when the kernel runs in L1."""
    if not os.environ.get("FLUFFY_ENGINE_GATE"):
        return None
    path = str(Path(os.environ.get("FLUFFY_ENGINE_SOCKET", "")).with_name("net.sock"))

    def dial(host: str, port: int, timeout: float) -> socket.socket:
        return gate_dial(path, host, port, timeout)

    return dial


def gate_dial(path: str, host: str, port: int, timeout: float) -> socket.socket:
    """A socket connected to ``host``:``port`` by the gate at ``path``.

    Raises :class:`DialRefused` when the gate refuses the target, OSError when it cannot
    reach it (or cannot be reached)."""
    data, fds = b"", []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ask:
        ask.settimeout(timeout + 2)  # the gate's own dial is bounded by its timeout
        ask.connect(path)
        ask.sendall(json.dumps({"host": host, "port": port}).encode() + b"\n")
        while not data.endswith(b"\n") and len(data) < _MAX_ANSWER:
            chunk, passed, _flags, _addr = socket.recv_fds(ask, _MAX_ANSWER, 1)
            fds += passed
            if not chunk:
                break
            data += chunk
    try:
        answer = json.loads(data)
        status, why = int(answer["status"]), str(answer.get("why") or "")
    except (ValueError, KeyError, TypeError):
        status, why = 502, "the engine gate's dialler gave no answer"
    if status == 200 and len(fds) == 1:
        connected = socket.socket(fileno=fds[0])
        connected.setblocking(True)  # the gate dialled with a timeout: O_NONBLOCK came along
        return connected
    for fd in fds:
        os.close(fd)
    if status == 403:
        raise DialRefused(why)
    raise OSError(why or f"the engine gate's dialler answered {status}")
