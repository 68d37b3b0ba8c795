"""``fluffy kernel serve``: the kernel process in the foreground (development, tests).

It listens on one Unix socket (0600 in a 0700 folder), answers the method table, and
shuts down cleanly on SIGTERM or SIGINT.  In production bootstrap starts the same
process inside the L1 container.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from fluffy.errors import ConfigError
from fluffy.kernel.ipc.methods import default_methods
from fluffy.kernel.ipc.server import KernelServer, Limits


async def serve(
    socket_path: Path,
    state_dir: Path,
    project: Path | None = None,
    limits: Limits | None = None,
) -> int:
    if project is not None and not project.is_dir():
        raise ConfigError(
            f"project directory {project} does not exist",
            fix="Pass an existing directory with --project.",
        )
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = KernelServer(default_methods(), limits or Limits())
    await server.listen(socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"fluffy kernel listening on {socket_path}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    print("fluffy kernel stopped", file=sys.stderr, flush=True)
    return 0


def main(socket_path: Path, state_dir: Path, project: Path | None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(serve(socket_path, state_dir, project))
