"""The CLI's client refuses to send text that is not UTF-8 (a file name read as bytes,
a script), clearly and before a byte is sent."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from fluffy.errors import InvalidPayload
from fluffy.ipc.client import AsyncClient, SyncClient

LATIN1 = os.fsdecode(b"caf\xe9.txt")  # the str Python gives a Latin-1 name


def test_the_cli_refuses_to_send_text_that_is_not_utf8_and_sends_nothing() -> None:
    here, there = socket.socketpair()
    with here, there:
        client = object.__new__(SyncClient)  # connected: the handshake is not the point
        client.sock = here
        with pytest.raises(InvalidPayload, match="not UTF-8") as caught:
            client.call("session.message", {"text": f"tidy {LATIN1}"})
        assert "caf\\udce9.txt" in caught.value.what and caught.value.fix
        there.setblocking(False)
        with pytest.raises(BlockingIOError):
            there.recv(1)  # not a byte of a frame went out


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_the_async_client_refuses_it_too_and_leaves_nothing_pending() -> None:
    client = AsyncClient()
    transport = _Transport()
    client.transport = transport  # type: ignore[assignment]
    with pytest.raises(InvalidPayload, match="not UTF-8"):
        asyncio.run(client.call("session.message", {"text": LATIN1}))
    assert (transport.written, client.pending) == ([], {})
