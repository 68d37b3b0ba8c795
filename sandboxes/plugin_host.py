"""The tool plugin host: runs one tool plugin's jobs for the kernel, inside an L2 sandbox.

``python3 -m fluffy.sandboxes.plugin_host fluffy.plugins.fs_tool`` scrubs its own
environment to the SDK's allow-list (``HOME=/tmp`` if unset), imports the module's
``PLUGIN``, connects to ``/run/fluffy/kernel.sock`` as the plugin (name, version), then
loops: ``tool.next`` gives a job (None: exit 0), the plugin's handler runs it in a worker
thread, ``tool.files`` sends what it wrote under ``/output/<call_id>`` (the sandbox's own
tmpfs: :mod:`fluffy.plugins.sdk.ship`), ``tool.result`` reports it (see
:mod:`fluffy.plugins.sdk.execute`).

While a handler runs, the connection stays served: the kernel's ``tool.pause`` and
``tool.resume`` events call the plugin's ``on_pause`` / ``on_resume`` hooks (in their
own thread, in order).  If the connection drops after a pause (the kernel froze the
container for longer than it waits), the host reconnects, calls ``on_resume`` if no
resume came, and sends again what it was sending.  A drop without a pause ends the host
(exit 1): the kernel is gone.  ``--socket``, ``--workspace``, ``--staged`` and
``--output`` let tests run the host outside a container.

A third-party plugin is not a module of the image: ``--plugin-dir DIR --entry FILE``
loads ``PLUGIN`` from the file (``DIR`` first on ``sys.path``, so the plugin may import
its own modules), and ``--declared tools.json`` is the manifest's tool list: the host
refuses to serve (exit 2) a plugin whose tools differ from what its manifest declared,
because the kernel routes, checks and shows the AI the manifest's tools.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.errors import ConnectionClosed, FluffyError
from fluffy.ipc.client import AsyncClient
from fluffy.ipc.protocol import IpcMessage
from fluffy.plugins.sdk import BoundTool, Roots, ToolPlugin, check_plugin, execute_job
from fluffy.plugins.sdk.execute import failure
from fluffy.plugins.sdk.run import scrub_environment
from fluffy.plugins.sdk.ship import frames

SOCKET = "/run/fluffy/kernel.sock"
PAUSE, RESUME = "tool.pause", "tool.resume"


@dataclass(frozen=True)
class Options:
    module: str | None
    socket: str
    roots: Roots
    reconnect_s: float
    plugin_dir: Path | None = None
    entry: str | None = None
    declared: Path | None = None


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python3 -m fluffy.sandboxes.plugin_host",
        description="Run a fluffy tool plugin's jobs for the kernel.",
    )
    parser.add_argument(
        "module", nargs="?", help="the plugin's module, e.g. fluffy.plugins.fs_tool"
    )
    parser.add_argument("--plugin-dir", type=Path, help="a third-party plugin's folder")
    parser.add_argument("--entry", help="its entry file, relative to --plugin-dir")
    parser.add_argument("--declared", type=Path, help="the manifest's tools (JSON list)")
    parser.add_argument("--socket", default=SOCKET)
    parser.add_argument("--workspace", type=Path, default=Path("/workspace"))
    parser.add_argument("--staged", type=Path, default=Path("/staged"))
    parser.add_argument("--output", type=Path, default=Path("/output"))
    parser.add_argument(
        "--reconnect-s", type=float, default=60.0, help="how long to retry after a paused drop"
    )
    args = parser.parse_args(argv)
    if (args.module is None) == (args.plugin_dir is None) or (
        args.plugin_dir is not None and not args.entry
    ):
        parser.error("give a module, or --plugin-dir with --entry")
    roots = Roots(workspace=args.workspace, staged=args.staged, output=args.output)
    return Options(
        args.module,
        args.socket,
        roots,
        args.reconnect_s,
        plugin_dir=args.plugin_dir,
        entry=args.entry,
        declared=args.declared,
    )


def load_plugin(module: str) -> ToolPlugin:
    plugin = getattr(importlib.import_module(module), "PLUGIN", None)
    if not isinstance(plugin, ToolPlugin):
        raise TypeError(f"{module}.PLUGIN is missing or not a ToolPlugin")
    return plugin


def load_plugin_file(folder: Path, entry: str) -> ToolPlugin:
    """``PLUGIN`` of a third-party plugin's entry file (its folder first on sys.path)."""
    path = (folder / entry).resolve()
    if not path.is_relative_to(folder.resolve()) or not path.is_file():
        raise TypeError(f"the entry {entry!r} is not a file inside {folder}")
    sys.path.insert(0, str(folder))
    name = "fluffy_plugin_" + path.stem.replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TypeError(f"{path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    plugin = getattr(module, "PLUGIN", None)
    if not isinstance(plugin, ToolPlugin):
        raise TypeError(f"{entry}: PLUGIN is missing or not a ToolPlugin")
    return plugin


def check_declared(tools: dict[str, BoundTool], declared: Path) -> None:
    """The plugin's tools must be exactly the manifest's (names and definitions)."""
    wanted = {str(t["name"]): t for t in json.loads(declared.read_text(encoding="utf-8"))}
    actual = {name: bound.definition.to_dict() for name, bound in tools.items()}
    undeclared = sorted(set(actual) - set(wanted))
    if undeclared:
        raise TypeError(f"the plugin defines tools its manifest does not declare: {undeclared}")
    missing = sorted(set(wanted) - set(actual))
    if missing:
        raise TypeError(f"the manifest declares tools the plugin does not define: {missing}")
    differ = sorted(name for name in wanted if json.loads(json.dumps(actual[name])) != wanted[name])
    if differ:
        raise TypeError(f"the plugin's definition of {differ} differs from its manifest")


def _log(message: str) -> None:
    print(f"plugin_host: {message}", file=sys.stderr, flush=True)


class _Client(AsyncClient):
    """The IPC client, telling the host when the connection is lost."""

    def __init__(self) -> None:
        super().__init__()
        self.on_lost: Callable[[], None] | None = None

    def _lost(self) -> None:
        if self.on_lost is not None:  # first: callers woken below see the host's decision
            self.on_lost()
        super()._lost()


class Host:
    def __init__(self, plugin: ToolPlugin, tools: dict[str, BoundTool], options: Options):
        self.plugin = plugin
        self.tools = tools
        self.options = options
        self.client: _Client | None = None
        self.paused = False
        self.pause_seen = False  # a pause on this connection: a drop is worth a reconnect
        self.closed = False  # the connection is gone for good
        self.stopping = False
        self.reconnecting: asyncio.Task[None] | None = None
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="fluffy-tool")
        self.hooks = ThreadPoolExecutor(1, thread_name_prefix="fluffy-hooks")

    # -- connection ----------------------------------------------------------------
    async def connect(self) -> None:
        client = await _Client.connect(
            self.options.socket,
            plugin_name=self.plugin.name,
            plugin_version=str(self.plugin.version),
        )
        assert isinstance(client, _Client)
        client.on_event = self.on_event
        client.on_lost = self.on_lost
        while not client.events.empty():  # any that came before on_event was set
            self.on_event(client.events.get_nowait())
        self.client = client

    def on_lost(self) -> None:
        if self.stopping:
            return
        if self.pause_seen:
            _log("the connection dropped after a pause; reconnecting")
            self.reconnecting = asyncio.ensure_future(self.reconnect())
        else:
            self.closed = True

    async def reconnect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.reconnect_s
        while True:
            try:
                await self.connect()
            except (OSError, FluffyError) as exc:
                if loop.time() >= deadline:
                    _log(f"could not reconnect within {self.options.reconnect_s:g} s: {exc}")
                    self.closed = True
                    return
                await asyncio.sleep(0.2)
                continue
            _log("reconnected")
            self.pause_seen = False
            if self.paused:  # the resume event went to the old connection, or never came
                self.paused = False
                self.hook("on_resume")
            return

    async def request(self, method: str, params: Any = None) -> Any:
        """``call`` that survives a drop after a pause (waits for the reconnection)."""
        for _ in range(200):
            if self.reconnecting is not None and not self.reconnecting.done():
                await asyncio.shield(self.reconnecting)
            if self.closed or self.client is None:
                raise ConnectionClosed("the kernel closed the connection")
            client = self.client
            try:
                return await client.call(method, params)
            except ConnectionClosed:
                if self.closed:
                    raise
                await asyncio.sleep(0.05)  # the loss is being handled: wait for its outcome
        raise ConnectionClosed("the connection to the kernel keeps failing")

    # -- events --------------------------------------------------------------------
    def on_event(self, message: IpcMessage) -> None:
        if message.method == PAUSE:
            self.paused = True
            self.pause_seen = True
            self.hook("on_pause")
        elif message.method == RESUME:
            self.paused = False
            self.hook("on_resume")
        else:
            _log(f"ignoring event {message.method!r}")

    def hook(self, name: str) -> None:
        try:
            self.hooks.submit(self._call_hook, name)
        except RuntimeError:  # shutting down: no more hooks
            _log(f"not calling {name}: the host is stopping")

    def _call_hook(self, name: str) -> None:
        try:
            getattr(self.plugin, name)()
        except Exception:
            _log(f"the plugin's {name} failed:")
            traceback.print_exc(file=sys.stderr)

    # -- jobs ----------------------------------------------------------------------
    def run_job(self, job: Any) -> dict[str, Any]:
        return execute_job(self.tools, self.plugin.name, job, self.options.roots)

    async def send_files(self, reply: dict[str, Any]) -> dict[str, Any]:
        """Send what the call wrote under ``/output/<call_id>`` (``tool.files``); the
        reply, or a failure saying why the kernel refused the files."""
        call_id = str(reply.get("call_id") or "")
        if not call_id or "/" in call_id or call_id in (".", ".."):
            return reply
        loop = asyncio.get_running_loop()
        batches = frames(self.options.roots.output / call_id)
        while batch := await loop.run_in_executor(self.worker, next, batches, None):
            try:
                await self.request("tool.files", {"call_id": call_id, "files": batch})
            except ConnectionClosed:
                raise
            except FluffyError as exc:
                _log(f"the kernel refused the output files of {call_id!r}: {exc}")
                return failure(call_id, exc)
        return reply

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        await self.connect()
        try:
            while True:
                job = await self.request("tool.next")
                if job is None:
                    return 0
                reply = await loop.run_in_executor(self.worker, self.run_job, job)
                reply = present_capability(job, reply)
                reply = await self.send_files(reply)
                try:
                    await self.request("tool.result", reply)
                except ConnectionClosed:
                    raise
                except FluffyError as exc:  # the kernel refused this result: next job
                    _log(f"the kernel refused the result of {reply.get('call_id')!r}: {exc}")
        finally:
            self.stopping = True
            if self.client is not None:
                await self.client.close()
            self.worker.shutdown(wait=False, cancel_futures=True)
            self.hooks.shutdown(wait=False, cancel_futures=True)


