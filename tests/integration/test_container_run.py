"""container.run on Docker and Podman, through the real kernel (issue 33, ADR-062).

In debug mode a command runs in a fresh code-executor sandbox with the project's
environment (its dependencies import) and the session's staged view (a change not yet
merged is what the command sees); everything else stays shut and is proven by the
errno of the attempt: the project is read-only (EROFS), the network is refused (EPERM,
seccomp), a command past its time-out is killed.  A rule allows some commands; any other
asks the person, and a client's direct call (no person to ask) is refused.  Each run is
audited with the sandbox that ran it; the person's files are untouched."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.project.defaults import default_policy_text
from tests.integration.test_project_shapes import build_env, git
from tests.integration.test_project_shapes import index as index  # the module's fixtures
from tests.integration.test_project_shapes import runtime as runtime
from tests.integration.tool_support import Kernel
from tests.project_support import GIT, shape

RULES = """
  - name: run-python-and-shell
    match: {syscall: container.run, command: ["python **", "sh -c *"], session_mode: debug}
    action: allow
"""
PROBE = """
import errno, socket, sys
def attempt(what, do):
    try:
        do()
    except OSError as exc:
        print(what, errno.errorcode.get(exc.errno, exc.errno))
    else:
        print(what, "OK")
attempt("write", lambda: open("/workspace/calc.py", "w"))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[1])), 3))
"""
TMP_EXEC = "printf '#!/bin/sh\\necho ran\\n' > /tmp/x; chmod +x /tmp/x; /tmp/x"


def _run(client: Any, sid: str, *argv: str, **more: Any) -> dict[str, Any]:
    args = {"argv": list(argv), **more}
    answer: dict[str, Any] = client.call(
        "tool.call", {"session_id": sid, "tool": "container.run", "args": args}
    )
    return answer


def test_debug_commands_run_in_the_sessions_view_and_environment_and_nowhere_else(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "repo"
    shape(project, "requirements")
    (project / ".fluffy").mkdir()
    policy = default_policy_text(project).replace("capabilities:\n", "capabilities:" + RULES, 1)
    (project / ".fluffy" / "policy.yaml").write_text(policy)
    subprocess.run(["git", "-C", str(project), "add", "-A"], check=True, env=GIT)
    subprocess.run(["git", "-C", str(project), "commit", "-qm", "policy"], check=True, env=GIT)
    (project / ".env").write_text("MINE=1\n")  # the person's own work in progress
    before = (project / "calc.py").read_text()
    build_env(project, tmp_path / "state", runtime, index, monkeypatch)
    listener = socket.socket()
    kernel = Kernel(tmp_path, project, runtime)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        kernel.start()
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.set_mode", {"session_id": sid, "mode": "debug", "approved": True})
            client.call("session.message", {"session_id": sid, "text": "why does it double?"})
            plan = {"session_id": sid, "tool": "plan.complete", "args": {"summary": "look"}}
            assert client.call("tool.call", plan)["ok"]
            assert client.call("session.get", {"session_id": sid})["state"] == "exploring"
            edit = {"path": "calc.py", "old_string": "2 * x", "new_string": "2 * x + 0"}
            staged = client.call("tool.call", {"session_id": sid, "tool": "fs.edit", "args": edit})
            assert staged["ok"], staged.get("error")
            code = "import calc, fixturereq, inspect; print(inspect.getsource(calc.double_it))"
            seen = _run(client, sid, "python", "-c", code)
            shut = _run(client, sid, "python", "-c", PROBE, str(port))
            tmp_exec = _run(client, sid, "sh", "-c", TMP_EXEC)
            slow = _run(client, sid, "python", "-c", "import time; time.sleep(60)", timeout_s=2)
            asked = _run(client, sid, "env")  # no rule allows it, and no person is asked
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing reached the host's loopback
                listener.accept()
    finally:
        listener.close()
        kernel.stop()
    assert seen["ok"], seen.get("error")
    out = seen["output"]
    assert out["exit_code"] == 0 and "return 2 * x + 0" in out["output"]  # the staged view
    assert out["command"].startswith("python -c ")
    assert shut["output"]["output"].split("\n")[:2] == [
        f"write {errno.errorcode[errno.EROFS]}",
        f"connect {errno.errorcode[errno.EPERM]}",
    ], shut["output"]
    assert tmp_exec["output"]["output"] == "ran\n", tmp_exec["output"]
    assert slow["output"]["timed_out"] is True and slow["output"]["signal"] == "SIGKILL"
    assert not asked["ok"] and asked["error"]["code"] == "policy.denied", asked["error"]
    assert "needs the user's review" in asked["error"]["what"]
    assert "command: ['env']" in asked["error"]["fix"]
    # audited with the sandbox that ran each, and nothing of the person's was touched
    results = [e for e in kernel.entries("tool_result") if e["syscall_type"] == "container.run"]
    ran = [e for e in results if e["policy_decision"] == "allowed"]
    assert len(ran) == 4 and all(e["sandbox_id"] for e in ran)
    created = {e["sandbox_id"] for e in kernel.entries("sandbox_created")}
    assert {e["sandbox_id"] for e in ran} <= created and len({e["sandbox_id"] for e in ran}) == 4
    assert {e["policy_rule_name"] for e in ran} == {"run-python-and-shell"}
    asked_for = json.loads(ran[0]["metadata"]["policy_requests"])[0]
    assert asked_for["command"] == ["python", "-c", code]  # what the trial replays
    assert (project / "calc.py").read_text() == before and (
        project / ".env"
    ).read_text() == "MINE=1\n"
    assert git(project, "status", "--porcelain") == "?? .env"
