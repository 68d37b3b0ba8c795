"""Docker and Podman make the same sandbox from the same SandboxConfig.

One sandbox per engine, from one config, through the container manager; then what each
engine *reports* (its Docker-compatible inspect) and what the process inside *sees*
(/proc/self/status of a process run in it, /proc/mounts) are reduced to the
security-relevant fields and compared.
The request bodies are compared offline in tests/unit/kernel/containers/test_hardening.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.containers.config import SandboxConfig, template_config
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.factory import open_runtime
from fluffy.kernel.containers.manager import ContainerManager
from tests.conftest import connect_engine

ENGINES = ("docker", "podman")
#: A config that sets every option that reaches the engine.
CONFIG = {"memory_limit": "96MiB", "cpu_limit": 0.5, "max_pids": 7, "max_duration": "60s"}
#: The capabilities both engines give a container by default (Podman, asked to drop ALL,
#: reports these one by one; Docker reports "ALL").
DEFAULT_CAPS = frozenset(
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "NET_RAW",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
)
_STATUS_FIELDS = ("Seccomp", "NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    opened = {name: connect_engine(name) for name in ENGINES}
    try:
        yield opened
    finally:
        for engine in opened.values():
            engine.close()


def _cpus(host: dict[str, Any]) -> float:
    if host.get("NanoCpus"):
        return float(host["NanoCpus"]) / 1e9
    if host.get("CpuQuota") and host.get("CpuPeriod"):
        return float(host["CpuQuota"]) / float(host["CpuPeriod"])
    return 0.0  # no limit


def _caps_kept(host: dict[str, Any]) -> str:
    dropped = {c.removeprefix("CAP_") for c in host.get("CapDrop") or ()}
    added = sorted(c.removeprefix("CAP_") for c in host.get("CapAdd") or ())
    if "ALL" in dropped or dropped >= DEFAULT_CAPS:
        return "none" + (f" + {added}" if added else "")
    return f"the defaults but {sorted(dropped)}" + (f" + {added}" if added else "")


def _tmpfs(options: str) -> frozenset[str]:
    """The options that matter (engines add their own: rprivate, tmpcopyup...)."""
    return frozenset(
        o for o in options.split(",") if o in {"noexec", "nosuid", "nodev"} or "size=" in o
    )


def _effective(data: dict[str, Any]) -> dict[str, Any]:
    """The security fields of a Docker-compatible inspect, engine spellings unified."""
    host, config = data["HostConfig"], data["Config"]
    options = [o.split("=", 1)[0].replace(":true", "") for o in host.get("SecurityOpt") or ()]
    return {
        "caps": _caps_kept(host),
        "no_new_privileges": "no-new-privileges" in options,
        "read_only_rootfs": host["ReadonlyRootfs"],
        "user": config["User"],
        "pids_limit": host["PidsLimit"],
        "memory": host["Memory"],
        "memory_swap": host["MemorySwap"],
        "cpus": _cpus(host),
        "network_mode": host["NetworkMode"],
        "privileged": host["Privileged"],
        "init": bool(host.get("Init")),
        "tmpfs": {k: _tmpfs(v) for k, v in (host.get("Tmpfs") or {}).items()},
        "mounts": sorted((m["Destination"], m["RW"]) for m in data["Mounts"]),
    }


#: One process tree for all the looks inside: the sandbox allows 7 processes, and a
#: finished exec's processes may still count for a moment, so four execs in a row could
#: be refused ("read init-p: connection reset by peer") on a busy machine.
_LOOK = (
    "cat /proc/self/status; echo @@; cat /proc/mounts; echo @@; ls -A /tmp; echo @@; "
    "ls /sys/class/net"
)


def _inside(manager: ContainerManager, container_id: str) -> dict[str, Any]:
    """What the sandbox's own processes see of their privileges and file systems.  An
    exec the engine refused (a CI run got nothing back: the sandbox's process limit,
    still holding a moment ago's exec) is tried again until a deadline."""
    deadline = time.monotonic() + 30
    while True:
        seen = manager.runtime.run(container_id, ["sh", "-c", _LOOK], timeout=30)
        parts = seen.stdout.split("@@\n")
        if len(parts) == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(parts) == 4, (seen.exit_code, seen.stdout[-500:], seen.stderr[-500:])
    status, mounts, tmp_listing, network = parts
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    by_target = {line.split()[1]: line.split() for line in mounts.splitlines()}
    root_options = set(by_target["/"][3].split(","))
    tmp = by_target["/tmp"]
    return {
        **{name: fields[name].strip() for name in _STATUS_FIELDS},
        "root_read_only": "ro" in root_options,
        "tmp": (tmp[2], _tmpfs(tmp[3])),
        "tmp_empty": tmp_listing == "",
        "workspace_read_only": "ro" in by_target["/workspace"][3].split(","),
        "interfaces": network.split(),
    }


def _sandbox_seen_by(
    engine: Engine, config: SandboxConfig, root: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    from fluffy.images.templates import template_images

    manager = ContainerManager(open_runtime(engine), template_images(engine), root=root)
    sandbox = manager.create(config, ["sleep", "60"])
    try:
        data: dict[str, Any] = engine.client.api.inspect_container(sandbox.container_id)
        return _effective(data), _inside(manager, sandbox.container_id or "")
    finally:
        manager.destroy(sandbox)
        manager.close()


def test_docker_and_podman_make_the_same_sandbox(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    config = template_config("code-executor", project_dir=project, **CONFIG)
    seen = {
        name: _sandbox_seen_by(engine, config, tmp_path / name) for name, engine in engines.items()
    }
    (docker_inspect, docker_inside), (podman_inspect, podman_inside) = (
        seen["docker"],
        seen["podman"],
    )
    assert docker_inspect == podman_inspect
    assert docker_inside == podman_inside
    # and what they agree on is the hardening, not an agreement on something weaker
    assert docker_inspect["caps"] == "none" and docker_inspect["no_new_privileges"]
    assert docker_inspect["read_only_rootfs"] and not docker_inspect["privileged"]
    assert (docker_inspect["pids_limit"], docker_inspect["cpus"]) == (7, 0.5)
    assert docker_inspect["memory"] == docker_inspect["memory_swap"] == 96 * 2**20
    assert docker_inspect["network_mode"] == "none" and not docker_inspect["init"]
    assert docker_inspect["mounts"] == [("/workspace", False)]
    assert docker_inside["Seccomp"] == "2" and docker_inside["NoNewPrivs"] == "1"
    assert docker_inside["CapEff"] == docker_inside["CapBnd"] == "0" * 16
    assert docker_inside["root_read_only"] and docker_inside["workspace_read_only"]
    # the test runner's /tmp: tests may run what they write there (ADR-060), nothing setuid
    assert docker_inside["tmp"] == ("tmpfs", frozenset({"nosuid", "nodev", "size=262144k"}))
    assert docker_inside["tmp_empty"] and docker_inside["interfaces"] == ["lo"]


def test_a_sandbox_that_runs_no_tests_keeps_tmp_noexec(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    config = template_config("mcp-server", project_dir=project)
    for name, engine in engines.items():
        from fluffy.images.templates import template_images

        manager = ContainerManager(
            open_runtime(engine), template_images(engine), root=tmp_path / name
        )
        sandbox = manager.create(config, ["sleep", "60"])
        try:
            mounts = manager.runtime.run(
                sandbox.container_id or "", ["cat", "/proc/mounts"], timeout=30
            )
        finally:
            manager.destroy(sandbox)
            manager.close()
        tmp = next(line.split() for line in mounts.stdout.splitlines() if line.split()[1] == "/tmp")
        assert tmp[2] == "tmpfs", (name, tmp)
        assert {"noexec", "nosuid", "nodev"} <= _tmpfs(tmp[3]), (name, tmp)
