"""Loopback TCP -> the kernel proxy's Unix socket, inside a sandbox (socat's job, in-process).

A ``--network none`` sandbox still has a loopback interface, and standard clients only
understand ``HTTP(S)_PROXY=http://host:port``.  The ai-provider sandbox may not spawn
processes (strict seccomp, max_pids=10), so instead of socat one thread runs a selector
loop: every connection accepted on ``127.0.0.1:<port>`` is paired with a new connection
to the bind-mounted Unix socket and bytes are copied both ways, with back-pressure (a
side is read only when the other side's queue is empty) and half-close (an EOF from one
side becomes ``shutdown(SHUT_WR)`` on the other once its queue has drained).

One thread serves every connection: threads count against the sandbox's pids limit.
Standard library only (no fluffy.kernel).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from typing import Any

_CHUNK = 64 * 1024
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE


class _Pair:
    """One client connection and its upstream (index 0: client, 1: the Unix socket)."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.socks = (client, upstream)
        self.pending = [b"", b""]  # pending[i]: bytes still to write to socks[i]
        self.eof = [False, False]  # socks[i] has sent its EOF
        self.shut = [False, False]  # socks[i] was told our EOF (SHUT_WR)
        self.events = [0, 0]  # what each socket is registered for

    def interest(self, i: int) -> int:
        wanted = 0
        if not self.eof[i] and not self.pending[1 - i]:
            wanted |= _READ
        if self.pending[i]:
            wanted |= _WRITE
        return wanted

    def step(self, i: int, mask: int) -> None:
        """Handle readiness of socks[i]; OSError means the pair is finished."""
        other = 1 - i
        if mask & _WRITE:
            self._flush(i)
        if mask & _READ:
            try:
                data = self.socks[i].recv(_CHUNK)
            except BlockingIOError:
                data = None
            if data == b"":
                self.eof[i] = True
            elif data:
                self.pending[other] += data
                self._flush(other)  # most often it all goes at once: no extra wake-up
        for j in (0, 1):
            if self.eof[1 - j] and not self.pending[j] and not self.shut[j]:
                self.shut[j] = True
                self.socks[j].shutdown(socket.SHUT_WR)

    def _flush(self, i: int) -> None:
        if self.pending[i]:
            try:
                sent = self.socks[i].send(self.pending[i])
            except BlockingIOError:
                return
            self.pending[i] = self.pending[i][sent:]

    @property
    def finished(self) -> bool:
        return all(self.eof) and not any(self.pending)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


class Forwarder:
    """``127.0.0.1:<port>`` -> ``unix_path``; use :attr:`url` as HTTP(S)_PROXY."""

    def __init__(self, unix_path: str, *, host: str = "127.0.0.1", max_connections: int = 64):
        self.unix_path = unix_path
        self.max_connections = max_connections
        self._listener = socket.create_server((host, 0), backlog=64)
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._pairs: set[_Pair] = set()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="fluffy-forwarder", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, cut every connection, and wait for the thread."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        else:
            self._cleanup()

    def __enter__(self) -> Forwarder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop (forwarder thread only) ---------------------------------------
    def _run(self) -> None:
        sel = self._selector
        sel.register(self._listener, _READ, None)
        sel.register(self._wake_r, _READ, None)
        try:
            while not self._closing:
                for key, mask in sel.select():
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_r:
                        pair, i = key.data
                        self._step(pair, i, mask)
        finally:
            self._cleanup()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        if len(self._pairs) >= self.max_connections:
            client.close()
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.settimeout(2)
            upstream.connect(self.unix_path)
        except OSError as exc:
            upstream.close()
            _answer_unreachable(client, self.unix_path, exc)
            return
        client.setblocking(False)
        upstream.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, upstream)
        self._pairs.add(pair)
        self._update(pair)

    def _step(self, pair: _Pair, i: int, mask: int) -> None:
        try:
            pair.step(i, mask)
        except OSError:
            self._drop(pair)
            return
        if pair.finished:
            self._drop(pair)
        else:
            self._update(pair)

    def _update(self, pair: _Pair) -> None:
        for i, sock in enumerate(pair.socks):
            wanted = pair.interest(i)
            if wanted == pair.events[i]:
                continue
            if not wanted:
                self._selector.unregister(sock)
            elif not pair.events[i]:
                self._selector.register(sock, wanted, (pair, i))
            else:
                self._selector.modify(sock, wanted, (pair, i))
            pair.events[i] = wanted

    def _drop(self, pair: _Pair) -> None:
        for i, sock in enumerate(pair.socks):
            if pair.events[i]:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
        pair.close()
        self._pairs.discard(pair)

    def _cleanup(self) -> None:
        for pair in list(self._pairs):
            self._drop(pair)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()


def _answer_unreachable(client: socket.socket, path: str, exc: Any) -> None:
    """The kernel's socket is gone: say so in HTTP, as a proxy would, and hang up."""
    body = f"fluffy: the kernel's network proxy ({path}) is unreachable: {exc}\n".encode()
    head = (
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        client.settimeout(1)
        client.sendall(head.encode("ascii") + body)
    client.close()
