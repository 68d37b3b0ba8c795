"""`fluffy audit log` shows what just happened: it asks the running kernel to commit the
operational entries it holds (``audit.flush``) before it reads the database."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fluffy.cli.audit import _flush_running
from fluffy.errors import PeerRejected
from fluffy.ipc.client import AsyncClient
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import entries
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.syscalls.audit import audit_methods

pytestmark = pytest.mark.unit


def _sandbox_events(state: Path) -> list[dict[str, object]]:
    return [e for e in entries(state) if e["event_type"] == "sandbox_created"]


def test_the_cli_reads_what_the_kernel_still_held(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def body() -> tuple[int, int]:
        audit = await AuditLog.open(state, flush_interval_s=3600)  # holds entries for long
        await audit.record(Event("kernel_start", input_summary="test"))
        server = KernelServer(audit_methods(audit))
        await server.listen(tmp_path / "run" / "kernel.sock", binding="cli")
        try:
            audit.record_nowait(Event("sandbox_created", input_summary="a pool sandbox"))
            before = len(await asyncio.to_thread(_sandbox_events, state))
            await asyncio.to_thread(_flush_running, state)  # what `fluffy audit log` does
            after = len(await asyncio.to_thread(_sandbox_events, state))
        finally:
            await server.close()
            await audit.close()
        return before, after

    assert asyncio.run(body()) == (0, 1)


def test_only_the_cli_may_flush(tmp_path: Path) -> None:
    async def body() -> None:
        audit = await AuditLog.open(tmp_path / "state")
        await audit.record(Event("kernel_start", input_summary="test"))
        server = KernelServer(audit_methods(audit))
        path = tmp_path / "run" / "plugin.sock"
        await server.listen(path, binding="plugin:x")
        try:
            client = await AsyncClient.connect(str(path))
            try:
                with pytest.raises(PeerRejected):
                    await client.call("audit.flush")
            finally:
                await client.close()
        finally:
            await server.close()
            await audit.close()

    asyncio.run(body())


def test_no_running_kernel_reads_the_log_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    _flush_running(tmp_path / "state")  # no socket: nothing to ask, no error
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "kernel.sock").write_text("")  # a stale path: no answer
    _flush_running(tmp_path / "state")
