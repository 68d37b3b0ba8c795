"""An MCP server's sandbox host: puts the server's stdio on the kernel's socket.

Runs as ``python3 -m fluffy.sandboxes.mcp_host [--cwd DIR] -- CMD [ARGS ...]`` in a
long-lived ``mcp-server`` sandbox (seccomp, no network, read-only root and project, uid
10001).  It connects to the kernel's socket for this sandbox, makes that connection the
server's standard input and output, and replaces itself with the server (``execvp``):
the kernel then speaks MCP's stdio transport (one JSON-RPC message per line) with the
server itself, with no process in between.  The server's standard error stays the
sandbox's own output, which the kernel shows when the server fails.  When the server
exits, the connection closes; when the kernel closes it, the server reads the end of
its input and exits.
"""

from __future__ import annotations

import os
import socket
import sys
import time

#: The kernel's socket for this sandbox (FLUFFY_MCP_SOCKET: tests that run the host
#: outside a sandbox).
SOCKET = os.environ.get("FLUFFY_MCP_SOCKET", "/run/fluffy/mcp.sock")
CONNECT_ATTEMPTS = 50


def _log(text: str) -> None:
    print(f"mcp-host: {text}", file=sys.stderr, flush=True)


def connect(path: str = SOCKET) -> socket.socket:
    for attempt in range(CONNECT_ATTEMPTS):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if attempt == CONNECT_ATTEMPTS - 1:
                raise
            time.sleep(0.1)
    raise OSError("unreachable")  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cwd = None
    if args[:1] == ["--cwd"] and len(args) > 1:
        cwd, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _log("usage: python3 -m fluffy.sandboxes.mcp_host [--cwd DIR] -- CMD [ARGS ...]")
        return 2
    try:
        sock = connect()
    except OSError as exc:
        _log(f"cannot reach the kernel: {exc}")
        return 3
    os.dup2(sock.fileno(), 0)
    os.dup2(sock.fileno(), 1)
    sock.close()
    os.environ.setdefault("HOME", "/tmp")  # noqa: S108 - the sandbox's own tmpfs
    try:
        if cwd:
            os.chdir(cwd)
        os.execvp(args[0], args)  # noqa: S606 - the user registered this command
    except OSError as exc:
        _log(f"cannot start {args[0]}: {exc.strerror or exc}")
    return 127


if __name__ == "__main__":
    raise SystemExit(main())
