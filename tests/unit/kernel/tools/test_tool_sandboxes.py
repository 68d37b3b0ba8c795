"""KernelSandboxes: the kernel's engine connection, opened once; closing it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fluffy.kernel.tools.sandbox.sandboxes import KernelSandboxes

pytestmark = pytest.mark.unit


class _Manager:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_closing_waits_for_another_holder_of_an_opened_manager(tmp_path: Path) -> None:
    """Only a manager still being opened (by the start-up sweep) is left to its opener:
    an opened one is closed even while another thread briefly holds it."""
    sandboxes = KernelSandboxes(tmp_path / "state", tmp_path)
    manager = _Manager()
    sandboxes._manager = manager  # type: ignore[assignment]
    held = threading.Event()

    def hold() -> None:
        with sandboxes._lock:
            held.set()
            time.sleep(0.2)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    sandboxes.close()
    thread.join()
    assert manager.closed


def test_closing_leaves_a_manager_being_opened_to_the_sweep(tmp_path: Path) -> None:
    sandboxes = KernelSandboxes(tmp_path / "state", tmp_path)
    with sandboxes._lock:  # the sweep is connecting (no manager yet)
        sandboxes.close()  # returns at once: nothing is active yet
    assert sandboxes._closed