def present_capability(job: Any, reply: dict[str, Any]) -> dict[str, Any]:
    """Show the call's capability token with its changes: one use per change, each with
    a nonce greater than the last (the kernel checks every one before staging)."""
    capability = job.get("capability") if isinstance(job, dict) else None
    result = reply.get("result")
    if not isinstance(capability, dict) or not isinstance(result, dict):
        return reply
    changes = result.get("changes")
    if not isinstance(changes, list):
        return reply
    uses = [
        {"path": change.get("path") if isinstance(change, dict) else None, "nonce": n}
        for n, change in enumerate(changes, start=1)
    ]
    return {**reply, "result": {**result, "capability": {"token": capability.get("token"),
                                                         "uses": uses}}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    scrub_environment()  # before anything else: no secret reaches the plugin's code
    options = parse_args(argv)
    try:
        if options.plugin_dir is not None and options.entry is not None:
            plugin = load_plugin_file(options.plugin_dir, options.entry)
        else:
            assert options.module is not None
            plugin = load_plugin(options.module)
        tools = check_plugin(plugin)
        if options.declared is not None:
            check_declared(tools, options.declared)
    except Exception:
        _log(f"cannot load the plugin {options.module or options.entry}:")
        traceback.print_exc(file=sys.stderr)
        return 2
    try:
        return asyncio.run(Host(plugin, tools, options).serve())
    except (FluffyError, OSError) as exc:
        _log(f"stopped: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
