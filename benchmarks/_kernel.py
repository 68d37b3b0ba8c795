"""A real ``fluffy kernel serve`` for a benchmark, on a project folder of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

FLUFFY = [sys.executable, "-m", "fluffy"]


@contextlib.contextmanager
def kernel(root: Path, project: Path, engine: str | None) -> Iterator[Path]:
    """Serve ``project`` (state under ``root``); yields the kernel's socket path."""
    sock = root / "run" / "kernel.sock"
    env = {**os.environ, **({"FLUFFY_RUNTIME": engine} if engine else {})}
    proc = subprocess.Popen(
        [*FLUFFY, "kernel", "serve", "--socket", str(sock), "--state-dir",
         str(root / "state"), "--project", str(project)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the kernel did not start: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            time.sleep(0.02)
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def idle_memory_mib(engine: str, project: Path) -> list[float]:
    """Memory in use (MiB) of each running sandbox of ``project`` (between calls: the
    pool's idle ones), as the engine's ``stats`` reports it."""
    listed = subprocess.run(
        [engine, "ps", "-q", "--filter", f"label=org.fluffy.project={project}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    sizes = []
    for container in listed:
        usage = subprocess.run(
            [engine, "stats", "--no-stream", "--format", "{{.MemUsage}}", container],
            capture_output=True, text=True, check=False,
        ).stdout.split("/")[0].strip()  # fmt: skip
        with contextlib.suppress(ValueError):
            sizes.append(_mib(usage))
    return sizes


def _mib(text: str) -> float:
    units = {"KIB": 1 / 1024, "KB": 1 / 1024, "MIB": 1.0, "MB": 1.0, "GIB": 1024.0, "GB": 1024.0,
             "B": 1 / 2**20}  # fmt: skip
    upper = text.upper()
    for unit, factor in units.items():
        if upper.endswith(unit):
            return float(upper[: -len(unit)]) * factor
    raise ValueError(text)
