"""Run one command in a locked-down, throw-away container and collect its output.

This is the narrow primitive the demo, ``fluffy doctor`` and the image tests use.  The
security flags are constants, not options: no network, read-only root filesystem,
every capability dropped, ``no-new-privileges``, the unprivileged user 10001, a pid
limit and a memory limit.  Mounts are read-only unless a caller names a writable
scratch path, which is always a tmpfs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluffy.errors import EngineTimeout, SandboxRunFailed
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.errors import engine_call

#: Every container fluffy creates carries these labels (the garbage collector's key).
LABEL_MANAGED = "org.fluffy.managed"
LABEL_PURPOSE = "org.fluffy.purpose"

#: Hardcoded; see docs/SECURITY.md.
SANDBOX_USER = "10001:10001"
_HARDENING: dict[str, Any] = {
    "network_mode": "none",
    "read_only": True,
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges:true"],
    "user": SANDBOX_USER,
    "ipc_mode": "private",
}


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str
    seconds: float
    container_name: str


@dataclass(frozen=True)
class OneShot:
    """One command in one fresh container."""

    image: str
    command: list[str]
    purpose: str
    readonly_mounts: dict[Path, str] = field(default_factory=dict)
    workdir: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    memory: str = "512m"
    pids_limit: int = 100
    timeout_s: int = 120
    tmpfs: tuple[str, ...] = ("/tmp",)  # noqa: S108 - a private tmpfs inside the sandbox


def run_oneshot(engine: Engine, job: OneShot) -> RunResult:
    """Create, start, wait for, read and remove one container; always removes it."""
    api = engine.client.api
    name = f"fluffy-{job.purpose}-{uuid.uuid4().hex[:12]}"
    binds: dict[str, Mapping[str, str]] = {
        str(host): {"bind": inside, "mode": "ro"} for host, inside in job.readonly_mounts.items()
    }
    host_config = api.create_host_config(
        binds=binds,
        tmpfs={path: "rw,noexec,nosuid,nodev,size=64m" for path in job.tmpfs},
        mem_limit=job.memory,
        memswap_limit=job.memory,
        pids_limit=job.pids_limit,
        **{k: v for k, v in _HARDENING.items() if k != "user"},
    )
    started = time.monotonic()
    with engine_call(f"create sandbox {name} from {job.image}"):
        created = api.create_container(
            job.image,
            command=job.command,
            name=name,
            user=SANDBOX_USER,
            working_dir=job.workdir,
            environment=job.environment,
            host_config=host_config,
            network_disabled=True,
            labels={LABEL_MANAGED: "1", LABEL_PURPOSE: job.purpose},
        )
    container_id = str(created["Id"])
    try:
        with engine_call(f"start sandbox {name}"):
            api.start(container_id)
        try:
            with engine_call(f"wait for sandbox {name}"):
                waited = api.wait(container_id, timeout=job.timeout_s)
        except EngineTimeout as exc:
            raise SandboxRunFailed(
                f"sandbox {name} did not finish within {job.timeout_s:.0f} s",
                why="the command ran past its time limit and was killed",
                fix="Make the command faster or give it a longer limit.",
            ) from exc
        with engine_call(f"read output of sandbox {name}"):
            stdout = api.logs(container_id, stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = api.logs(container_id, stdout=False, stderr=True).decode("utf-8", "replace")
        return RunResult(
            exit_code=int(waited.get("StatusCode", -1)),
            stdout=stdout,
            stderr=stderr,
            seconds=time.monotonic() - started,
            container_name=name,
        )
    finally:
        with engine_call(f"remove sandbox {name}"):
            api.remove_container(container_id, force=True, v=True)
