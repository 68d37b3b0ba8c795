"""The kernel's start-up and shutdown (kernel/serve.py): what a start opened is closed
in reverse when a later step fails, as on a clean stop -- the audit log ends with
``kernel_shutdown``, and no database connection is left behind."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import ConfigError
from fluffy.kernel import process_tuning
from fluffy.kernel import serve as serve_module
from fluffy.kernel.audit.query import Filters, entries

pytestmark = pytest.mark.unit


def test_a_start_that_fails_midway_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    real_open = serve_module.WorkflowStore.open

    async def store_open(state_dir: Path) -> Any:
        store = await real_open(state_dir)
        real_close = store.close

        async def close() -> None:
            closed.append("store")
            await real_close()

        store.close = close  # type: ignore[method-assign]
        return store

    async def tools_fail(*_: Any, **__: Any) -> Any:
        raise ConfigError("the tools could not be assembled", why="a test", fix="none")

    monkeypatch.setattr(serve_module.WorkflowStore, "open", store_open)
    monkeypatch.setattr(serve_module, "assemble_tools", tools_fail)
    before = threading.active_count()
    state = tmp_path / "state"
    with pytest.raises(ConfigError, match="could not be assembled"):
        asyncio.run(serve_module.serve(tmp_path / "k.sock", state))
    assert closed == ["store"]
    events = [e["event_type"] for e in entries(state, Filters())]
    assert events[0] == "kernel_start" and events[-1] == "kernel_shutdown", events
    assert list((state / "backups").glob("*.db")), "the state was backed up as on a stop"
    deadline = time.monotonic() + 10  # aiosqlite's threads end once their connection closes
    while threading.active_count() > before:
        assert time.monotonic() < deadline, threading.enumerate()
        time.sleep(0.05)


@pytest.fixture()
def collector() -> Iterator[None]:
    """The test process's collector as it was (the kernel freezes what start-up made)."""
    yield
    gc.unfreeze()
    gc.enable()


def test_start_up_runs_without_the_collector_which_resumes_once_the_kernel_listens(
    tmp_path: Path, collector: None
) -> None:
    seen: dict[str, Any] = {}
    sock = tmp_path / "k.sock"

    async def scenario() -> int:
        process_tuning.starting()
        kernel = asyncio.create_task(serve_module.serve(sock, tmp_path / "state"))
        async with asyncio.timeout(30):
            while not sock.exists():
                seen.setdefault("during", gc.isenabled())
                await asyncio.sleep(0.01)
        seen["after"], seen["frozen"] = gc.isenabled(), gc.get_freeze_count()
        os.kill(os.getpid(), signal.SIGTERM)  # the kernel's own stop
        return await kernel

    assert asyncio.run(scenario()) == 0
    assert seen["during"] is False  # starting: no collection
    assert seen["after"] is True and seen["frozen"] > 10_000, seen


def test_a_start_that_fails_leaves_the_collector_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: None
) -> None:
    async def tools_fail(*_: Any, **__: Any) -> Any:
        raise ConfigError("the tools could not be assembled", why="a test", fix="none")

    monkeypatch.setattr(serve_module, "assemble_tools", tools_fail)
    with pytest.raises(ConfigError):
        serve_module.main(tmp_path / "k.sock", tmp_path / "state", None)
    assert gc.isenabled()


def test_the_chain_is_verified_once_the_kernel_serves_and_a_break_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: None
) -> None:
    """The start does not wait for the chain's verification (its time grows with the log):
    the check is held here until the socket answers, so a start that waited for it would
    never listen.  What it found is recorded before the kernel's shutdown."""
    from fluffy.kernel.audit.recovery import StartupCheck, _chain_break

    listening = threading.Event()
    checked: list[Path] = []

    def chain_check(state_dir: Path, found: Any) -> StartupCheck:
        assert listening.wait(30), "the kernel waited for the chain check to listen"
        checked.append(state_dir)
        detail = "audit chain broken: modified at entry 7: (a test)"
        return StartupCheck("tampered", detail, None, [_chain_break("tampered", detail, None)])

    monkeypatch.setattr(serve_module, "chain_check", chain_check)
    sock, state = tmp_path / "k.sock", tmp_path / "state"

    async def scenario() -> int:
        earlier = await serve_module.open_audit(state)  # a log from an earlier start
        await earlier.close()
        kernel = asyncio.create_task(serve_module.serve(sock, state))
        async with asyncio.timeout(30):
            while not sock.exists():
                await asyncio.sleep(0.01)
        listening.set()
        os.kill(os.getpid(), signal.SIGTERM)
        return await kernel

    assert asyncio.run(scenario()) == 0
    assert checked == [state]
    logged = list(entries(state, Filters()))
    events = [e["event_type"] for e in logged]
    assert events.count("kernel_start") == 2 and events[-1] == "kernel_shutdown", events
    assert events.count("audit_chain_break") == 1, events
    start = [e for e in logged if e["event_type"] == "kernel_start"][-1]
    assert start["metadata"]["database"] == "ok" and "verified next" in start["input_summary"]
    assert events.index("audit_chain_break") > logged.index(start)
