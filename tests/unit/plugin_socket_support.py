"""A plugin's call served on a real socket, for the tests of the plugin socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.tools.sandbox.pluginjob import Job
from fluffy.kernel.tools.sandbox.plugins import PluginRunner


@asynccontextmanager
async def plugin_call(
    tmp_path: Path, binding: str = "tool:demo:c1"
) -> AsyncIterator[tuple[Job, Path]]:
    """Call c1 of plugin demo, handed to a sandbox whose folder is ``tmp_path/out``, served
    on a real socket with ``binding``: (the job, the socket)."""
    runner = PluginRunner(lambda: None, tmp_path, environment=dict)  # type: ignore[arg-type,return-value]
    server = KernelServer(runner.socket.methods("demo"))
    job = Job("c1", "demo.echo", {}, "strict", plugin="demo")
    job.sandbox = Sandbox("sb1", "code-executor", "n", output_dir=tmp_path / "out")
    job.sandbox.output_dir.mkdir()
    job.placed.set()
    runner.jobs[binding] = job
    sock = tmp_path / "ipc" / "kernel.sock"
    await server.listen(sock, binding=binding)
    try:
        yield job, sock
    finally:
        await server.close()
