"""The design's end-to-end scenario driven by a model, through a real kernel and engine.

The model is the scripted provider, then the real OpenAI and Anthropic adapters against
fake servers on loopback that speak the real wire formats — reached from the
ai-provider sandbox (network none, strict seccomp) only through the kernel's CONNECT
proxy, with the servers allow-listed in policy.yaml ``network_whitelist``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from fluffy.demo_session import git, init_repository
from fluffy.errors import ModeDenied
from fluffy.ipc.client import SyncClient
from fluffy.kernel.ai.script import load_script
from fluffy.sandboxes.ai.calls import wire_name
from tests.conftest import connect_engine
from tests.fakes.llm import Fail, FakeAnthropicServer, FakeOpenAIServer, Reply
from tests.integration.tool_support import DEMO, Kernel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = load_script(ROOT / "examples" / "sessions" / "add-error-handling.yaml")
SECRET = "ghp_" + "Zx9" * 12
API_KEY = "fk-test-" + "q7" * 16  # no known secret shape: only field masking hides it
STATES = ["planning", "test_writing", "code_writing", "validating", "reviewing", "committing"]


@pytest.fixture(scope="module")
def docker_runtime() -> str:
    from fluffy.images.builder import build_images

    with connect_engine("docker") as connected:
        build_images(connected)
    return "docker"


def project_with(tmp_path: Path, whitelist: list[str]) -> Path:
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    policy = project / ".fluffy" / "policy.yaml"
    if whitelist:
        entries = "".join(f"  - {entry!r}\n" for entry in whitelist)
        policy.write_text(policy.read_text() + f"\nnetwork_whitelist:\n{entries}")
    (project / "src" / "democonfig" / "local.py").write_text(f'TOKEN = "{SECRET}"\n')
    init_repository(project)
    for path in [project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp_path.chmod(0o755)
    return project


def follow(client: SyncClient, sid: str, timeout_s: float = 600) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page = client.call("session.events", {"session_id": sid, "after": after, "wait_ms": 2000})
        events += page["events"]
        after = page["next"]
        if any(e["type"] == "turn_end" for e in page["events"]):
            return events
    raise AssertionError(f"the turn did not end: {events[-5:]}")


def run_task(kernel: Kernel, provider: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    with kernel.client() as client:
        sid = client.call("session.create")["session_id"]
        started = client.call(
            "session.message",
            {"session_id": sid, "text": SCRIPT.task, "provider": provider, "auto_approve": True},
        )
        assert started["state"] == "planning"
        return sid, follow(client, sid)


def scenario_replies() -> list[Reply]:
    first = Reply(
        "I'll look at the local settings too.",
        [(wire_name("fs.read"), {"path": "src/democonfig/local.py"})],
    )
    turns = [
        Reply(t["say"], [(wire_name(c["tool"]), c["args"]) for c in t["calls"]])
        for t in SCRIPT.provider_turns()
    ]
    return [first, *turns]


def check_scenario(project: Path, events: list[dict[str, Any]]) -> None:
    end = events[-1]
    assert end["type"] == "turn_end" and end["status"] == "done", end
    reached = [e["to"] for e in events if e["type"] == "state"]
    assert [s for s in reached if s in STATES] == STATES and reached[-1] == "idle"
    refused = [e for e in events if e["type"] == "tool_result" and not e["ok"]]
    assert [r["error"]["code"] for r in refused] == ["tool.unavailable"]  # src/ too early
    (commit,) = [e for e in events if e["type"] == "commit"]
    assert commit["message"] == "Add error handling to parseConfig"
    assert git(project, "log", "-1", "--format=%s").strip() == commit["message"]
    assert "ConfigError" in (project / "src/democonfig/config.py").read_text()
    timed = [e for e in events if e["type"] == "tool_result"]
    assert timed and all(e["duration_ms"] > 0 for e in timed)


@pytest.fixture(scope="module", params=["docker", "podman"])
def any_runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def test_scripted_provider_plays_the_scenario_in_a_sandbox(
    tmp_path: Path, any_runtime: str
) -> None:
    project = project_with(tmp_path, [])
    kernel = Kernel(tmp_path, project, any_runtime).start()
    try:
        _, events = run_task(kernel, {"name": "scripted", "turns": SCRIPT.provider_turns()})
    finally:
        kernel.stop()
    check_scenario(project, events)
    answers = [e for e in kernel.entries("syscall") if e["syscall_type"] == "ai.result"]
    assert len(answers) == len(SCRIPT.provider_turns())  # one model request per round
    assert all(e["caller"].startswith("plugin:ai-provider@ai:") for e in answers)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_real_adapters_through_the_proxy_to_fake_servers(
    tmp_path: Path, docker_runtime: str, kind: str
) -> None:
    server_cls = FakeOpenAIServer if kind == "openai" else FakeAnthropicServer
    with server_cls(scenario_replies(), api_key=API_KEY) as server:
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        project = project_with(tmp_path, [f"127.0.0.1:{port}"])
        kernel = Kernel(tmp_path, project, docker_runtime).start()
        try:
            provider = {"name": kind, "model": "fake-model", "base_url": server.base_url,
                        "api_key": API_KEY}  # fmt: skip
            _, events = run_task(kernel, provider)
        finally:
            log = kernel.stop()
        sent = json.dumps([r.body for r in server.requests])
    check_scenario(project, events)
    assert SECRET not in sent and "[REDACTED" in sent  # redacted before the model saw it
    assert len(server.requests) == len(scenario_replies())  # one request per model round
    audit = kernel.audit("export", "--format", "jsonl")
    assert audit.returncode == 0
    assert API_KEY not in audit.stdout and API_KEY not in log
    allowed = [e for e in kernel.entries("network_request") if e["policy_decision"] == "allowed"]
    assert allowed and allowed[0]["input_summary"] == f"CONNECT 127.0.0.1:{port}"


def test_a_rate_limit_in_the_sandbox_is_retried_by_the_kernel_and_usage_booked(
    tmp_path: Path, docker_runtime: str
) -> None:
    """ADR-044 on the real path: the 429's retry-after-ms crosses the sandbox to the
    kernel, which announces the wait, retries, and books the reported usage."""
    replies = [Fail(429, "Rate limit reached", {"retry-after-ms": "300"}),
               Reply("All good.", usage=(900, 12), cached=800)]  # fmt: skip
    with FakeOpenAIServer(replies) as server:
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        project = project_with(tmp_path, [f"127.0.0.1:{port}"])
        kernel = Kernel(tmp_path, project, docker_runtime).start()
        try:
            provider = {"name": "openai", "model": "fake-model", "base_url": server.base_url}
            sid, events = run_task(kernel, provider)
            with kernel.client() as client:
                usage = client.call("session.usage", {"session_id": sid})
        finally:
            kernel.stop()
        assert len(server.requests) == 2
    (retry,) = [e for e in events if e["type"] == "retry"]
    assert retry["kind"] == "rate_limit" and retry["wait_s"] == 0.3
    assert retry["text"] == "rate limited, retrying in 0.3 s (attempt 2 of 5)"
    end = events[-1]
    assert end["status"] == "done" and end["text"] == "All good."
    assert end["usage"]["input_tokens"] == 900 and end["usage"]["cached_tokens"] == 800
    assert usage["session"]["input_tokens"] == 900 and usage["calibration"] is not None


def test_a_host_not_allow_listed_gets_403_and_an_audit_entry(
    tmp_path: Path, docker_runtime: str
) -> None:
    with FakeOpenAIServer([Reply("never")]) as server:
        project = project_with(tmp_path, ["api.openai.com"])
        kernel = Kernel(tmp_path, project, docker_runtime).start()
        try:
            provider = {"name": "openai", "model": "m", "base_url": server.base_url}
            _, events = run_task(kernel, provider)
        finally:
            kernel.stop()
        assert server.requests == []
    end = events[-1]
    assert end["status"] == "failed"
    assert "network_whitelist" in json.dumps(end["error"])
    (denied,) = [e for e in kernel.entries("network_request") if e["policy_decision"] == "denied"]
    assert denied["input_summary"].startswith("CONNECT 127.0.0.1:")


def test_adversarial_turns_against_the_real_adapter(tmp_path: Path, docker_runtime: str) -> None:
    """A model that pushes: a 2 MB output, source before a red test, a secret; and debug."""
    read_big = (wire_name("fs.read"), {"path": "data/big.txt"})  # whole: 2 MB
    replies = [
        Reply("Planning.", [(wire_name("plan.complete"), {"summary": "try things"})]),
        Reply("A big read.", [read_big]),
        Reply("Tests pass already: code now?", [(wire_name("test.run"), {})]),
        Reply("Code anyway.", [(wire_name("fs.write"), {"path": "src/x.py", "content": "x"})]),
        Reply("And a secret.", [(wire_name("fs.read"), {"path": "src/democonfig/local.py"})]),
        Reply("I stop here."),
    ]  # fmt: skip
    with FakeOpenAIServer(replies) as server:
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        project = tmp_path / "project"
        shutil.copytree(DEMO, project)
        (project / "data").mkdir()
        lines = (f"line {i:07d} " + "x" * 40 + "\n" for i in range(40000))
        (project / "data" / "big.txt").write_text("".join(lines))  # 2 MB
        policy = project / ".fluffy" / "policy.yaml"
        policy.write_text(
            policy.read_text()
            + "\n  - name: debug-needs-review\n"
            + "    match: {syscall: session.set_mode, session_mode: [debug]}\n"
            + "    action: require_review\n"
            + f"\nnetwork_whitelist: ['127.0.0.1:{port}']\n"
            + "tools: {read_max_size: 4MiB}\n"  # the 2 MB file may be read whole
        )
        (project / "src" / "democonfig" / "local.py").write_text(f'TOKEN = "{SECRET}"\n')
        init_repository(project)
        for path in [project, *project.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        tmp_path.chmod(0o755)
        kernel = Kernel(tmp_path, project, docker_runtime).start()
        try:
            provider = {"name": "openai", "model": "m", "base_url": server.base_url}
            sid, events = run_task(kernel, provider)
            with kernel.client() as client:
                client.call("session.cancel", {"session_id": sid})  # modes change in idle
                with pytest.raises(ModeDenied) as refused:
                    client.call("session.set_mode", {"session_id": sid, "mode": "debug"})
                debug = client.call(
                    "session.set_mode", {"session_id": sid, "mode": "debug", "approved": True}
                )
                mode_after = client.call("session.get", {"session_id": sid})["mode"]
        finally:
            kernel.stop()
        tool_messages = [m for m in server.requests[-1].body["messages"] if m.get("role") == "tool"]
    assert events[-1]["status"] == "done"
    big = tool_messages[1]["content"]  # 2 MB read: cut to the token budget, marked
    assert len(big) < 40_000 and "characters truncated" in big
    test_run = [e for e in events if e["type"] == "tool_result" and e["tool_name"] == "test.run"]
    assert test_run[0]["ok"]  # it ran, and passed: not red, so no move to code_writing
    states = [e["to"] for e in events if e["type"] == "state"]
    assert "code_writing" not in states and states[-1] == "test_writing"
    write = [e for e in events if e["type"] == "tool_result" and e["tool_name"] == "fs.write"]
    assert (
        write[0]["error"]["code"] == "tool.unavailable"
        and "test_writing" in write[0]["error"]["what"]
    )
    assert SECRET not in json.dumps(tool_messages) and "[REDACTED" in tool_messages[-1]["content"]
    assert "requires review and was not approved" in (refused.value.why or "")
    assert debug["mode"] == "debug" == mode_after  # approved by the user: allowed
