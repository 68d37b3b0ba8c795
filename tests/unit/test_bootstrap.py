"""Bootstrap: engine detection and its install guide, the constant L1 flags, settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fluffy.bootstrap import __main__ as boot_main
from fluffy.bootstrap import engine as boot_engine
from fluffy.bootstrap import l1
from fluffy.bootstrap.engine import BootstrapError, Engine


def test_no_engine_gives_the_install_guide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(
        boot_engine,
        "SOCKETS",
        {"docker": (str(tmp_path / "d.sock"),), "podman": (str(tmp_path / "p.sock"),)},
    )
    with pytest.raises(BootstrapError) as caught:
        boot_engine.detect({})
    error = caught.value
    assert error.code == "engine.unavailable"
    assert error.fix == boot_engine.install_guide() and error.why


def test_an_unknown_runtime_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BootstrapError, match="FLUFFY_RUNTIME"):
        boot_engine.detect({"FLUFFY_RUNTIME": "lxc"})


def test_l1_flags_are_constant_and_strict(tmp_path: Path) -> None:
    sock = tmp_path / "engine.sock"
    sock.write_text("")
    project = tmp_path / "project"
    project.mkdir()
    body = l1.spec(
        "img",
        str(project),
        "id",
        str(tmp_path / "run"),
        str(tmp_path / "state"),
        Engine("docker", str(sock)),
    )
    host = body["HostConfig"]
    for key, value in l1.SECURITY.items():
        assert host[key] == value
    assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] and host["NetworkMode"] == "host"
    if os.getuid() == 0:  # a root-owned project: setpriv drops to 10000 with 3 file caps
        assert body["User"] == "0:0" and body["Entrypoint"][0] == "setpriv"
        assert "--reuid=10000" in body["Entrypoint"] and "--regid=10000" in body["Entrypoint"]
        caps = "-all,+dac_override,+fowner,+chown"
        for flag in ("--inh-caps", "--ambient-caps", "--bounding-set"):
            assert f"{flag}={caps}" in body["Entrypoint"]
        assert body["Entrypoint"][-4:] == ["--", *l1.ENTRYPOINT]
        assert sorted(host["CapAdd"]) == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETPCAP",
                                          "SETUID"]  # fmt: skip
        os.chown(project, 1234, 1235)  # owned by a user: the kernel is that user, no caps
        body = l1.spec("img", str(project), "id", "r", "s", Engine("docker", str(sock)))
    assert not body["User"].startswith("0:") and body["Entrypoint"] == l1.ENTRYPOINT
    assert "CapAdd" not in body["HostConfig"]
    assert f"{project}:/fluffy/project:rw" in host["Binds"]
    # no engine socket in L1: only the gate's folder, read-only, and no engine group
    assert not any(str(sock) in bind for bind in host["Binds"]) and "GroupAdd" not in host
    assert f"{tmp_path / 'gate'}:/fluffy/gate:ro" in host["Binds"]
    assert "FLUFFY_ENGINE_SOCKET=/fluffy/gate/engine.sock" in body["Env"]
    assert host["NanoCpus"] >= 10**9  # a CPU limit on L1
    assert f"FLUFFY_HOST_PROJECT={project}" in body["Env"]  # host paths for sibling mounts
    assert "FLUFFY_PROJECT_ID=id" in body["Env"]  # the kernel labels its sandboxes with it


def test_the_kernel_runs_as_the_projects_owner_never_root(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    if os.getuid() != 0:
        assert l1.kernel_user(str(project)) == f"{os.getuid()}:{os.getgid()}"
        return
    assert l1.kernel_user(str(project)) == f"{l1.KERNEL_UID}:{l1.KERNEL_UID}"  # root-owned
    os.chown(project, 1234, 1235)
    assert l1.kernel_user(str(project)) == "1234:1235"  # the merge writes as the owner


def test_settings_are_read_without_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bootstrap.json").write_text(
        json.dumps({"runtime": "podman", "kernel_image": "k:1"})
    )
    monkeypatch.delenv("FLUFFY_RUNTIME", raising=False)
    monkeypatch.delenv("FLUFFY_KERNEL_IMAGE", raising=False)
    env = boot_main.settings(tmp_path)
    assert env["FLUFFY_RUNTIME"] == "podman"
    assert boot_main.kernel_image(tmp_path, env) == "k:1"
    (tmp_path / "bootstrap.json").write_text("{not json")
    assert "FLUFFY_RUNTIME" not in boot_main.settings(tmp_path)
    with pytest.raises(BootstrapError, match="not built"):
        boot_main.kernel_image(tmp_path, {})


def test_a_missing_project_is_a_structured_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert boot_main.main(["run", "--project", str(tmp_path / "nope")]) == 3
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "config.invalid"
