"""What one plugin call is made of, on the kernel's side: its job (what the plugin host
is handed and what it sent back), its outcome, a third-party plugin's code, the call's
own folder, and how a plugin's error becomes fluffy's (used by :mod:`.plugins`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import (
    FluffyError,
    SandboxExited,
    ToolFailed,
    ToolInputInvalid,
    ToolTransient,
)
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.ipc.server import CallContext
from fluffy.kernel.plugins.store import PluginStore
from fluffy.kernel.policy.tokens import CapabilityToken
from fluffy.kernel.tools.core.capabilities import Scope
from fluffy.kernel.tools.sandbox.callfiles import Received


class ThirdPartyCode(msgspec.Struct, frozen=True):
    """Where an active third-party plugin's code comes from, and what it declared."""

    store: PluginStore
    name: str
    entry: str
    min_api_version: int
    #: The manifest's tool entries (``ToolDefinition.to_dict()`` form).
    tools: list[dict[str, Any]]
    capabilities: tuple[str, ...] = ()


#: Where a third-party plugin's code and declared tools appear in its sandbox.
PLUGIN_CODE_DIR = "plugin"
DECLARED_TOOLS = "tools.json"


class Job(msgspec.Struct):
    call_id: str
    tool: str
    args: dict[str, Any]
    session_mode: str
    min_api_version: int = 0
    plugin: str = ""
    sandbox_id: str = ""
    future: asyncio.Future[dict[str, Any]] = msgspec.field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    connected: asyncio.Event = msgspec.field(default_factory=asyncio.Event)
    handed_at: float = 0.0
    context: CallContext | None = None
    handed: bool = False
    sandbox: Sandbox | None = None
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    received: Received = msgspec.field(default_factory=Received)  # its output files so far
    sending: asyncio.Lock = msgspec.field(default_factory=asyncio.Lock)  # a tool.files in flight
    files_refused: str | None = None  # why a tool.files frame was refused (fails the call)
    placed: asyncio.Event = msgspec.field(default_factory=asyncio.Event)  # its call is assigned
    waiting: asyncio.Event = msgspec.field(default_factory=asyncio.Event)  # the host asked for work
    lost: bool = False  # the host hung up before its call was assigned
    pooled: bool = False  # made ahead of its call (idle until placed)
    slot: str = ""  # names the sandbox's socket folder
    capability: Scope | None = None  # what its token covers (None: no token)
    token: CapabilityToken | None = None  # issued when the host takes the call
    #: its capability_issued entry's durable commit (the result waits for it)
    issued: asyncio.Future[None] | None = None
    timeout_s: float = 0.0  # the call's time limit (its token lives as long)


class PluginOutcome(msgspec.Struct):
    """A finished call: the plugin's result and where its files are."""

    result: dict[str, Any]
    call_dir: Path
    sandbox: Sandbox
    #: create_ms (sandbox made and started), ready_ms (host asked for work),
    #: exchange_ms (job handed -> result back), total_ms.
    timings: dict[str, float]
    #: the call's folder, open (``call_dir`` names it through /proc/self/fd)
    call_fd: int = -1
    #: the call's capability token and the connection it is bound to (None: no token)
    token: CapabilityToken | None = None
    connection: str | None = None

    def close(self) -> None:
        if self.call_fd >= 0:
            os.close(self.call_fd)
            self.call_fd = -1


def open_call_dir(output_dir: Path, call_id: str) -> int:
    """The call's folder, opened without following a link.  The kernel alone writes it
    (the sandbox's ``/output`` is its own tmpfs; its files come over the socket), so
    this is defence in depth: were a link ever there, what the kernel reads would be
    refused, never followed."""
    root = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(call_id, 0o700, dir_fd=root)  # a call that wrote nothing
        return os.open(call_id, flags, dir_fd=root)
    except OSError as exc:
        raise ToolFailed(
            f"the output folder of call {call_id} is not a folder",
            why=f"{exc.strerror}: the sandbox replaced it (with a link?)",
            fix="Nothing was read from it; the call's result is discarded.",
        ) from None
    finally:
        os.close(root)


class CallRequest(msgspec.Struct, frozen=True):
    call_id: str
    tool: str
    args: dict[str, Any]
    session_mode: str
    settings: dict[str, Any]
    timeout_s: float
    capability: Scope | None = None


class NeverTaken(Exception):
    """A pooled sandbox failed before its host took the call (run it in a fresh one)."""


async def first_done(awaitable: Any, exited: asyncio.Future[int], *, value: bool = False) -> Any:
    """``awaitable``'s result, unless the container exits first (then None / raises)."""
    main = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({main, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not main.done():
            main.cancel()
    if main.done() and not main.cancelled():
        return main.result()
    if value:
        raise SandboxExited(
            "the plugin sandbox exited without answering",
            fix="Retry the call; if it fails again, the plugin crashes on it (`fluffy audit log "
            "--type sandbox_failed`).",
        )
    return None


def plugin_error(plugin: str, tool: str, error: dict[str, Any]) -> FluffyError:
    code = str(error.get("code", "tool.failed"))
    message = str(error.get("message", "no message"))[:2000]
    if code == "tool.input_invalid":
        return ToolInputInvalid(f"{tool}: {message}", why=f"{plugin} refused the arguments")
    cls = ToolTransient if error.get("retryable") else ToolFailed
    return cls(f"{tool} failed: {message}", why=f"reported by {plugin} ({code})")


def connection_key(context: CallContext) -> str:
    """A connection's name for a token's binding (its socket and the connection)."""
    return f"{context.binding}:{id(context.connection):x}"
