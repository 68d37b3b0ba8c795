"""Bootstrap: engine detection and its install guide, the constant L1 flags, settings."""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluffy.bootstrap import __main__ as boot_main
from fluffy.bootstrap import engine as boot_engine
from fluffy.bootstrap import l1
from fluffy.bootstrap.engine import Engine
from fluffy.errors import (
    ConfigError,
    EngineUnavailable,
    FluffyError,
    ImageNotFound,
    KernelAlreadyRunning,
    all_error_classes,
)

ROOT = Path(__file__).resolve().parents[3]


def test_no_engine_gives_the_install_guide(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(
        boot_engine,
        "SOCKETS",
        {"docker": (str(tmp_path / "d.sock"),), "podman": (str(tmp_path / "p.sock"),)},
    )
    with pytest.raises(EngineUnavailable) as caught:
        boot_engine.detect({})
    error = caught.value
    assert error.code == "engine.unavailable"
    assert error.fix == boot_engine.install_guide() and error.why


def test_an_unknown_runtime_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="FLUFFY_RUNTIME") as caught:
        boot_engine.detect({"FLUFFY_RUNTIME": "lxc"})
    assert caught.value.code == "config.invalid"


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
        assert host[key] == value or key == "SecurityOpt"
    assert host["SecurityOpt"][:1] == l1.SECURITY["SecurityOpt"]  # and L1's own seccomp profile
    assert host["SecurityOpt"][1].startswith('seccomp={"architectures"')  # inline for Docker
    assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] and host["NetworkMode"] == "none"
    if os.getuid() == 0:  # a root-owned project: setpriv drops to 10000 with 2 file caps
        assert body["User"] == "0:0" and body["Entrypoint"][0] == "setpriv"
        assert "--reuid=10000" in body["Entrypoint"] and "--regid=10000" in body["Entrypoint"]
        caps = "-all,+dac_override,+chown"  # no fowner: it could chmod root's files
        for flag in ("--inh-caps", "--ambient-caps", "--bounding-set"):
            assert f"{flag}={caps}" in body["Entrypoint"]
        assert body["Entrypoint"][-len(l1.ENTRYPOINT) - 1 :] == ["--", *l1.ENTRYPOINT]
        assert sorted(host["CapAdd"]) == ["CHOWN", "DAC_OVERRIDE", "SETGID", "SETPCAP", "SETUID"]
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


def test_the_developers_result_check_reaches_the_kernel_only_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, sock = tmp_path / "p", tmp_path / "engine.sock"
    project.mkdir()
    for value, passed in (("1", True), ("0", False), (None, False)):
        if value is None:
            monkeypatch.delenv("FLUFFY_CHECK_RESULTS", raising=False)
        else:
            monkeypatch.setenv("FLUFFY_CHECK_RESULTS", value)
        body = l1.spec("img", str(project), "id", "r", "s", Engine("docker", str(sock)))
        assert ("FLUFFY_CHECK_RESULTS=1" in body["Env"]) is passed, value
        assert not any(e.startswith("FLUFFY_CHECK_RESULTS=0") for e in body["Env"])


@pytest.mark.parametrize("layout", ["clone", "no hooks", "no git", "linked .git", "linked config"])
def test_l1_only_reads_what_git_on_the_host_runs(tmp_path: Path, layout: str) -> None:
    """.git/config and .git/hooks name commands git runs on the host (filters, fsmonitor,
    hooks): L1 gets them read-only over its read-write project."""
    project, sock = tmp_path / "p", tmp_path / "engine.sock"
    (project / "src").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "hooks").mkdir(parents=True)
    (elsewhere / "config").write_text("")
    if layout == "linked .git":
        (project / ".git").symlink_to(elsewhere)
    elif layout != "no git":
        (project / ".git" / "objects").mkdir(parents=True)
        (project / ".git" / "config").write_text("[core]\n")
        if layout == "linked config":
            (project / ".git" / "config").unlink()
            (project / ".git" / "config").symlink_to(elsewhere / "config")
        if layout != "no hooks":
            (project / ".git" / "hooks").mkdir()
    body = l1.spec("img", str(project), "id", "r", "s", Engine("docker", str(sock)))
    binds = body["HostConfig"]["Binds"]
    expected = {
        "clone": ["config", "hooks"],
        "no hooks": ["config"],
        "no git": [],
        "linked .git": [],
        "linked config": ["hooks"],
    }[layout]
    assert [b for b in binds if "/.git/" in b] == [
        f"{project}/.git/{n}:/fluffy/project/.git/{n}:ro" for n in expected
    ]
    assert binds.index(f"{project}:/fluffy/project:rw") == 0  # the project first, then these


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
    with pytest.raises(ImageNotFound, match="not built") as caught:
        boot_main.kernel_image(tmp_path, {})
    assert caught.value.code == "engine.image_not_found"  # the tree's name (was image.not_found)
    assert f"{tmp_path}/state/images.json names none" in (caught.value.why or "")


