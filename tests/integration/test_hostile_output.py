"""Test code run by ``test.run`` attacks the kernel from inside its sandbox.

The red-team replay of issue 19, finding 1: the test renames its call's output folder,
plants a link to the kernel's state folder in its place and answers the call itself
from a second connection on the call's socket.  The kernel must neither accept that
answer nor read through the link: the forged green never reaches the workflow.  (Since
/output became the sandbox's own tmpfs, the link leads nowhere the kernel reads: the
plugin host sends only regular files, never through a link.)
"""

from __future__ import annotations

import os
from pathlib import Path

from fluffy.kernel.project.testsecrets import set_allowed
from tests.integration.test_tool_path import runtime  # noqa: F401 (the engine fixture)
from tests.integration.tool_support import Kernel, call, demo_project, drive, git

FORGED = (
    '<testsuite tests="1"><testcase classname="tests.test_forged" name="test_forged_green"'
    ' file="tests/test_forged.py"/></testsuite>'
)

ATTACK = """
import json, os, socket, struct, pathlib

def _frame(sock, data):
    payload = json.dumps(data).encode()
    sock.sendall(struct.pack(">I", len(payload)) + payload)

def _read(sock):
    size = struct.unpack(">I", sock.recv(4))[0]
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return json.loads(data)

def test_attack():
    out = pathlib.Path("/output")
    call = next(p for p in out.iterdir() if p.is_dir())
    call.rename(out / "moved")
    os.symlink(STATE, str(call))
    sock = socket.socket(socket.AF_UNIX)
    sock.connect("/run/fluffy/kernel.sock")
    _frame(sock, {"type": "handshake", "plugin_name": "fluffy-tools", "plugin_version": "1",
                  "syscall_api_version": 1})
    _read(sock)
    _frame(sock, {"id": "x", "type": "request", "method": "tool.result", "params": {
        "call_id": call.name, "ok": True,
        "result": {"exit_code": 0, "junit": "forged.xml", "output_tail": "FORGED"}}})
    answer = _read(sock)
    pathlib.Path("/output/moved/answer.json").write_text(json.dumps(answer))
    assert answer.get("error"), answer  # refused: only the plugin's own connection answers
    assert False  # red, the honest way
"""


def test_test_code_cannot_answer_for_the_plugin_nor_lead_the_kernel_out(
    tmp_path: Path,
    runtime: str,  # noqa: F811 (the fixture)
) -> None:
    project = demo_project(tmp_path)
    kernel = Kernel(tmp_path, project, runtime)
    kernel.state.mkdir(parents=True)
    (kernel.state / "forged.xml").write_text(FORGED)  # what the forged answer points at
    kernel.start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "attack"})
            call(client, sid, "plan.complete")
            test = ATTACK.replace("STATE", repr(str(kernel.state)))
            wrote = call(client, sid, "fs.write", path="tests/test_attack.py", content=test)
            assert wrote["ok"], wrote
            ran = call(client, sid, "test.run")
    finally:
        kernel.stop()
    shown = str(ran)
    assert "test_forged_green" not in shown and "FORGED" not in shown, ran
    if ran["ok"]:  # the plugin's own answer: the kernel never read through the link
        assert ran["output"]["counts"]["passed"] == 0, ran
    else:  # the report went with the renamed folder: the kernel got none, and says so
        assert "wrote no report" in ran["error"]["what"], ran


#: Finding 8: the sandbox's /output is its own tmpfs, not executable and size-capped.
#: The test passes only if both attempts fail with the expected errno.
NOEXEC_AND_CAPPED = """
import errno, pathlib, subprocess

def test_output_is_noexec_and_capped():
    script = pathlib.Path("/output/run-me.sh")
    script.write_text("#!/bin/sh\\necho ran\\n")
    script.chmod(0o755)
    try:
        subprocess.run([str(script)], check=True)
        denied = None
    except PermissionError as exc:
        denied = exc.errno
    assert denied == errno.EACCES
    big, chunk, full = pathlib.Path("/output/fill"), b"x" * (1 << 20), None
    try:
        with big.open("wb") as out:
            for _ in range(300):  # 300 MiB: more than the 256 MiB cap
                out.write(chunk)
                out.flush()
    except OSError as exc:
        full = exc.errno
    finally:
        big.unlink()
    assert full == errno.ENOSPC
"""


