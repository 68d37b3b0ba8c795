"""`fluffy "task"` on a user's repository, first try: no .fluffy/, the project's own
permissions, the real bootstrap and L1 kernel, a scripted model that writes tests the way
models do -- from task to commit, on Docker and Podman.

Permissions as users have them: a 0700 folder owned by root (``mktemp -d`` as root), a
0700 folder owned by a user, a root-owned repository merged into as root.  fluffy never
changes their owner or modes, and the kernel never runs as root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import connect_engine
from tests.project_support import fixture_wheels, local_index, pip_env, session_steps, shape

FLUFFY = str(Path(sys.executable).parent / "fluffy")
#: One of fluffy's content-hash images (Podman names them with docker.io/ in front).
FLUFFY_IMAGE = re.compile(r"((docker\.io|localhost)/)?fluffy/[a-z0-9-]+:[0-9a-f]{12,64}")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from fluffy.images.spec import REQUIREMENTS_DIR
    from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
    from fluffy.kernel.containers.engine import connect

    with connect() as engine:
        arch = linux_arch(engine.info.arch)
    folder = tmp_path_factory.mktemp("index")
    fixture_wheels(folder, ensure_wheelhouse(REQUIREMENTS_DIR / "code-executor.lock", arch))
    with local_index(folder) as url:
        yield url


@pytest.fixture(scope="module", params=["docker", "podman"])
def kernel_image(request: pytest.FixtureRequest) -> tuple[str, str]:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        refs = {status.name: status.ref for status in build_images(connected)}
    return str(request.param), refs["kernel"]


def stats(project: Path) -> dict[str, tuple[int, int, int]]:
    """(uid, gid, mode) of every file and folder (.git included)."""
    found = {".": project.stat()}
    for path in project.rglob("*"):
        found[path.relative_to(project).as_posix()] = path.lstat()
    return {rel: (s.st_uid, s.st_gid, s.st_mode) for rel, s in found.items()}


CASES = {
    # mktemp -d as root: a 0700 folder owned by root, the repository cloned inside
    "root-owned 0700": {"owner": 0, "mode": 0o700, "kind": "src"},
    # a user's own project, closed to everyone else
    "user-owned 0700": {"owner": 1234, "mode": 0o700, "kind": "flat"},
    # a root-owned repository (root on a cloud machine or CI), merged into as root
    "root-owned repository": {"owner": 0, "mode": 0o755, "kind": "requirements"},
}


@pytest.mark.skipif(os.geteuid() != 0, reason="the permission cases need root to set them up")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_task_on_a_users_repository_goes_from_task_to_commit(
    tmp_path: Path, index: str, kernel_image: tuple[str, str], case: str
) -> None:
    runtime, image = kernel_image
    setup = CASES[case]
    holder = tmp_path / "holder"  # the folder mktemp -d would make
    holder.mkdir()
    project = holder / "repo"
    where = shape(project, str(setup["kind"]))
    markers = plant_shadows(project, tmp_path / "markers")
    persons_work(project)
    owner = int(setup["owner"])
    if owner:
        for path in [holder, project, *project.rglob("*")]:
            os.lchown(path, owner, owner)
        for path in [project, *project.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o700 if path.is_dir() else 0o600)  # umask 077
    holder.chmod(int(setup["mode"]))
    project.chmod(int(setup["mode"]))
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"task": "add triple", "steps": session_steps(where)}))
    before = stats(project)
    env = pip_env(index, dict(os.environ))
    env.update(FLUFFY_HOME=str(tmp_path / "home"), FLUFFY_KERNEL_IMAGE=image,
               FLUFFY_RUNTIME=runtime)  # fmt: skip
    done = subprocess.run(
        [FLUFFY, "add triple", "--script", str(script), "--yes", "--project", str(project)],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        cwd=project,  # as a person runs it: inside the clone
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert not markers.exists() or not list(markers.iterdir()), list(markers.iterdir())
    out = done.stdout
    assert "No .fluffy/ here: fluffy applies its defaults" in out
    assert "red: 1 new or changed test(s) fail on missing code" in out
    assert "Committed " in out, out[-3000:]
    log = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(project), "log", "--format=%s", "-2"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    assert log[:2] == ["Add triple", "notes"]
    after = stats(project)
    for rel, (uid, gid, mode) in before.items():
        if rel in after and not rel.startswith(".git/") and rel != ".git":
            assert after[rel][:2] == (uid, gid), rel  # nobody's files changed owner
            if rel not in (where["code"],):
                assert after[rel][2] == mode, rel  # nor mode
    new = [rel for rel in after if rel not in before and not rel.startswith(".git/")]
    assert where["code"] in new and not any(rel.startswith(".fluffy") for rel in new)
    for rel in new:
        assert after[rel][:2] == (owner, owner), rel  # new files: the project owner's
    status = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(project), "status", "--porcelain"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert sorted(status.splitlines()) == PERSONS_STATUS  # their work, untouched
    committed = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(project), "show", "--name-only",
         "--format=%an <%ae>%n%b", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert committed[0] == "Ann Person <ann@example.org>"  # the person, not "fluffy"
    assert committed[1].startswith("Assisted-by: fluffy (")
    files = sorted(line for line in committed[2:] if line)
    assert files == sorted([where["code"], session_test_path(where)])  # nothing else
    audit_says_each_call_had_its_own_sandbox(tmp_path / "home", env)
    shutil.rmtree(tmp_path / "home", ignore_errors=True)


#: The person's work in progress when the task starts (git status --porcelain, sorted).
PERSONS_STATUS = [" M NOTES.md", "?? .env", "?? scratch.txt", "A  staged.txt"]


def persons_work(project: Path) -> None:
    """What a person has going on: an uncommitted edit, a staged new file, an untracked
    secret and notes; and their identity in the repository's configuration."""

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True)

    (project / "NOTES.md").write_text("# notes\n")
    git("add", "NOTES.md")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "notes")
    (project / "NOTES.md").write_text("# notes\nan edit of mine, not committed\n")
    (project / "staged.txt").write_text("staged by me\n")
    git("add", "staged.txt")
    (project / ".env").write_text("API_TOKEN=person-secret-123\n")
    (project / "scratch.txt").write_text("thinking...\n")
    git("config", "user.name", "Ann Person")
    git("config", "user.email", "ann@example.org")


