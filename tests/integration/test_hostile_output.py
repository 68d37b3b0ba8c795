"""Test code run by ``test.run`` attacks the kernel from inside its sandbox.

The red-team replay of issue 19, finding 1: the test renames its call's output folder,
plants a link to the kernel's state folder in its place and answers the call itself
from a second connection on the call's socket.  The kernel must neither accept that
answer nor read through the link: the forged green never reaches the workflow.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_tool_path import runtime  # noqa: F401 (the engine fixture)
from tests.integration.tool_support import Kernel, call, demo_project

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
    else:
        assert "output folder" in ran["error"]["what"] or "link" in shown, ran
