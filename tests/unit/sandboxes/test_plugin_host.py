"""The in-sandbox plugin host as a real process against a kernel-side IPC server."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.kernel.ipc.server import CallContext, KernelServer
from fluffy.kernel.ipc.syscalls import SyscallTable
from fluffy.kernel.tools.sandbox.callfiles import FilesParams, Received, parse_files, write_files
from fluffy.kernel.tools.sandbox.pluginsocket import PLUGIN_SANDBOX, PluginSocket, ToolResultParams

pytestmark = pytest.mark.anyio  # async tests run on asyncio (tests/conftest.py)

MODULE = "fluffy_test_demo_plugin"
PLUGIN_SOURCE = textwrap.dedent(
    """
    import os
    import sys
    import time

    from fluffy.plugins.sdk import ToolDefinition, ToolPlugin

    EVENTS = []
    SCHEMA = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }


    def echo(ctx, args):
        if args["text"] == "crash":
            raise RuntimeError("kaboom in the handler")
        ctx.emit_patch("hello.txt", args["text"])
        child = ctx.run([sys.executable, "-c", "import os; print(' '.join(os.environ))"])
        return {
            "echo": args["text"],
            "host_env": sorted(os.environ),
            "ctx_env": sorted(ctx.env),
            "child_env": sorted(child.stdout.split()),
            "home": os.environ.get("HOME"),
            "mode": ctx.session_mode,
            "sandbox": ctx.sandbox_id,
        }


    def wait_for_resume(ctx, args):
        deadline = time.monotonic() + 30
        while "resume" not in EVENTS and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"events": list(EVENTS)}


    class Demo(ToolPlugin):
        name = "demo-tool"
        version = 3

        def tools(self):
            return [
                ToolDefinition("demo.echo", "Echo", SCHEMA),
                ToolDefinition("demo.wait", "Wait", {"type": "object"}, read_only=True),
            ]

        def handlers(self):
            return {"demo.echo": echo, "demo.wait": wait_for_resume}

        def on_pause(self):
            EVENTS.append("pause")

        def on_resume(self):
            EVENTS.append("resume")


    PLUGIN = Demo()
    """
)
SECRETS = {"OPENAI_API_KEY": "sk-test-not-real", "AWS_SECRET_ACCESS_KEY": "aws-not-real"}
HOST = (sys.executable, "-m", "fluffy.sandboxes.plugin_host")
WAIT = 60.0  # generous: only a hang reaches it


@dataclass
class FakeKernel:
    """The kernel's side of tool.next / tool.files / tool.result, driven by the test;
    output files are received as the kernel receives them (kernel.tools.sandbox.callfiles)."""

    received: Path
    jobs: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    results: asyncio.Queue[tuple[CallContext, Any]] = field(default_factory=asyncio.Queue)
    handed: asyncio.Queue[CallContext] = field(default_factory=asyncio.Queue)
    on_next: Callable[[CallContext], None] | None = None

    async def next(self, context: CallContext, params: Any) -> Any:
        if self.on_next is not None:
            self.on_next(context)
        job = await self.jobs.get()
        self.handed.put_nowait(context)
        return job

    def files(self, context: CallContext, params: FilesParams) -> None:
        call_id = params.call_id
        write_files(self.received / call_id, parse_files(params, call_id), Received())

    def result(self, context: CallContext, params: ToolResultParams) -> None:
        self.results.put_nowait((context, msgspec.to_builtins(params)))

    def table(self) -> SyscallTable:
        """The plugin socket's own declarations (params decoded as the kernel does),
        answered by this fake."""
        table = PluginSocket({}, None).methods("demo-tool")
        table = table.replaced("tool.next", self.next).replaced("tool.files", self.files)
        return table.replaced("tool.result", self.result)


@dataclass
class Sandbox:
    kernel: FakeKernel
    process: asyncio.subprocess.Process
    output: Path
    workspace: Path

    async def result(self) -> tuple[CallContext, dict[str, Any]]:
        context, params = await asyncio.wait_for(self.kernel.results.get(), WAIT)
        return context, params

    async def finish(self) -> tuple[int, str]:
        self.kernel.jobs.put_nowait(None)
        _, err = await asyncio.wait_for(self.process.communicate(), WAIT)
        assert self.process.returncode is not None
        return self.process.returncode, err.decode()


@asynccontextmanager
async def sandbox(tmp_path: Path, *extra: str) -> AsyncIterator[Sandbox]:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / f"{MODULE}.py").write_text(PLUGIN_SOURCE)
    workspace, staged, output = tmp_path / "workspace", tmp_path / "staged", tmp_path / "output"
    for folder in (workspace, staged, output):
        folder.mkdir()
    (workspace / "hello.txt").write_text("old\n")
    kernel = FakeKernel(tmp_path / "received")
    kernel.received.mkdir()
    server = KernelServer(kernel.table())
    folder = Path(tempfile.mkdtemp(prefix="fluffy-host-", dir="/tmp"))  # short socket path
    sock = folder / "kernel.sock"
    binding = PLUGIN_SANDBOX.binding("demo-tool", "sb-test")
    await server.listen(sock, binding=binding, allowed_uids=frozenset({os.getuid()}))
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(modules),
        "PYTHONDONTWRITEBYTECODE": "1",
        **SECRETS,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fluffy.sandboxes.plugin_host",
        MODULE,
        "--socket",
        str(sock),
        "--workspace",
        str(workspace),
        "--staged",
        str(staged),
        "--output",
        str(output),
        *extra,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield Sandbox(kernel, process, output, workspace)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await server.close()
        shutil.rmtree(folder, ignore_errors=True)


def job(call_id: str, tool: str, args: Any) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool": tool,
        "args": args,
        "session_mode": "debug",
        "sandbox_id": "sb-test",
    }


async def test_jobs_run_to_results_and_errors(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as box:
        box.kernel.jobs.put_nowait(job("c1", "demo.echo", {"text": "new\n"}))
        context, first = await box.result()
        assert (context.plugin_name, context.plugin_version) == ("demo-tool", "3")
        assert first["call_id"] == "c1" and first["ok"] is True
        result = first["result"]
        assert result["echo"] == "new\n" and result["mode"] == "debug"
        assert result["sandbox"] == "sb-test"
        assert result["changes"] == [{"path": "hello.txt", "op": "patch", "file": "0.diff"}]
        assert (box.output / "c1" / "0.diff").is_file()  # written in the sandbox,
        diff = (box.kernel.received / "c1" / "0.diff").read_text()  # sent to the kernel
        assert diff == "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-old\n+new\n"
        assert (box.workspace / "hello.txt").read_text() == "old\n"

        box.kernel.jobs.put_nowait(job("c2", "demo.echo", {"text": 5}))
        _, invalid = await box.result()
        assert invalid["call_id"] == "c2" and invalid["ok"] is False
        assert invalid["error"]["code"] == "tool.input_invalid"
        assert "args.text: expected string" in invalid["error"]["message"]

        box.kernel.jobs.put_nowait(job("c3", "demo.echo", {"text": "crash"}))
        _, crashed = await box.result()
        assert crashed["ok"] is False and crashed["error"]["code"] == "tool.failed"
        message = crashed["error"]["message"]
        assert "RuntimeError: kaboom in the handler" in message
        assert "Traceback" not in message and "Fix:" in message

        box.kernel.jobs.put_nowait(job("c4", "demo.missing", {}))
        _, missing = await box.result()
        assert missing["error"]["code"] == "tool.not_found"

        code, stderr = await box.finish()
        assert code == 0
        assert "Traceback" in stderr and "kaboom in the handler" in stderr


async def test_secrets_in_the_environment_never_reach_a_tool(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as box:
        box.kernel.jobs.put_nowait(job("c1", "demo.echo", {"text": "x"}))
        _, reply = await box.result()
        result = reply["result"]
        for seen in (result["host_env"], result["ctx_env"], result["child_env"]):
            assert "PATH" in seen  # the allow-list is kept...
            assert not set(SECRETS) & set(seen)  # ...and nothing else
            assert "PYTHONPATH" not in seen
        assert result["home"] == "/tmp"
        assert (await box.finish())[0] == 0


async def test_pause_and_resume_reach_the_hooks_while_a_handler_runs(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as box:
        box.kernel.jobs.put_nowait(job("w1", "demo.wait", {}))
        context = await asyncio.wait_for(box.kernel.handed.get(), WAIT)
        context.send_event("tool.pause", {"grace_s": 1})
        context.send_event("tool.resume", {})
        _, reply = await box.result()
        # the handler waited for on_resume: the host served events while it ran
        assert reply["ok"] is True and reply["result"] == {"events": ["pause", "resume"]}
        assert (await box.finish())[0] == 0


async def test_the_host_reconnects_when_the_connection_drops_during_a_pause(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as box:
        box.kernel.jobs.put_nowait(job("w1", "demo.wait", {}))
        context = await asyncio.wait_for(box.kernel.handed.get(), WAIT)
        context.send_event("tool.pause", {"grace_s": 1})
        context.connection.close()  # the kernel gave up on the frozen connection
        answered, reply = await box.result()
        assert answered.connection is not context.connection  # a new connection
        assert reply["ok"] is True and reply["result"] == {"events": ["pause", "resume"]}
        code, stderr = await box.finish()
        assert code == 0 and "reconnected" in stderr


async def test_a_drop_without_a_pause_ends_the_host(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as box:
        box.kernel.on_next = lambda context: context.connection.close()
        code = await asyncio.wait_for(box.process.wait(), WAIT)
        assert code == 1
        assert box.kernel.results.empty()


def test_a_module_without_a_plugin_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "not_a_plugin.py").write_text("PLUGIN = 42\n")
    done = subprocess.run(
        [*HOST, "not_a_plugin", "--socket", "/no"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 2
    assert "cannot load the plugin not_a_plugin" in done.stderr
    assert "not a ToolPlugin" in done.stderr


def test_the_host_exits_1_when_the_kernel_is_not_there(tmp_path: Path) -> None:
    done = subprocess.run(
        [*HOST, "fluffy.plugins.fs_tool", "--socket", str(tmp_path / "missing.sock")],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 1 and "stopped" in done.stderr


@pytest.mark.parametrize("module", ["fs_tool", "search_tool", "git_tool", "test_tool"])
def test_each_builtin_plugin_loads_in_the_host(module: str) -> None:
    from fluffy.sandboxes.plugin_host import check_plugin, load_plugin

    tools = check_plugin(load_plugin(f"fluffy.plugins.{module}"))
    assert tools and all(name.split(".")[0] in module for name in tools)