def session_test_path(where: dict[str, str]) -> str:
    steps = session_steps(where)
    return str(steps[1]["args"]["path"])  # type: ignore[index]


#: Modules a hostile repository ships at its top level, named like what fluffy's Python
#: processes import: on the host (pip for the environment, fluffy for the bootstrap) and
#: in every sandbox (fluffy's tool, model and MCP hosts), where the project is the
#: working folder.  Imported, each leaves a mark (where it can) and stops its process.
SHADOWS = ("fluffy/__init__.py", "pip/__init__.py", "pip/__main__.py")


def plant_shadows(project: Path, markers: Path) -> Path:
    markers.mkdir(mode=0o777)
    code = ("import os, sys\ntry:\n    open(os.path.join({folder!r}, {name!r} + '-' + "
            "str(os.getpid())), 'w').write(repr(sys.argv))\nexcept OSError:\n    pass\n"
            "raise SystemExit('the repository\\'s {name} was imported')\n")  # fmt: skip
    for rel in SHADOWS:
        (project / rel).parent.mkdir(exist_ok=True)
        (project / rel).write_text(code.format(folder=str(markers), name=rel.replace("/", ".")))
    subprocess.run(["git", "-C", str(project), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "-m", "ship shadows"], check=True)  # fmt: skip
    return markers


def audit_says_each_call_had_its_own_sandbox(home: Path, env: dict[str, str]) -> None:
    """The L1 kernel's audit log: each sandboxed tool call names a sandbox that was
    created (template, image, profile) and destroyed after serving that call."""
    (state,) = list((home / "projects").glob("*/state"))

    def entries(kind: str) -> list[dict[str, Any]]:
        out = subprocess.run(
            [FLUFFY, "audit", "log", "--state-dir", str(state), "--type", kind, "--json"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return list(json.loads(out.stdout)["entries"])

    created = {e["sandbox_id"]: e["metadata"] for e in entries("sandbox_created")}
    destroyed = {e["sandbox_id"]: e["metadata"] for e in entries("sandbox_destroyed")}
    calls = [e for e in entries("tool_result") if e.get("sandbox_id")]
    assert len(calls) >= 4  # the writes, the test runs and the commit
    assert len({e["sandbox_id"] for e in calls}) == len(calls)  # one sandbox per call
    for call in calls:
        sandbox = call["sandbox_id"]
        assert created[sandbox]["template"] == "code-executor", created[sandbox]
        assert created[sandbox]["seccomp_profile"] == "standard"
        assert FLUFFY_IMAGE.fullmatch(created[sandbox]["image"]), created[sandbox]
        assert destroyed[sandbox]["call_id"] == call["metadata"]["call_id"]
    assert "ai-provider" in {m["template"] for m in created.values()}  # the model's too


@pytest.mark.skipif(os.geteuid() != 0, reason="the permission cases need root to set them up")
@pytest.mark.parametrize("owner", [0, 1234])
def test_sandbox_run_reads_a_project_closed_to_others(
    tmp_path: Path, kernel_image: tuple[str, str], owner: int
) -> None:
    """`fluffy sandbox run` on a 0700 project: as its owner when that is a user; as the
    sandbox user on a readable copy when it is root's.  Never as root."""
    runtime, _ = kernel_image
    project = tmp_path / "closed"
    project.mkdir(mode=0o700)
    (project / "secret.txt").write_text("only the owner reads this\n")
    (project / "secret.txt").chmod(0o600)
    os.chown(project, owner, owner)
    os.chown(project / "secret.txt", owner, owner)
    done = subprocess.run(
        [FLUFFY, "sandbox", "run", "--template", "code-executor", "--project", str(project),
         "--", "sh", "-c", "id -u; cat /workspace/secret.txt"],
        env={**os.environ, "FLUFFY_RUNTIME": runtime, "FLUFFY_HOME": str(tmp_path / "home")},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    uid, text = done.stdout.split("\n", 1)
    assert int(uid) == (owner or 10001) and text == "only the owner reads this\n"
    assert oct(project.stat().st_mode & 0o777) == "0o700"  # never opened up
