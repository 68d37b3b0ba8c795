"""The L1 kernel container under its bootstrap supervisor, on a real engine.

`fluffy start` brings L1 up healthy; the container carries every hard-coded flag; a
SIGKILLed kernel is restarted with the session restored; a crash loop ends in a
structured error; `fluffy stop` records kernel_shutdown; the witness catches a rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import connect_engine

from fluffy.bootstrap.supervisor import paths, read_json
from fluffy.ipc.client import SyncClient
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.recovery import take_backup
from fluffy.kernel.audit.store import MARK_HEAD_SQL, Head

FLUFFY = str(Path(sys.executable).parent / "fluffy")
DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-project"


@pytest.fixture(params=["docker", "podman"])
def l1(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    from fluffy.images.builder import build_images

    runtime = request.param
    with connect_engine(runtime) as connected:
        image = {status.name: status.ref for status in build_images(connected)}["kernel"]
    home = tmp_path / "home"
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    env = dict(os.environ, FLUFFY_HOME=str(home), FLUFFY_KERNEL_IMAGE=image, FLUFFY_RUNTIME=runtime)
    kit = {
        "home": home,
        "project": project,
        "env": env,
        "paths": paths(home, str(project)),
        "cli": runtime,
    }
    yield kit
    subprocess.run(
        [FLUFFY, "stop", "--project", str(project)],
        env=env,
        capture_output=True,
        timeout=90,
        check=False,
    )


def _fluffy(
    kit: dict[str, Any], *args: str, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *args, "--project", str(kit["project"]), "--json"],
        env=kit["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _inspect(cli: str, name: str) -> dict[str, Any]:
    out = subprocess.run([cli, "inspect", name], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout)[0])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_start_status_flags_restart_and_stop(l1: dict[str, Any]) -> None:
    started = _fluffy(l1, "start")
    assert started.returncode == 0, started.stdout + started.stderr
    status = json.loads(_fluffy(l1, "status").stdout)
    assert status["reachable"] and status["health"] == "healthy"
    assert status["runtime"] == l1["cli"] and status["container_id"]
    assert status["memory"]["limit"] == 1024**3  # the kernel reads its real cgroup limit
    assert status["memory"]["level"] == "ok"

    info = _inspect(l1["cli"], status["container_id"])
    host = info["HostConfig"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] or len(host["CapDrop"]) >= 5  # podman lists them
    proc_status = subprocess.run(
        [l1["cli"], "exec", status["container_id"], "cat", "/proc/1/status"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    uid_line = next(line for line in proc_status.splitlines() if line.startswith("Uid:"))
    if os.getuid() == 0:  # the demo's copy is root's: the kernel is 10000 with 2 file caps
        entry = info["Config"]["Entrypoint"]  # podman's CLI shows it as one string
        assert (entry.split() if isinstance(entry, str) else entry)[0] == "setpriv"
        assert uid_line.split()[1:] == ["10000"] * 4  # the process itself: never root
        assert "CapEff:\t0000000000000003" in proc_status  # chown, dac_override (no fowner)
        assert "CapBnd:\t0000000000000003" in proc_status  # and it cannot get any other
    else:
        assert info["Config"]["User"] == f"{os.getuid()}:{os.getgid()}"
        assert not host.get("CapAdd") and "CapEff:\t0000000000000000" in proc_status
    assert "NoNewPrivs:\t1" in proc_status
    assert any(opt.startswith("no-new-privileges") for opt in host["SecurityOpt"])
    assert host["ReadonlyRootfs"] is True and "/tmp" in host["Tmpfs"]
    assert host["Memory"] == 1024**3 and host["PidsLimit"] == 256
    assert host["NetworkMode"] == "none"  # out only through the gate's dialler
    net_dev = subprocess.run(
        [l1["cli"], "exec", status["container_id"], "cat", "/proc/net/dev"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # NetworkDisabled: no engine network set-up, still only loopback (ADR-009)
    assert [line.split(":")[0].strip() for line in net_dev.splitlines()[2:]] == ["lo"]
    assert info["Config"]["Labels"]["fluffy.role"] == "l1-kernel"
    project = str(l1["project"])
    assert any(b.startswith(f"{project}:/fluffy/project:rw") for b in host["Binds"])

    doctor = subprocess.run(
        [FLUFFY, "doctor", "--json"],
        env=l1["env"],
        cwd=l1["project"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    for name in ("kernel", "L1 flags", "kernel socket", "audit witness"):
        assert checks[name]["status"] == "ok", checks[name]

    sock = str(l1["paths"]["run"] / "kernel.sock")
    with SyncClient(sock, timeout=10) as client:
        session = client.call("session.create")["session_id"]
    early = take_backup(l1["paths"]["state"])  # an older copy, for the rollback below
    assert early is not None

    subprocess.run(
        [l1["cli"], "kill", "--signal", "KILL", status["container_id"]],
        check=True,
        capture_output=True,
    )
    _wait(
        lambda: (
            (read_json(l1["paths"]["status"]) or {}).get("restarts") == 1
            and read_json(l1["paths"]["status"])["health"] == "healthy"
        ),
        60,
        "no restart",
    )  # type: ignore[index]
    with SyncClient(sock, timeout=10) as client:
        restored = client.call("session.get")
    assert restored["session_id"] == session  # the session state survived the crash

    witness = str(l1["paths"]["witness"])
    pinged = Head.from_dict(json.loads(Path(witness).read_text()))  # the last pong's head
    stopped = _fluffy(l1, "stop")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] is True
    state = l1["paths"]["state"]
    log = subprocess.run(
        [FLUFFY, "audit", "log", "--state-dir", str(state), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    last = json.loads(log.stdout)["entries"][-1]
    assert last["event_type"] == "kernel_shutdown", "kernel_shutdown was not recorded last"
    missing = subprocess.run([l1["cli"], "inspect", status["container_id"]], capture_output=True)
    assert missing.returncode != 0  # the container is gone

    # stopping witnessed the final head (ADR-054): kernel_shutdown included, none unwitnessed
    head = json.loads(Path(witness).read_text())
    assert head["seq"] == last["id"] > pinged.seq
    ok = _verify(state, witness)
    assert ok.returncode == 0, ok.stdout
    verified = json.loads(ok.stdout)
    assert verified["head"] == head and verified["unwitnessed"] is None
    # a log cut back to the head the pongs had witnessed no longer verifies as intact
    cut = state.parent / "cut"
    shutil.copytree(state, cut)
    with contextlib.closing(sqlite3.connect(cut / "fluffy.db", isolation_level=None)) as db:
        db.execute("DELETE FROM audit_log WHERE seq > ?", (pinged.seq,))
        db.execute(MARK_HEAD_SQL, (pinged.seq, pinged.seq))  # the file's own head (ADR-099)
        db.execute(
            "INSERT OR REPLACE INTO audit_meta VALUES ('head_seq', ?), ('head_hash', ?)",
            (str(pinged.seq), pinged.hash),
        )
    (cut / "audit.head").write_text(json.dumps(pinged.to_dict()))
    assert _verify(cut, witness=None).returncode == 0  # consistent on its own
    shortened = _verify(cut, witness)
    assert shortened.returncode == 1, shortened.stdout
    assert json.loads(shortened.stdout)["problem"]["kind"] in ("rolled_back", "truncated")
    # an entry appended after the stop is named unwitnessed (a warning: exit 0)
    asyncio.run(_append(cut.parent / "appended", state))
    appended = _verify(cut.parent / "appended", witness)
    assert appended.returncode == 0, appended.stdout
    assert json.loads(appended.stdout)["unwitnessed"]["first_id"] == head["seq"] + 1
    text = _verify(cut.parent / "appended", witness, as_json=False)
    assert f"entries {head['seq'] + 1}..{head['seq'] + 1} are unwitnessed" in text.stdout

    # the witness (kept by the bootstrap, outside L1) catches a rollback of the database
    (state / "audit.head").unlink()  # a compromised L1 could rewrite its own checkpoint
    for suffix in ("", "-wal", "-shm"):
        Path(f"{state}/fluffy.db{suffix}").unlink(missing_ok=True)
    shutil.copyfile(early, state / "fluffy.db")
    rolled = subprocess.run(
        [FLUFFY, "audit", "verify", "--state-dir", str(state), "--witness", witness, "--json"],
        capture_output=True,
        text=True,
    )
    assert rolled.returncode == 1, rolled.stdout
    problem = json.loads(rolled.stdout)["problem"]
    assert problem["kind"] in ("rolled_back", "truncated"), problem
    assert head["seq"] > 0


def _verify(
    state: Path, witness: str | None, *, as_json: bool = True
) -> subprocess.CompletedProcess[str]:
    shown = ["--json"] if as_json else []
    named = ["--witness", witness] if witness else []
    return subprocess.run(
        [FLUFFY, "audit", "verify", "--state-dir", str(state), *named, *shown],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _append(copy: Path, state: Path) -> None:
    """A copy of ``state`` with one more entry, chained as the kernel would."""
    shutil.copytree(state, copy)
    log = await AuditLog.open(copy)
    await log.record(Event("syscall", input_summary="written after the kernel stopped"))
    await log.close()


def test_a_crash_loop_ends_in_a_structured_error(l1: dict[str, Any]) -> None:
    assert _fluffy(l1, "start").returncode == 0
    status_file = l1["paths"]["status"]
    pid = read_json(status_file)["pid"]  # type: ignore[index]

    def ready(crash: int) -> bool:
        status = read_json(status_file) or {}
        return status.get("restarts") == crash and status.get("health") == "healthy"

    for crash in range(4):  # three restarts are allowed within 5 minutes; the fourth crash ends it
        _wait(lambda crash=crash: ready(crash), 60, f"not healthy before crash {crash}")
        name = read_json(status_file)["container"]  # type: ignore[index]
        subprocess.run(
            [l1["cli"], "kill", "--signal", "KILL", name], capture_output=True, check=True
        )
    _wait(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 90, "the bootstrap kept going")
    final = read_json(status_file)
    assert final is not None and final["health"] == "failed"
    assert final["error"]["code"] == "kernel.crash_loop"
    assert "5 minutes" in final["error"]["what"] and final["error"]["fix"]
    log = l1["paths"]["log"].read_text()
    assert '"kernel.crash_loop"' in log


def _zombie(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return True


def test_the_startup_benchmark_reports_its_keys(images: dict[str, str]) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.startup",
            "--json",
            "--n",
            "1",
            "--log-entries",
            "20000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    result = json.loads(out.stdout)
    for key in ("start_to_healthy_p50_ms", "restart_to_healthy_p50_ms", "bare_container_p50_ms",
                "start_with_log_p50_ms"):  # fmt: skip
        assert result[key] > 0
    assert result["log_entries"] == 20000


SLOW_TEST = "import time\n\n\ndef test_slow() -> None:\n    time.sleep(40)\n    assert False\n"


def _kernel_log(kit: dict[str, Any]) -> str:
    container = json.loads(_fluffy(kit, "status").stdout)["container_id"]
    out = subprocess.run(
        [kit["cli"], "logs", "--tail", "60", container],
        capture_output=True,
        text=True,
    )
    return out.stdout + out.stderr


def _sandboxes(cli: str, project_id: str) -> list[dict[str, Any]]:
    ids = subprocess.run(
        [cli, "ps", "-aq", "--filter", f"label=org.fluffy.project={project_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for cid in ids:  # one may be removed between the listing and its inspection
        out = subprocess.run([cli, "inspect", cid], capture_output=True, text=True)
        if out.returncode == 0:
            found.append(json.loads(out.stdout)[0])
    return found


def test_l1_runs_tools_in_sibling_sandboxes_and_removes_orphans(l1: dict[str, Any]) -> None:
    import threading

    if os.getuid() == 0:  # a user's project is theirs: the kernel runs as its owner
        for path in [l1["project"], *l1["project"].rglob("*")]:
            os.lchown(path, 1000, 1000)
    started = _fluffy(l1, "start")
    assert started.returncode == 0, started.stdout + started.stderr
    status = json.loads(_fluffy(l1, "status").stdout)
    kernel = _inspect(l1["cli"], status["container_id"])
    project_id = kernel["Config"]["Labels"]["fluffy.project"]
    sock = str(l1["paths"]["run"] / "kernel.sock")
    with SyncClient(sock, timeout=120) as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "slow"})
        client.call("tool.call", {"session_id": sid, "tool": "plan.complete", "args": {}})
        wrote = client.call(
            "tool.call",
            {
                "session_id": sid,
                "tool": "fs.write",
                "args": {"path": "tests/test_slow.py", "content": SLOW_TEST},
            },
        )
        assert wrote["ok"] and wrote["route"] == "plugin", (wrote, _kernel_log(l1))
    assert not (l1["project"] / "tests" / "test_slow.py").exists()  # staged, not merged

    def run_tests() -> None:  # the kernel is killed under it: any outcome is fine
        try:
            with SyncClient(sock, timeout=120) as runner:
                runner.call("tool.call", {"session_id": sid, "tool": "test.run", "args": {}})
        except Exception:
            pass

    thread = threading.Thread(target=run_tests, daemon=True)
    thread.start()
    running: list[dict[str, Any]] = []

    def sandbox_running() -> bool:
        running[:] = [
            c
            for c in _sandboxes(l1["cli"], project_id)
            if c["State"]["Running"]
            # the message's turn has its ai-provider sandbox too, and fs.write's may not be
            # gone yet: test.run's is wanted here (it mounts the session's view)
            and c["Config"]["Labels"].get("org.fluffy.template") == "code-executor"
            and any("/views/" in m["Source"] for m in c["Mounts"])
        ]
        return bool(running)

    _wait(sandbox_running, 90, "the kernel started no sandbox for test.run")
    sandbox = running[0]
    labels = sandbox["Config"]["Labels"]
    # a sibling: the host's engine runs it, labelled with the project and the kernel instance
    assert labels["org.fluffy.managed"] == "1" and labels["org.fluffy.session"]
    assert labels["org.fluffy.template"] == "code-executor"
    mounts = {m["Destination"]: m for m in sandbox["Mounts"]}
    # test.run's view: the session's folder in L1's state, by its host path (not L1's)
    views = l1["paths"]["state"] / "views"
    assert Path(mounts["/workspace"]["Source"]).parent.parent == views
    assert mounts["/workspace"]["RW"] is False and "/staged" not in mounts
    assert sandbox["Id"] != status["container_id"]

    subprocess.run(
        [l1["cli"], "kill", "--signal", "KILL", status["container_id"]],
        check=True,
        capture_output=True,
    )
    # the supervisor restarts L1; the new kernel removes the sandbox the old one left
    _wait(
        lambda: not any(c["Id"] == sandbox["Id"] for c in _sandboxes(l1["cli"], project_id)),
        120,
        "the orphan sandbox was not removed after the restart",
    )
    _wait(  # the new kernel may clean up before the supervisor records the restart
        lambda: (read_json(l1["paths"]["status"]) or {}).get("restarts") == 1,
        60,
        "the supervisor did not record the restart",
    )
    thread.join(timeout=60)


def _leftover(l1: dict[str, Any]) -> str:
    return subprocess.run(
        [l1["cli"], "ps", "-aq", "--filter", "label=fluffy.role=l1-kernel", "--filter",
         f"label=fluffy.project_path={l1['project']}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def test_a_broken_policy_is_said_before_any_kernel_runs(l1: dict[str, Any]) -> None:
    """The host reads policy.yaml as L1 starts: a file that does not load ends the start
    at once with its file:line:field, not as a kernel crash loop seconds later."""
    policy = l1["project"] / ".fluffy" / "policy.yaml"
    policy.parent.mkdir(exist_ok=True)
    policy.write_text("capabilities:\n  - name: broken\n    action: allow\n")  # no match
    started = _fluffy(l1, "start", timeout=240)
    assert started.returncode == 3, started.stdout + started.stderr
    error = json.loads(started.stdout or started.stderr)["error"]
    assert error["code"] == "kernel.start_failed"
    assert f"{policy}:2: capabilities.0.match: Field required" in error["what"]
    assert "policy.invalid" in error["why"] and "fluffy policy validate" in error["fix"]
    assert _leftover(l1) == ""


def test_a_kernel_that_cannot_start_says_why(l1: dict[str, Any]) -> None:
    """Its last output is kept before the container goes, and reaches the user."""
    from fluffy.images.builder import build_images

    with connect_engine(l1["cli"]) as connected:  # an image that holds no kernel
        other = {status.name: status.ref for status in build_images(connected)}["code-executor"]
    kit = {**l1, "env": {**l1["env"], "FLUFFY_KERNEL_IMAGE": other}}
    started = _fluffy(kit, "start", timeout=240)
    assert started.returncode == 3, started.stdout + started.stderr
    error = json.loads(started.stdout or started.stderr)["error"]
    assert error["code"] == "kernel.start_failed"
    assert "the kernel's last output" in error["why"]
    assert "No module named fluffy.kernel" in error["why"]
    assert "docker logs" not in error["fix"]  # the container is gone: the output is here
    assert _leftover(l1) == ""
