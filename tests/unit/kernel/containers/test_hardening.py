"""Docker's and Podman's translations of the hardening say the same thing.

Each runtime's request body is rendered by its own SDK, offline, exactly as it goes
over the wire; each is then read back into a :class:`Hardening` by a reader written
from the engine's API documentation, and must give back what :func:`harden` decided.
A setting an SDK drops (podman ignores ``nano_cpus``) or one runtime forgets (``init``)
fails here.  tests/integration/test_hardening_engines.py checks what the engines made.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import docker
import msgspec
import pytest
from podman.domain.containers_create import CreateMixin

from fluffy.errors import SandboxConfigError
from fluffy.kernel.containers.config import TEMPLATES, template_config
from fluffy.kernel.containers.docker_runtime import docker_container_config, docker_host_config
from fluffy.kernel.containers.hardening import Hardening, Tmpfs, harden
from fluffy.kernel.containers.manager import TMPFS
from fluffy.kernel.containers.podman_runtime import TMPFS_EMPTY, podman_body, podman_payload
from fluffy.kernel.containers.runtime import ContainerSpec, Mount


def _spec(template: str, project: Path) -> ContainerSpec:
    config = template_config(template)
    return ContainerSpec(
        name="fluffy-test",
        image="fluffy/test:1",
        command=["true"],
        labels={},
        mounts=(Mount(project, "/workspace"), Mount(project / "out", "/scratch", False)),
        memory_bytes=config.memory_bytes,
        nano_cpus=config.nano_cpus,
        pids_limit=config.max_pids,
        seccomp_profile=config.seccomp_profile,
        seccomp_json='{"defaultAction": "SCMP_ACT_ERRNO"}',
        seccomp_path=Path("/var/lib/fluffy/seccomp/strict.json"),
        tmpfs=dict(TMPFS),
        user="10001:10001",
    )


def _docker_bodies(hardening: Hardening) -> tuple[dict[str, Any], dict[str, Any]]:
    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
    try:
        host = api.create_host_config(**docker_host_config(hardening))
        container = api.create_container_config(
            "fluffy/test:1", ["true"], **docker_container_config(hardening)
        )
    finally:
        api.close()
    return dict(container), dict(host)


def read_docker(container: dict[str, Any], host: dict[str, Any]) -> Hardening:
    """The hardening a Docker create request (Config, HostConfig) asks for."""
    options = dict(opt.split("=", 1) if "=" in opt else (opt, "") for opt in host["SecurityOpt"])
    nnp = options.pop("no-new-privileges:true", None) == ""
    binds = []
    for bind in host["Binds"]:
        source, target, mode = bind.split(":")
        binds.append(Mount(Path(source), target, mode == "ro"))
    assert host["MemorySwap"] == host["Memory"]  # no swap beyond the limit
    assert container["NetworkDisabled"] is (host["NetworkMode"] == "none")
    return Hardening(
        user=container["User"],
        memory_bytes=host["Memory"],
        nano_cpus=host["NanoCpus"],
        pids_limit=host["PidsLimit"],
        seccomp_profile="(by content)",
        seccomp_json=options.pop("seccomp"),
        seccomp_path=None,
        binds=tuple(binds),
        tmpfs=tuple(Tmpfs(t, tuple(o.split(","))) for t, o in host["Tmpfs"].items()),
        read_only_rootfs=host["ReadonlyRootfs"],
        no_new_privileges=nnp and not options,
        cap_drop=tuple(host["CapDrop"]),
        cap_add=tuple(host.get("CapAdd") or ()),
        network_mode=host["NetworkMode"],
        ipc_mode=host["IpcMode"],
        init=host["Init"],
    )


def read_podman(body: dict[str, Any]) -> Hardening:
    """The hardening a libpod create request (SpecGenerator) asks for."""
    limits = body["resource_limits"]
    assert limits["memory"]["swap"] == limits["memory"]["limit"]
    cpu = limits["cpu"]
    binds, tmpfs = [], []
    for mount in body["mounts"]:
        if mount["type"] == "bind":
            read_only = "ro" in mount.get("options", [])
            binds.append(Mount(Path(mount["source"]), mount["destination"], read_only))
        else:
            assert mount["type"] == "tmpfs" and mount["options"][-1] == TMPFS_EMPTY
            tmpfs.append(Tmpfs(mount["destination"], tuple(mount["options"][:-1])))
    return Hardening(
        user=body["user"],
        memory_bytes=limits["memory"]["limit"],
        nano_cpus=cpu["quota"] * 1_000_000_000 // cpu["period"] if cpu["quota"] else 0,
        pids_limit=limits["pids"]["limit"],
        seccomp_profile="(by content)",
        seccomp_json="",
        seccomp_path=Path(body["seccomp_profile_path"]),
        binds=tuple(binds),
        tmpfs=tuple(tmpfs),
        read_only_rootfs=body["read_only_filesystem"],
        no_new_privileges=body["no_new_privileges"],
        cap_drop=tuple(body["cap_drop"]),
        cap_add=tuple(body["cap_add"] or ()),
        network_mode=body["netns"]["nsmode"],
        ipc_mode=body["ipcns"]["nsmode"],
        init=body["init"],
    )


def _podman_body(hardening: Hardening) -> dict[str, Any]:
    payload = {"image": "fluffy/test:1", "command": ["true"], **podman_payload(hardening)}
    return podman_body(CreateMixin._render_payload(payload), hardening)


def _neutral(hardening: Hardening) -> Hardening:
    """Without the seccomp profile's engine-specific form (JSON inline or a file)."""
    return dataclasses.replace(
        hardening, seccomp_profile="(by content)", seccomp_json="", seccomp_path=None
    )


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_docker_and_podman_requests_ask_for_the_same_hardening(
    template: str, tmp_path: Path
) -> None:
    spec = _spec(template, tmp_path)
    for_docker = harden(spec, seccomp="json")
    for_podman = harden(spec, seccomp="path")
    from_docker = read_docker(*_docker_bodies(for_docker))
    from_podman = read_podman(_podman_body(for_podman))
    assert from_docker.seccomp_json == spec.seccomp_json
    assert from_podman.seccomp_path == spec.seccomp_path
    assert _neutral(from_docker) == _neutral(for_docker)
    assert _neutral(from_podman) == _neutral(for_podman)
    assert _neutral(from_docker) == _neutral(from_podman)


