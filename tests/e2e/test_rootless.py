"""Rootless Podman, the strongest setup: a user's own engine runs fluffy's whole session.

A non-root user (made here) with subordinate ids starts Podman's API service as itself,
gets fluffy's images in its own store, and runs `fluffy doctor` and `fluffy demo
--session`: the kernel in L1 and every sandbox in the user's user namespace, the user's
uid kept (UsernsMode keep-id), from task to commit with the audit chain verified.

The user's store is on native overlay (rootless overlay mounts: Linux >= 5.13, the
default there); a store made earlier on vfs, which copies a whole image for every
container and build step, is set aside.  The images are built once, in root's store
(debootstrap needs root for the base), and loaded into the user's (`podman save | podman
load`); the user's `fluffy images build` must find every image current by its content hash.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import connect_engine

pytestmark = pytest.mark.e2e

USER = "fluffy-rootless"
ROOT = Path(__file__).resolve().parents[2]
#: The venv's interpreter may live where the user cannot go (pyenv under /root): the
#: system Python of the same version runs fluffy from the checkout, with the venv's
#: packages (same ABI).
PYTHON = "/usr/bin/python3"
SITE = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
FLUFFY = (PYTHON, "-m", "fluffy")


def _overlay_store(user: pwd.struct_passwd) -> None:
    home = Path(user.pw_dir)
    conf = home / ".config" / "containers" / "storage.conf"
    for folder in (home / ".config", conf.parent):
        folder.mkdir(exist_ok=True)
        os.chown(folder, user.pw_uid, user.pw_gid)
    conf.write_text('[storage]\ndriver = "overlay"\n')
    os.chown(conf, user.pw_uid, user.pw_gid)
    store = home / ".local" / "share" / "containers" / "storage"
    if (store / "vfs-images").exists():  # its database names vfs: podman would refuse
        shutil.rmtree(store)


def _as_user(
    user: pwd.struct_passwd, env: dict[str, str], *argv: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
         *argv],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        cwd=user.pw_dir,
    )  # fmt: skip


@pytest.fixture(scope="module")
def rootless() -> Iterator[dict[str, Any]]:
    from fluffy.images.builder import build_images

    if shutil.which("newuidmap") is None or shutil.which("runuser") is None:
        pytest.fail("rootless Podman needs newuidmap (apt-get install uidmap) and runuser")
    version = subprocess.run([PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    if version != str(sys.version_info[:2]):
        pytest.fail(f"{PYTHON} is {version}, the venv {sys.version_info[:2]}: install it")
    with connect_engine("podman") as engine:  # root's store: the Debian base to hand over
        refs = {status.name: status.ref for status in build_images(engine)}
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
        user = pwd.getpwnam(USER)
    subuid = Path("/etc/subuid").read_text() if Path("/etc/subuid").exists() else ""
    if not any(line.startswith(f"{USER}:") for line in subuid.splitlines()):
        for name in ("/etc/subuid", "/etc/subgid"):
            with open(name, "a") as ids:
                ids.write(f"{USER}:300000:65536\n")
    _overlay_store(user)
    run_dir = Path(f"/run/user/{user.pw_uid}")
    (run_dir / "podman").mkdir(parents=True, exist_ok=True)
    for path in (run_dir, run_dir / "podman"):
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o700)
    sock = run_dir / "podman" / "podman.sock"
    env = {
        "HOME": user.pw_dir, "USER": USER, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": f"{ROOT}:{SITE}", "PYTHONDONTWRITEBYTECODE": "1",
        "XDG_RUNTIME_DIR": str(run_dir), "FLUFFY_RUNTIME": "podman", "LANG": "C.UTF-8",
    }  # fmt: skip
    archive = Path(user.pw_dir) / "fluffy-images.tar"  # where the user can read it
    archive.unlink(missing_ok=True)  # podman save refuses to overwrite one an earlier run left
    try:
        subprocess.run(["podman", "save", "-m", "-o", str(archive), "debian:bookworm-slim",
                        *refs.values()], check=True, capture_output=True)  # fmt: skip
        os.chown(archive, user.pw_uid, user.pw_gid)
        loaded = _as_user(user, env, "podman", "load", "-i", str(archive))
    finally:
        archive.unlink(missing_ok=True)
    assert loaded.returncode == 0, loaded.stderr
    service = subprocess.Popen(
        ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
         "podman", "system", "service", "--time=0", f"unix://{sock}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=user.pw_dir,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert service.poll() is None and time.monotonic() < deadline, "no rootless service"
        time.sleep(0.1)
    env["CONTAINER_HOST"] = f"unix://{sock}"
    try:
        yield {"user": user, "env": env, "refs": refs}
    finally:
        _as_user(user, env, *FLUFFY, "stop", "--project", user.pw_dir, timeout=120)
        # the store outlives the test (the user stays): older fluffy images go
        _as_user(user, env, *FLUFFY, "images", "prune", timeout=300)
        service.terminate()
        service.wait(timeout=30)


def test_a_session_runs_on_a_users_own_rootless_podman(rootless: dict[str, Any]) -> None:
    user, env = rootless["user"], rootless["env"]
    built = _as_user(user, env, *FLUFFY, "images", "build")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    for ref in rootless["refs"].values():  # found by content hash, nothing rebuilt
        assert f"current {ref}" in built.stdout, built.stdout[-3000:]
    doctor = _as_user(user, env, *FLUFFY, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["engine"]["status"] == "ok", checks["engine"]
    driver = _as_user(user, env, "podman", "info", "--format", "{{.Store.GraphDriverName}}")
    assert driver.stdout.strip() == "overlay", driver.stdout + driver.stderr
    info = subprocess.run(["podman", "info", "--format", "{{.Host.CgroupsVersion}}"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert checks["limits"]["status"] == ("warn" if info == "v1" else "ok"), checks["limits"]
    session = _as_user(user, env, *FLUFFY, "demo", "--session")
    out = session.stdout + session.stderr
    assert session.returncode == 0, out[-4000:]
    assert "audit chain verified against the bootstrap's witness" in out
    assert "Done: committed" in out
    # the kernel ran in the user's own store, as the user's uid (keep-id)
    images = _as_user(user, env, "podman", "images", "--format", "{{.Repository}}")
    assert "fluffy/kernel" in images.stdout