def test_a_missing_project_is_a_structured_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert boot_main.main(["run", "--project", str(tmp_path / "nope")]) == 3
    error = json.loads(capsys.readouterr().err)["error"]
    assert error == {
        "code": "config.invalid",
        "what": f"project {tmp_path / 'nope'} is not a directory",
        "why": "",
        "fix": "",
    }


def test_the_bootstrap_raises_only_classes_of_the_one_error_tree() -> None:
    tree = {cls.__name__: cls for cls in all_error_classes()}
    used: set[str] = set()
    for path in sorted((ROOT / "bootstrap").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # no error class of its own: every failure is a class of fluffy.errors
            assert not isinstance(node, ast.ClassDef) or not any(
                isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception"))
                for b in node.bases
            ), (path.name, node.name)
            if isinstance(node, ast.ImportFrom) and node.module == "fluffy.errors":
                used.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                used.update([node.attr] if node.value.id == "errors" else [])
    assert used and used <= set(tree), used - set(tree)
    emitted = {tree[name].code for name in used if name != "FluffyError"}
    assert "image.not_found" not in emitted and "engine.image_not_found" in emitted
    assert {"kernel.already_running", "kernel.crash_loop", "kernel.start_failed"} <= emitted


def test_the_bootstrap_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    """-I -S: no site-packages, no PYTHONPATH; the bootstrap and fluffy.errors still import,
    and a failure is printed in the bootstrap's shape with a code of the tree."""
    script = (
        "import json, runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"sys.argv = ['fluffy.bootstrap', 'run', '--project', {str(tmp_path / 'nope')!r}]\n"
        "try:\n"
        "    runpy.run_module('fluffy.bootstrap', run_name='__main__')\n"
        "except SystemExit as end:\n"
        "    outside = sorted({m.split('.')[0] for m in sys.modules}\n"
        "                     - set(sys.stdlib_module_names) - {'fluffy', '__main__'})\n"
        "    print(json.dumps({'exit': end.code, 'outside': outside}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert json.loads(done.stdout) == {"exit": 3, "outside": []}, done.stderr
    error = json.loads(done.stderr)["error"]
    assert sorted(error) == ["code", "fix", "what", "why"] and error["code"] == "config.invalid"


def test_a_second_supervisor_is_refused_with_a_code_of_the_tree(tmp_path: Path) -> None:
    from fluffy.bootstrap.supervisor import Supervisor

    first = Supervisor(Engine("docker", str(tmp_path / "none.sock")), str(tmp_path), tmp_path, "i")
    held = first.lock()
    try:
        second = Supervisor(
            Engine("docker", str(tmp_path / "none.sock")), str(tmp_path), tmp_path, "i"
        )
        with pytest.raises(KernelAlreadyRunning) as caught:
            second.lock()
        assert caught.value.code == "kernel.already_running"
        assert caught.value.fix == "Use `fluffy status`, or `fluffy stop` first."
    finally:
        os.close(held)


def test_a_crash_loop_is_written_to_the_status_in_the_bootstraps_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluffy.bootstrap import supervisor as boot_supervisor

    sup = boot_supervisor.Supervisor(
        Engine("docker", str(tmp_path / "none.sock")), str(tmp_path), tmp_path, "i"
    )
    sup.p["base"].mkdir(parents=True)
    monkeypatch.setattr(boot_supervisor.l1, "remove", lambda engine, name: None)
    sup.restarts = [time.monotonic()] * boot_supervisor.MAX_RESTARTS
    with pytest.raises(FluffyError) as caught:
        sup.restart("health check failed")
    assert caught.value.code == "kernel.crash_loop"
    status = boot_supervisor.read_json(sup.p["status"])
    assert status is not None and status["health"] == "failed"
    assert sorted(status["error"]) == ["code", "fix", "what", "why"]
    assert status["error"]["code"] == "kernel.crash_loop"
    assert "health check failed" in status["error"]["why"]


def _log_with(state: Path, entries: dict[int, str]) -> None:
    import sqlite3

    state.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(state / "fluffy.db") as db:
        db.execute("CREATE TABLE IF NOT EXISTS audit_log (seq INTEGER PRIMARY KEY, hash TEXT)")
        db.execute("DELETE FROM audit_log")
        db.executemany("INSERT INTO audit_log VALUES (?, ?)", entries.items())


def test_the_witness_adopts_only_heads_that_extend_it(tmp_path: Path) -> None:
    from fluffy.bootstrap.supervisor import Supervisor, read_json

    sup = Supervisor(Engine("docker", str(tmp_path / "none.sock")), str(tmp_path), tmp_path, "i")
    sup.p["base"].mkdir(parents=True)
    state = sup.p["state"]
    _log_with(state, {1: "h1", 2: "h2", 3: "h3"})

    def pong(seq: int, hash_: str, chain: str = "c1") -> dict[str, object]:
        return {"audit_head": {"chain_id": chain, "seq": seq, "hash": hash_}}

    sup.witness(pong(2, "h2"))
    assert read_json(sup.p["witness"]) == pong(2, "h2")["audit_head"]
    sup.witness(pong(3, "h3"))  # extends: entry 2 still has the witnessed hash
    assert read_json(sup.p["witness"])["seq"] == 3  # type: ignore[index]
    # the tail was rewritten (entry 3 changed) and a few entries added: not adopted
    _log_with(state, {1: "h1", 2: "h2", 3: "forged", 4: "h4", 5: "h5"})
    sup.witness(pong(5, "h5"))
    assert read_json(sup.p["witness"])["seq"] == 3  # type: ignore[index]
    assert "entry 3 changed" in sup.status["warning"]
    # the witnessed entry vanished (a lost tail replaced by new entries): not adopted
    _log_with(state, {1: "h1", 2: "h2", 4: "h4"})
    sup.witness(pong(4, "h4"))
    assert read_json(sup.p["witness"])["seq"] == 3  # type: ignore[index]
    # a fresh chain replacing the witnessed one is reported, never adopted
    sup.witness(pong(9, "x", chain="c2"))
    assert read_json(sup.p["witness"])["chain_id"] == "c1"  # type: ignore[index]
    assert "new chain c2" in sup.status["warning"]
    sup.witness(pong(1, "h1"))  # a rollback
    assert "went back" in sup.status["warning"]
    # an archived witnessed entry still counts (rotation moved it)
    _log_with(state / "audit-archive" / "x", {})
    archive = state / "audit-archive" / "audit-20260101-000000000001-000000000003.db"
    (state / "audit-archive" / "x" / "fluffy.db").rename(archive)
    _log_with(state, {4: "h4", 5: "h5"})
    import sqlite3

    with sqlite3.connect(archive) as db:
        db.executemany("INSERT INTO audit_log VALUES (?, ?)", [(1, "h1"), (2, "h2"), (3, "h3")])
    sup.witness(pong(5, "h5"))
    assert read_json(sup.p["witness"])["seq"] == 5  # type: ignore[index]


def test_stopping_witnesses_the_final_head_the_kernel_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last entries (the final reply, turn_end, kernel_shutdown) land after the last
    pong: stopping reads the stopped kernel's log and witnesses its head (ADR-054)."""
    import asyncio
    from types import SimpleNamespace

    from fluffy.bootstrap import supervisor as boot_supervisor
    from fluffy.kernel.audit.entry import Event
    from fluffy.kernel.audit.log import AuditLog
    from fluffy.kernel.audit.store import head_path, read_head

    project = tmp_path / "project"
    project.mkdir()
    sup = boot_supervisor.Supervisor(
        Engine("docker", str(tmp_path / "none.sock")), str(project), tmp_path / "home", "i"
    )
    state = sup.p["state"]

    async def record(*kinds: str) -> dict[str, object]:
        log = await AuditLog.open(state)
        for kind in kinds:
            await log.record(Event(kind, input_summary=kind))
        head = log.head.to_dict()
        await log.close()
        return head

    pongs: list[dict[str, object]] = []

    def ping(path: str) -> dict[str, object]:
        if not pongs:  # the kernel answers once with its head, then `fluffy stop` comes
            pongs.append({"audit_head": asyncio.run(record("kernel_start", "syscall"))})
        else:
            sup.stopping = True
        return pongs[0]

    def stop(engine: object, name: str, timeout: int = 15) -> None:  # SIGTERM: last entries
        asyncio.run(record("tool_result", "kernel_shutdown"))

    monkeypatch.setattr(
        "fluffy.gate.server.start_for", lambda *a: SimpleNamespace(shutdown=lambda: None)
    )
    monkeypatch.setattr(boot_supervisor.l1, "spec", lambda *a: {})
    monkeypatch.setattr(boot_supervisor.l1, "start", lambda *a: "container-1")
    monkeypatch.setattr(boot_supervisor.l1, "ping", ping)
    monkeypatch.setattr(boot_supervisor.l1, "stop", stop)
    monkeypatch.setattr(boot_supervisor.l1, "remove", lambda engine, name: None)

    def restart(why: str) -> None:  # a failure here must fail the test, not retry
        raise AssertionError(why)

    monkeypatch.setattr(sup, "restart", restart)
    sup.run()

    final = read_head(head_path(state))
    assert final is not None and final.seq == 4  # kernel_shutdown is the log's last entry
    witnessed = boot_supervisor.read_json(sup.p["witness"])
    assert witnessed == final.to_dict() != pongs[0]["audit_head"]
    assert "warning" not in sup.status


def _launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ping: object, running: object
) -> object:
    from fluffy.bootstrap import supervisor as boot_supervisor

    project = tmp_path / "project"
    project.mkdir()
    sup = boot_supervisor.Supervisor(
        Engine("docker", str(tmp_path / "none.sock")), str(project), tmp_path / "home", "i"
    )
    sup.prepare()
    monkeypatch.setattr(boot_supervisor.l1, "spec", lambda *a: {})
    monkeypatch.setattr(boot_supervisor.l1, "start", lambda *a: "container-1")
    monkeypatch.setattr(boot_supervisor.l1, "ping", ping)
    monkeypatch.setattr(boot_supervisor.l1, "running", running)
    monkeypatch.setattr(boot_supervisor.l1, "logs", lambda *a: "Traceback: boom")
    return sup


def test_a_starting_kernel_is_tried_often_and_the_engine_asked_seldom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket is tried until the kernel answers; the engine is asked whether L1 still
    runs at most once per PING_EVERY_S (never at every refused try); healthy is written
    before the witness, which `fluffy start` does not wait for."""
    from fluffy.bootstrap import supervisor as boot_supervisor

    tries: list[float] = []
    asked: list[float] = []
    order: list[str] = []

    def ping(path: str) -> dict[str, object]:
        tries.append(time.monotonic())
        if len(tries) < 60:
            raise ConnectionRefusedError(111, "refused")
        return {"audit_head": None}

    def running(engine: object, name: str) -> bool:
        asked.append(time.monotonic())
        return True

    sup = _launching(tmp_path, monkeypatch, ping, running)
    saved = sup.save  # type: ignore[attr-defined]
    monkeypatch.setattr(sup, "save", lambda **c: (order.append(str(c.get("health"))), saved(**c)))
    monkeypatch.setattr(sup, "witness", lambda pong: order.append("witness"))
    sup.launch()  # type: ignore[attr-defined]
    assert len(tries) == 60 and order == ["starting", "healthy", "witness"]
    spent = tries[-1] - tries[0]
    assert len(asked) <= spent / boot_supervisor.PING_EVERY_S + 1
    every = boot_supervisor.PING_EVERY_S * 0.9  # (each ask is timed a moment after its turn)
    assert all(b - a >= every for a, b in itertools.pairwise(asked))


def test_a_kernel_container_that_died_while_starting_ends_the_wait_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluffy.errors import KernelStartFailed

    def ping(path: str) -> dict[str, object]:
        raise FileNotFoundError(2, "no socket")

    sup = _launching(tmp_path, monkeypatch, ping, lambda engine, name: False)
    with pytest.raises(KernelStartFailed) as raised:
        sup.launch()  # type: ignore[attr-defined]
    assert "Traceback: boom" in (raised.value.why or "")
    assert "Traceback: boom" in sup.status["last_output"]  # type: ignore[attr-defined]
