"""A real client inside a real sibling container talks to the kernel's per-sandbox socket;
the kernel derives the caller's identity from the socket and SO_PEERCRED."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import unavailable

from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.runtime import SANDBOX_UID
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.syscalls.kernel import default_methods

CLIENT = r"""
import json
from fluffy.ipc.client import SyncClient
with SyncClient("/run/fluffy/kernel.sock", plugin_name="probe-plugin", timeout=10) as client:
    print(json.dumps({"ack": client.ack.negotiated_api_version,
                      "ping": client.call("kernel.ping")}))
"""


class ServerThread:
    """The kernel's IPC server on its own event loop, for synchronous tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = KernelServer(default_methods())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def listen(self, path: Path, binding: str) -> None:
        coro = self.server.listen(
            path,
            binding=binding,
            allowed_uids=frozenset({SANDBOX_UID}),
            owner=(SANDBOX_UID, SANDBOX_UID),
        )
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture()
def kernel() -> Iterator[ServerThread]:
    if os.geteuid() != 0:
        unavailable("the per-sandbox socket must be given to uid 10001, which needs root")
    server = ServerThread()
    yield server
    server.stop()


@pytest.mark.parametrize("template", ["ai-provider", "code-executor"])
def test_client_in_a_sibling_container_gets_the_sandbox_identity(
    sandbox_manager: ContainerManager, kernel: ServerThread, tmp_path: Path, template: str
) -> None:
    binding = f"sandbox-{uuid.uuid4().hex[:12]}"
    socket_dir = tmp_path / "ipc" / binding
    socket_dir.mkdir(parents=True)
    os.chown(socket_dir, SANDBOX_UID, SANDBOX_UID)
    kernel.listen(socket_dir / "kernel.sock", binding)
    config = template_config(template, max_duration="60s", kernel_socket_dir=socket_dir)
    outcome = sandbox_manager.run(config, ["python3", "-c", CLIENT], keep=True)
    try:
        assert outcome.exit_code == 0, outcome.stderr
        answer = json.loads(outcome.stdout.strip().splitlines()[-1])
        identity = answer["ping"]["identity"]
        assert answer["ping"]["pong"] is True and answer["ack"] >= 0
        assert identity["binding"] == binding  # the socket says which sandbox this is
        assert identity["plugin_name"] == "probe-plugin"
        assert identity["peer_uid"] == SANDBOX_UID and identity["peer_gid"] == SANDBOX_UID
        # The kernel runs on the host here, so it sees the client's host pid and can map
        # it to the container; across sibling pid namespaces (kernel in L1) pid is 0.
        assert identity["peer_pid"] > 0
        assert identity["container_id"] == outcome.sandbox.container_id
    finally:
        sandbox_manager.destroy(outcome.sandbox)
    assert kernel.server.stats["handshakes"] == 1


def test_another_uid_on_the_sandbox_socket_is_rejected(
    kernel: ServerThread, tmp_path: Path
) -> None:
    from fluffy.errors import PeerRejected
    from fluffy.ipc.client import SyncClient

    socket_dir = tmp_path / "ipc" / "s1"
    socket_dir.mkdir(parents=True)
    kernel.listen(socket_dir / "kernel.sock", "s1")
    os.chmod(socket_dir / "kernel.sock", 0o666)  # even if reachable, uid 0 is not 10001
    with pytest.raises(PeerRejected):
        SyncClient(str(socket_dir / "kernel.sock"), timeout=5)
