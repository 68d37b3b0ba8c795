"""The syscall API window over real sockets, and what a plugin's own socket allows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import PluginIncompatible, PolicyError, VersionUnsupported
from fluffy.ipc.client import AsyncClient, SyncClient
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.plugins.handshake import (
    CURRENT_API_VERSION,
    api_window,
    check_min_api_version,
    check_negotiated,
)
from fluffy.kernel.plugins.store import PluginStore
from fluffy.kernel.syscalls.kernel import default_methods
from fluffy.kernel.tools.sandbox.pluginjob import Job, ThirdPartyCode
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from tests.unit.plugin_support import tool

pytestmark = pytest.mark.unit


def test_the_window_is_the_latest_two_integer_versions() -> None:
    assert api_window() == (CURRENT_API_VERSION - 1, CURRENT_API_VERSION)


def test_min_api_version_above_current_is_refused_naming_the_range() -> None:
    check_min_api_version("ok-tool", CURRENT_API_VERSION)
    check_min_api_version("old-tool", 0)
    with pytest.raises(PluginIncompatible) as caught:
        check_min_api_version("new-tool", CURRENT_API_VERSION + 1)
    low, high = api_window()
    assert caught.value.code == "plugin.api_incompatible"
    assert f"this kernel speaks versions {low} to {high}" in caught.value.what
    assert f"[{low}, {high}]" in caught.value.why


def test_a_connection_below_the_manifests_minimum_gets_no_work() -> None:
    check_negotiated("p", 1, 1)
    with pytest.raises(VersionUnsupported, match="needs at least 1"):
        check_negotiated("p", 0, 1)


def test_the_handshake_accepts_the_window_and_refuses_outside_it(tmp_path: Path) -> None:
    low, high = api_window()

    async def main() -> None:
        server = KernelServer(default_methods())
        sock = tmp_path / "run" / "k.sock"
        await server.listen(sock)
        try:
            for version in (low, high):
                client = await AsyncClient.connect(str(sock), api_version=version)
                assert client.ack is not None
                assert client.ack.negotiated_api_version == version
                assert tuple(client.ack.supported_api_versions) == (low, high)
                assert (await client.call("kernel.ping"))["pong"] is True
                await client.close()
            for version in (low - 1, high + 1):
                with pytest.raises(VersionUnsupported) as caught:
                    await AsyncClient.connect(str(sock), api_version=version)
                assert f"this kernel speaks versions {low} to {high}" in str(caught.value)
        finally:
            await server.close()
        assert server.stats["ipc.version_unsupported"] == 2

    asyncio.run(main())


def test_a_plugin_socket_denies_and_audits_everything_but_its_own_methods(tmp_path: Path) -> None:
    """A hostile plugin calling syscalls on its socket: denied, with an audit entry each."""
    state = tmp_path / "state"
    plugin = "demo-tool"
    binding = f"tool:{plugin}:c1"

    async def main() -> list[Any]:
        audit = await AuditLog.open(state)
        await audit.record(Event("kernel_start", input_summary="test"))

        def no_engine() -> Any:
            raise AssertionError("no sandbox in this test")

        runner = PluginRunner(no_engine, tmp_path, environment=dict, audit=audit)
        runner.third_party[plugin] = ThirdPartyCode(
            PluginStore(tmp_path / "store"), plugin, "plugin.py", 1, [tool()], ("fs.read",)
        )
        server = KernelServer(runner.socket.methods(plugin))
        server.observer = runner.socket.observer()
        runner.jobs[binding] = Job("c1", "demo.echo", {}, "strict", 1, plugin)
        runner.jobs[binding].placed.set()
        sock = tmp_path / "ipc" / "kernel.sock"
        await server.listen(sock, binding=binding)
        answers: list[Any] = []

        def hostile() -> None:
            # SyncClient: AsyncClient does not relay non-IPC error codes (see the report)
            with (
                SyncClient(str(sock), plugin_name=plugin, api_version=0) as old,
                pytest.raises(VersionUnsupported, match="needs at least 1"),
            ):
                old.call("tool.next")
            with SyncClient(str(sock), plugin_name=plugin) as client:
                for method, params in (
                    ("fs.write", {"path": "src/x.py", "content": "evil"}),
                    ("fs.read", {"path": ".fluffy/policy.yaml"}),
                    ("policy.update", {"text": "capabilities: []", "approve": True}),
                ):
                    with pytest.raises(PolicyError) as caught:
                        client.call(method, params)
                    answers.append(f"{caught.value.what} ({caught.value.why})")
                job = client.call("tool.next")  # its own methods still work
                assert job["call_id"] == "c1" and job["tool"] == "demo.echo"
                client.call("tool.result", {"call_id": "c1", "ok": True, "result": {}})

        try:
            await asyncio.to_thread(hostile)
        finally:
            await server.close()
            await audit.close()
        return answers

    answers = asyncio.run(main())
    write, read, update = answers
    assert write.startswith("plugin demo-tool may not call fs.write (fs.write is not among")
    assert read.startswith("plugin demo-tool may not call fs.read (fs.read is among demo-tool's")
    assert "serves tool.next, tool.files and tool.result only" in read
    assert update.startswith("plugin demo-tool may not call policy.update (policy.update is not")
    recorded = [e for e in entries(state, Filters(event_type="syscall"))]
    denied = {
        e["syscall_type"]: e for e in recorded if e["policy_rule_name"] == "kernel.plugin_socket"
    }
    assert set(denied) == {"fs.write", "fs.read", "policy.update"}
    for entry in denied.values():
        assert entry["policy_decision"] == "denied"
        assert entry["caller"] == f"plugin:{plugin}@{binding}"
        assert "required capabilities" in entry["deny_reason"]
    assert "evil" in denied["fs.write"]["input_summary"]
    methods = [e["syscall_type"] for e in recorded]
    assert "tool.result" not in methods  # allowed calls are not entries of their own
