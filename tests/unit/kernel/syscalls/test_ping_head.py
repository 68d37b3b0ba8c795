"""The audit head ``kernel.ping`` sends (the bootstrap's witness keeps it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.syscalls.kernel import witnessed

pytestmark = pytest.mark.unit


def test_ping_sends_the_durable_head_made_once_per_commit(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        head = witnessed(log)
        assert head() is None  # nothing recorded yet
        await log.record(Event("kernel_start"))
        first = head()
        assert first == log.durable_head.to_dict() and first is not None and first["seq"] == 1
        assert head() is first  # the same head: not made again
        log.record_nowait(Event("syscall", input_summary="buffered"))
        assert head() is first  # recorded, not yet committed: not witnessed
        await log.record(Event("policy_update", caller="cli:operator", input_summary="r1"))
        assert head() == log.durable_head.to_dict() and head()["seq"] == 3  # type: ignore[index]
        await log.close()

    asyncio.run(scenario())
