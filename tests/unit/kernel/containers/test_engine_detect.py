from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fluffy.errors import ConfigError, EngineUnavailable
from fluffy.kernel.containers import engine as engine_module
from fluffy.kernel.containers.engine import candidate_endpoints, connect, install_guide


def test_default_order_is_docker_then_podman() -> None:
    found = candidate_endpoints({"XDG_RUNTIME_DIR": "/run/user/1000"})
    assert [e.engine for e in found] == ["docker", "docker", "podman", "podman"]
    assert found[0].url == "unix:///var/run/docker.sock"
    assert found[2].url == "unix:///run/podman/podman.sock"
    assert found[3].url == "unix:///run/user/1000/podman/podman.sock"


def test_fluffy_runtime_limits_the_search() -> None:
    found = candidate_endpoints({"FLUFFY_RUNTIME": "podman", "XDG_RUNTIME_DIR": "/r"})
    assert {e.engine for e in found} == {"podman"}


def test_explicit_hosts_replace_the_defaults() -> None:
    env = {"DOCKER_HOST": "unix:///tmp/d.sock", "CONTAINER_HOST": "unix:///tmp/p.sock"}
    found = candidate_endpoints(env)
    assert [(e.url, e.source) for e in found] == [
        ("unix:///tmp/d.sock", "DOCKER_HOST"),
        ("unix:///tmp/p.sock", "CONTAINER_HOST"),
    ]


def test_unknown_runtime_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        candidate_endpoints({"FLUFFY_RUNTIME": "lxc"})
    assert "docker" in info.value.fix and "podman" in info.value.fix


def test_missing_socket_gives_the_install_guide(tmp_path: Path) -> None:
    env = {"FLUFFY_RUNTIME": "docker", "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    with pytest.raises(EngineUnavailable) as info:
        connect(env)
    assert "no socket" in info.value.why


def test_without_any_engine_installed_the_fix_is_the_install_guide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module.shutil, "which", lambda _name: None)
    env = {"FLUFFY_RUNTIME": "docker", "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    with pytest.raises(EngineUnavailable) as info:
        connect(env)
    assert info.value.fix == install_guide()


def test_an_installed_but_stopped_docker_gets_a_start_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        engine_module.shutil,
        "which",
        lambda name: "/usr/bin/dockerd" if name == "dockerd" else None,
    )
    env = {"FLUFFY_RUNTIME": "docker", "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    with pytest.raises(EngineUnavailable) as info:
        connect(env)
    assert "not running" in info.value.fix and "systemctl start docker" in info.value.fix


def test_stale_socket_of_a_stopped_engine_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "stopped.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # bound, never listening: what a crashed daemon leaves
        env = {"FLUFFY_RUNTIME": "docker", "DOCKER_HOST": f"unix://{path}"}
        with pytest.raises(EngineUnavailable) as info:
            connect(env, timeout=5)
    assert str(path) in info.value.why


@pytest.mark.parametrize(
    ("platform", "needle"),
    [
        ("linux", "apt install docker.io"),
        ("linux", "dnf install podman"),
        ("darwin", "brew install --cask docker"),
        ("win32", "WSL2"),
    ],
)
def test_install_guide_is_platform_specific(platform: str, needle: str) -> None:
    assert needle in install_guide(platform)