def test_the_hardening_follows_the_sandbox_config(tmp_path: Path) -> None:
    hardening = harden(_spec("policy-sandbox", tmp_path), seccomp="json")
    assert (hardening.memory_bytes, hardening.nano_cpus, hardening.pids_limit) == (
        128 * 2**20,
        250_000_000,
        5,
    )
    assert (hardening.cpu_period_us, hardening.cpu_quota_us) == (100_000, 25_000)
    assert hardening.user == "10001:10001" and hardening.cap_drop == ("ALL",)
    assert (hardening.network_mode, hardening.ipc_mode, hardening.init) == (
        "none",
        "private",
        False,
    )
    assert hardening.read_only_rootfs and hardening.no_new_privileges and not hardening.cap_add
    assert {t.target for t in hardening.tmpfs} == set(TMPFS)
    assert all({"noexec", "nosuid", "nodev"} <= set(t.options) for t in hardening.tmpfs)


@pytest.mark.parametrize("form", ["json", "path"])
def test_a_spec_without_the_engines_profile_form_is_refused(form: str, tmp_path: Path) -> None:
    spec = _spec("code-executor", tmp_path)
    bare = msgspec.structs.replace(spec, seccomp_json="", seccomp_path=None)
    with pytest.raises(SandboxConfigError) as info:
        harden(bare, seccomp=form)
    assert "no seccomp profile" in info.value.what


@pytest.mark.parametrize("user", ["0:0", "root", "fluffy:fluffy"])
def test_root_or_named_users_are_refused(user: str, tmp_path: Path) -> None:
    spec = msgspec.structs.replace(_spec("code-executor", tmp_path), user=user)
    with pytest.raises(SandboxConfigError):
        harden(spec, seccomp="json")


def test_engine_sockets_are_never_mounted(tmp_path: Path) -> None:
    spec = msgspec.structs.replace(
        _spec("code-executor", tmp_path), mounts=(Mount(Path("/var/run"), "/x"),)
    )
    with pytest.raises(SandboxConfigError):
        harden(spec, seccomp="path")
