"""An MCP server's sandbox host: puts the server's stdio on the kernel's socket.

Runs as ``python3 -m fluffy.sandboxes.mcp_host [--cwd DIR] [--proxy SOCKET] -- CMD
[ARGS ...]`` in a long-lived ``mcp-server`` sandbox (seccomp, no network, read-only root
and project, uid 10001).  It connects to the kernel's socket for this sandbox, makes
that connection the server's standard input and output, and replaces itself with the
server (``execvp``): the kernel then speaks MCP's stdio transport (one JSON-RPC message
per line) with the server itself, with no process in between.  The server's standard error stays the
sandbox's own output, which the kernel shows when the server fails.  When the server
exits, the connection closes; when the kernel closes it, the server reads the end of
its input and exits.

With ``--proxy`` (a server registered with allowed hosts), it first forks a child that
serves the kernel's CONNECT proxy socket on the sandbox's loopback
(:class:`~fluffy.sandboxes.ai.forwarder.Forwarder`) and gives the server
``HTTPS_PROXY``/``HTTP_PROXY`` (and their lower-case twins) pointing there, with no
``NO_PROXY``: the server reaches the hosts the kernel lets through and nothing else.
The child is forked before the kernel's socket is opened (so the server's exit still
closes it) and ends when the server does.
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
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
#: How often the forwarder's process looks whether the server still runs.
WATCH_S = 1.0


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


def start_forwarder(proxy: str) -> str:
    """Fork the process that forwards loopback TCP to ``proxy``; its URL.

    The listener is bound here, so the URL is known before the server starts; the
    child serves it until this process (the server, once exec'd) is gone."""
    from fluffy.sandboxes.ai.forwarder import Forwarder

    forwarder = Forwarder(proxy)
    parent = os.getpid()
    if os.fork() == 0:  # the child: serve, and end with the server
        code = 0
        try:
            quiet = os.open(os.devnull, os.O_RDWR)
            os.dup2(quiet, 0)
            os.dup2(quiet, 1)  # the sandbox's stdout is not its to write; stderr stays
            os.close(quiet)
            forwarder.start()
            while os.getppid() == parent:
                time.sleep(WATCH_S)
            forwarder.close()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return forwarder.url  # its sockets close on exec (they are not inheritable)


def proxy_environment(url: str) -> None:
    for name in PROXY_VARIABLES:
        os.environ[name] = url
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(name, None)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cwd = proxy = None
    while args[:1] in (["--cwd"], ["--proxy"]) and len(args) > 1:
        if args[0] == "--cwd":
            cwd = args[1]
        else:
            proxy = args[1]
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _log(
            "usage: python3 -m fluffy.sandboxes.mcp_host [--cwd DIR] [--proxy SOCKET] "
            "-- CMD [ARGS ...]"
        )
        return 2
    if proxy is not None:
        try:
            proxy_environment(start_forwarder(proxy))
        except OSError as exc:
            _log(f"cannot serve the kernel's proxy on loopback: {exc}")
            return 3
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
