"""MCP servers run as local processes for unit tests: the kernel's side (the official
SDK's client session, the socket, the host that puts the server's stdio on it) is the
real one; only the container around the server is left out (the e2e tests have it)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.containers.runtime import ContainerState, ContainerStatus
from fluffy.kernel.mcp.record import McpServer

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "fakes" / "mcp_server" / "server.py"


class LocalRuntime:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def inspect(self, container_id: str) -> ContainerState:
        proc = self.procs[container_id]
        code = proc.poll()
        status = ContainerStatus.RUNNING if code is None else ContainerStatus.EXITED
        return ContainerState(id=container_id, status=status, exit_code=code)

    def logs(self, container_id: str, *, follow: bool = False) -> list[str]:
        proc = self.procs[container_id]
        if proc.poll() is None or proc.stderr is None or proc.stderr.closed:
            return []
        return [proc.stderr.read().decode("utf-8", "replace")]


class LocalManager:
    """Starts each 'sandbox' as a local process running the real MCP host."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runtime = LocalRuntime()
        self.created: list[Any] = []
        self.destroyed: list[str] = []

    def create(self, config: Any, command: list[str], *, call_id: str = "") -> Sandbox:
        self.created.append(config)
        cut = command.index("--")
        # the sandbox's /run/fluffy is the socket folder itself here
        proxy = ["--proxy", str(config.kernel_socket_dir / "proxy.sock")]
        host_options = proxy if "--proxy" in command[:cut] else []
        env = {
            **{k: v for k, v in os.environ.items() if k != "FLUFFY_MCP_SOCKET"},
            **config.environment,
            "PATH": os.environ.get("PATH", ""),
            "FLUFFY_MCP_SOCKET": str(config.kernel_socket_dir / "mcp.sock"),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "fluffy.sandboxes.mcp_host", *host_options, *command[cut:]],
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        sandbox_id = uuid.uuid4().hex[:12]
        self.runtime.procs[str(proc.pid)] = proc
        return Sandbox(
            sandbox_id=sandbox_id,
            template=config.template,
            name=f"local-{sandbox_id}",
            output_dir=self.root,
            container_id=str(proc.pid),
        )

    def destroy(self, sandbox: Sandbox) -> Sandbox:
        proc = self.runtime.procs.get(sandbox.container_id or "")
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        self.destroyed.append(sandbox.sandbox_id)
        return sandbox

    def kill_all(self) -> None:
        for proc in self.runtime.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def fake_server(name: str = "fake", **changes: Any) -> McpServer:
    from fluffy.kernel.mcp.record import McpTool

    tools = [
        McpTool(
            name="echo",
            input_schema={
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        ),
        McpTool(name="crash"),
        McpTool(name="sleep"),
        McpTool(name="fail"),
    ]
    fields: dict[str, Any] = {
        "name": name,
        "command": [sys.executable, str(SERVER)],
        "image": "fluffy/mcp-server:" + "a" * 24,
        "tools": tools,
        **changes,
    }
    return McpServer(**fields)


@pytest.fixture
def local_manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A manager whose sandboxes are local processes of this user."""
    import fluffy.kernel.containers.sandboxio as sandboxio

    monkeypatch.setattr(sandboxio, "sandbox_identity", lambda: (os.getuid(), os.getgid()))
    manager = LocalManager(tmp_path / "s")  # short: socket paths have a limit
    manager.root.mkdir()
    yield manager
    manager.kill_all()
