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

Start-up runs without the cyclic garbage collector (:func:`starting`): the imports and
the set-up make hundreds of thousands of objects that live as long as the process, and
the collector walked them again and again while they were made (123 young, 11 middle
and one full collection during the imports alone: ~40 ms of L1's ~330 ms of imports).
Once the kernel listens (:func:`settled`) they are frozen out of the collector's way
(``gc.freeze``: later collections never walk them) and collection resumes.  A cycle
left over by start-up itself is kept until the process ends (a one-off, small).
"""

from __future__ import annotations

import gc
import sys

SWITCH_INTERVAL_S = 0.00025


def tune() -> None:
    """Apply the kernel's interpreter settings to this process."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def starting() -> None:
    """Start-up begins: no cyclic collection until :func:`settled`."""
    gc.disable()


def settled() -> None:
    """Start-up is over: freeze what it made and collect again (again: a no-op)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
