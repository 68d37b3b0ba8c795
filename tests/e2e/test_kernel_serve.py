"""`fluffy kernel serve` as a process: answers ping, refuses junk, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from fluffy.errors import UnknownMethod
from fluffy.ipc.client import SyncClient

FLUFFY = str(Path(sys.executable).parent / "fluffy")


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the kernel did not create its socket"
        time.sleep(0.05)


def test_serve_ping_and_sigterm(tmp_path: Path) -> None:
    socket_path = tmp_path / "run" / "kernel.sock"
    proc = subprocess.Popen(
        [
            FLUFFY,
            "kernel",
            "serve",
            "--socket",
            str(socket_path),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(socket_path, proc)
        assert oct(socket_path.stat().st_mode & 0o777) == oct(0o600)
        assert oct(socket_path.parent.stat().st_mode & 0o777) == oct(0o700)
        with SyncClient(str(socket_path), timeout=5) as client:
            assert client.call("kernel.ping")["pong"] is True
            try:
                client.call("shell.run", {"cmd": "rm -rf /"})
                raise AssertionError("an unknown method ran")
            except UnknownMethod:
                pass
            assert client.call("kernel.ping")["pong"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not socket_path.exists()
        assert "stopped" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_serve_refuses_a_missing_project(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            FLUFFY,
            "kernel",
            "serve",
            "--socket",
            str(tmp_path / "k.sock"),
            "--state-dir",
            str(tmp_path / "s"),
            "--project",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 3
    assert "does not exist" in proc.stderr and "Fix:" in proc.stderr