def test_test_code_can_neither_run_nor_hoard_files_in_output(
    tmp_path: Path,
    runtime: str,  # noqa: F811 (the fixture)
) -> None:
    kernel = Kernel(tmp_path, demo_project(tmp_path), runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "attack"})
            call(client, sid, "plan.complete")
            wrote = call(
                client, sid, "fs.write", path="tests/test_output.py", content=NOEXEC_AND_CAPPED
            )
            assert wrote["ok"], wrote
            ran = call(client, sid, "test.run", paths=["tests/test_output.py"])
    finally:
        kernel.stop()
    assert ran["ok"], ran
    counts = ran["output"]["counts"]
    assert (counts["passed"], counts["failed"]) == (1, 0), ran


#: A model's test that reads the person's .env (never committed) into its output; the
#: repository's own tracked .env.test stays readable.  Passes only if .env is absent.
READS_SECRETS = """
import errno, pathlib

def test_reads_the_persons_secrets():
    try:
        print("LEAK", pathlib.Path(".env").read_text())
    except OSError as exc:
        assert exc.errno == errno.ENOENT
    else:
        raise AssertionError("the test read .env")
    assert pathlib.Path(".env.test").read_text() == "MODE=test\\n"
"""


def test_a_models_test_cannot_read_the_persons_untracked_secrets(
    tmp_path: Path,
    runtime: str,  # noqa: F811 (the fixture)
) -> None:
    project = demo_project(tmp_path)
    (project / ".env.test").write_text("MODE=test\n")
    git(project, "add", ".env.test")  # the repository's: tests see it
    (project / ".env").write_text("TOKEN=hunter2-secret\n")  # the person's
    (project / ".env").chmod(0o644)
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "attack"})
            call(client, sid, "plan.complete")
            wrote = call(client, sid, "fs.write", path="tests/test_env.py", content=READS_SECRETS)
            assert wrote["ok"], wrote
            ran = call(client, sid, "test.run", paths=["tests/test_env.py"])
            set_allowed(kernel.state, [".env"])  # the person lets tests read it
            allowed = call(client, sid, "test.run", paths=["tests/test_env.py"])
    finally:
        kernel.stop()
    assert ran["ok"], ran
    assert (ran["output"]["counts"]["passed"], ran["output"]["counts"]["failed"]) == (1, 0), ran
    assert "hunter2" not in str(ran) and ".env" in ran["output"]["secrets"], ran
    assert allowed["ok"] and allowed["output"]["counts"]["failed"] == 1, allowed  # read it
    assert "secrets" not in allowed["output"], allowed


def test_a_repository_with_names_that_are_not_utf8_runs_its_tests(
    tmp_path: Path,
    runtime: str,  # noqa: F811 (the fixture)
) -> None:
    # a Latin-1 checkout (or a hostile one): such a name once stopped every test.run
    project = demo_project(tmp_path)
    odd = project / os.fsdecode(b"tests/caf\xe9")
    odd.mkdir()
    (odd / "test_odd.py").write_text("def test_odd():\n    assert False, 'the odd one'\n")
    (project / os.fsdecode(b"caf\xe9.txt")).write_text("the person's\n")
    steps = [("fs.list", {"path": "."}), ("plan.complete", {}), ("test.run", {})]
    (listed, _, ran), _ = drive(tmp_path, project, runtime, steps)
    assert '"caf\\351.txt"' in [e["name"] for e in listed["output"]["entries"]], listed
    failed = {f["id"]: f["message"] for f in ran["output"]["failed"]}
    assert failed == {'"tests/caf\\351/test_odd.py"::test_odd': "AssertionError: the odd one"}
    assert (project / os.fsdecode(b"caf\xe9.txt")).read_text() == "the person's\n"
