"""Interpreter settings of the kernel process (ADR-026).

The kernel's event loop shares the GIL with worker threads: aiosqlite's (the audit
writer's buffered commits, the workflow store), ``asyncio.to_thread`` (engine SDK
calls).  Such a thread releases the GIL around every SQLite step or system call and
must win it back to go on; while the loop is busy it waits for the switch interval,
5 ms by default, at every one of those points.  During a burst of audited calls the
audit writer then made almost no progress until the burst ended (measured: one
100-row commit, taking 109 ms, during a 0.33 s burst of 50,000 events), so its work
added to the burst instead of overlapping it.  A 0.25 ms interval lets it overlap
(9-16 commits during the burst): ``python -m benchmarks.audit`` buffered throughput
went from ~52-62k to ~62-74k events/s on the benchmark machine.  Forced switches
happen only while two threads want the GIL, so an idle kernel pays nothing.
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.00025


def tune() -> None:
    """Apply the kernel's interpreter settings to this process."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
