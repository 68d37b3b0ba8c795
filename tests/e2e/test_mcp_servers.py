"""MCP servers in their sandboxes, through the real bootstrap and L1 kernel (Docker and
Podman): the reference server ``mcp-server-time`` (its packages downloaded on the host and
installed offline) and a small stdio server of the tests' own (``--path``), added with
`fluffy mcp add` while the kernel runs.  A scripted model calls their tools: one call
allowed by a rule, one held for the user and allowed, one refused; a crashed server is
started again; the server's attempts at the network fail inside its sandbox.  A server
added with ``--allow-host`` reaches that loopback HTTP server through the kernel's proxy
(and, in L1, the gate's dial) and is refused one only the policy allows."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks._proxy import loopback_server
from fluffy.ipc.client import SyncClient
from tests.e2e.project_kernel import ROOT, audit, fluffy, project_kernel
from tests.e2e.test_tdd_decisions import Session

pytestmark = pytest.mark.e2e

PROBE = ROOT / "tests" / "fakes" / "mcp_server"
RULES = """
  - name: time-conversions
    match: {syscall: mcp.time.convert_time}
    action: allow
  - name: probe-tools
    match: {syscall: "mcp.probe.*"}
    action: allow
  - name: web-tools
    match: {syscall: "mcp.web.*"}
    action: allow
"""


def _add(kit: dict[str, Any], *args: str) -> Any:
    return fluffy(kit, "mcp", "add", "--yes", "--json", "--project", str(kit["project"]), *args)


@pytest.fixture(scope="module", params=["docker", "podman"])
def kit(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """One kernel per engine (they are slow to start) with three servers: ``time`` (from
    PyPI), ``probe`` (the tests' own, no network) and ``web`` (the same code, added with
    --allow-host for one of two loopback HTTP servers the policy allows, and a host the
    policy does not allow)."""
    runtime = str(request.param)
    base = tmp_path_factory.mktemp(f"mcp-{runtime}")
    with loopback_server() as port, loopback_server() as other:
        allowed = f"\nnetwork_whitelist: ['127.0.0.1:{port}', '127.0.0.1:{other}']\n"

        def prepare(project: Path) -> None:
            policy = project / ".fluffy" / "policy.yaml"
            policy.write_text(policy.read_text() + RULES + allowed)

        with project_kernel(runtime, base, prepare) as kit:
            time_server = _add(kit, "time", "--pip", "mcp-server-time", "--",
                               "mcp-server-time", "--local-timezone", "UTC")  # fmt: skip
            assert time_server.returncode == 0, time_server.stdout + time_server.stderr
            probe = _add(kit, "probe", "--path", str(PROBE), "--", "python3", "server.py")
            assert probe.returncode == 0, probe.stdout + probe.stderr
            hosts = ["--allow-host", f"127.0.0.1:{port}", "--allow-host", "api.example.com"]
            web = _add(kit, "web", "--path", str(PROBE), *hosts, "--", "python3", "server.py")
            assert web.returncode == 0, web.stdout + web.stderr
            kit["added"] = {
                name: json.loads(out.stdout)
                for name, out in (("time", time_server), ("probe", probe), ("web", web))
            }
            kit.update(port=port, other=other)
            with SyncClient(str(kit["socket"]), timeout=600) as client:
                kit["client"] = client
                yield kit


def _call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": tool, "args": args}


def _results(session: Session) -> dict[str, dict[str, Any]]:
    return {e["tool_name"]: e for e in session.events if e["type"] == "tool_result"}


def test_added_servers_offer_their_tools_to_a_running_kernel(kit: dict[str, Any]) -> None:
    added = kit["added"]["time"]
    assert added["kernel_reloaded"] is True
    assert added["server"]["packages"]["mcp-server-time"]
    assert (kit["project"] / ".fluffy" / "mcp" / "time.json").is_file()
    listed = kit["client"].call("tool.list", {})["tools"]
    tools = {t["name"]: t for t in listed}
    schema = tools["mcp.time.get_current_time"]["input_schema"]
    assert schema["required"] == ["timezone"]
    assert tools["mcp.probe.connect"]["kind"] == "external"
    shown = fluffy(kit, "mcp", "list", "--json", "--project", str(kit["project"]))
    rows = {row["name"]: row for row in json.loads(shown.stdout)["servers"]}
    assert set(rows) == {"probe", "time", "web"} and rows["time"]["kernel"] is not None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("nope", "--pip", "no-such-package-fluffy-test-0", "--", "x"), "cannot install"),
        (("nocmd", "--path", str(PROBE), "--", "no-such-command"), "did not start"),
        (("time", "--pip", "mcp-server-time", "--", "mcp-server-time"), "already"),
        (("Bad_Name", "--", "x"), "not a valid MCP server name"),
    ],
)
def test_a_bad_server_is_refused_and_changes_nothing(
    kit: dict[str, Any], args: tuple[str, ...], said: str
) -> None:
    folder = kit["project"] / ".fluffy" / "mcp"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    tools = kit["client"].call("tool.list", {})["tools"]
    out = _add(kit, *args)
    assert out.returncode == 3, out.stdout + out.stderr
    error = json.loads(out.stdout)["error"]
    assert error["code"] == "mcp.server_invalid" and said in error["what"], error
    assert error["fix"]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert kit["client"].call("tool.list", {})["tools"] == tools


def test_a_rule_allows_one_call_the_user_allows_another_and_refuses_a_third(
    kit: dict[str, Any],
) -> None:
    client = kit["client"]
    session = Session(client)
    turns = [
        {"say": "Convert, then ask the time.", "calls": [
            _call("mcp.time.convert_time", source_timezone="UTC", time="12:00",
                  target_timezone="Asia/Tokyo"),
            _call("mcp.time.get_current_time", timezone="Europe/Paris")]},
        {"say": "Once more.", "calls": [_call("mcp.time.get_current_time", timezone="UTC")]},
        {"say": "Done.", "calls": []},
    ]  # fmt: skip
    session.start("what time is it", turns, auto_approve=True)  # --yes: still asked
    asked = session.until("tool_review")
    assert asked["tool"] == "mcp.time.get_current_time" and "Europe/Paris" in asked["arguments"]
    pending = client.call("tool.pending", {"session_id": session.id})["pending"]
    assert pending["review_id"] == asked["review_id"]
    client.call("tool.decide", {"session_id": session.id, "review_id": asked["review_id"],
                                "decision": "allow"})  # fmt: skip
    again = session.until("tool_review")
    client.call("tool.decide", {"session_id": session.id, "review_id": again["review_id"],
                                "decision": "deny", "reason": "enough clocks"})  # fmt: skip
    end = session.until("turn_end")
    assert end["status"] == "done", session.events[-6:]
    converted = _results(session)["mcp.time.convert_time"]
    assert converted["ok"] and "datetime" in converted["summary"]  # ran without asking
    calls = [e for e in session.events if e["type"] == "tool_result"]
    asked_calls = [c for c in calls if c["tool_name"] == "mcp.time.get_current_time"]
    assert [c["ok"] for c in asked_calls] == [True, False]
    assert "Europe/Paris" in asked_calls[0]["summary"]
    assert "the user refused" in asked_calls[1]["summary"]
    entries = [e for e in audit(kit, "tool_result") if e["syscall_type"].startswith("mcp.time")]
    by_decision = sorted((e["syscall_type"], e["policy_decision"], e["metadata"].get("review"))
                         for e in entries[-3:])  # fmt: skip
    assert by_decision == [
        ("mcp.time.convert_time", "allowed", None),
        ("mcp.time.get_current_time", "denied", None),
        ("mcp.time.get_current_time", "review_required", "allowed once by the user"),
    ]
    started = [e for e in audit(kit, "mcp_server_started") if e["metadata"]["server"] == "time"]
    assert started and {e["sandbox_id"] for e in entries[-3:-1]} == {started[0]["sandbox_id"]}
    created = audit(kit, "sandbox_created")
    assert any(e["sandbox_id"] == started[0]["sandbox_id"] for e in created)


def test_a_crashed_server_is_started_again_on_the_next_call(kit: dict[str, Any]) -> None:
    session = Session(kit["client"])
    turns = [
        {"say": "Crash it.", "calls": [_call("mcp.probe.crash")]},
        {"say": "Use it again.", "calls": [_call("mcp.probe.echo", text="back")]},
        {"say": "Done.", "calls": []},
    ]
    session.start("crash and recover", turns, auto_approve=True)
    end = session.until("turn_end")
    assert end["status"] == "done", session.events[-6:]
    crash, echo = [e for e in session.events if e["type"] == "tool_result"]
    assert not crash["ok"] and "exited during the call" in crash["summary"]
    assert echo["ok"] and echo["summary"] == "back"
    failed = [e for e in audit(kit, "mcp_server_failed") if e["metadata"]["server"] == "probe"]
    assert failed and "exit code 3" in failed[-1]["metadata"]["why"]
    starts = [e for e in audit(kit, "mcp_server_started") if e["metadata"]["server"] == "probe"]
    assert len(starts) >= 2 and starts[-1]["sandbox_id"] != failed[-1]["sandbox_id"]


def test_the_server_cannot_reach_the_network(kit: dict[str, Any]) -> None:
    """The server's sandbox refuses IP sockets (seccomp: EPERM) and has a loopback
    interface only: the host's own loopback service, which the test listens on, hears
    nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        session = Session(kit["client"])
        turns = [
            {"say": "Reach out.", "calls": [_call("mcp.probe.connect", host="127.0.0.1", port=port),
                                            _call("mcp.probe.interfaces")]},
            {"say": "Done.", "calls": []},
        ]  # fmt: skip
        session.start("try the network", turns, auto_approve=True)
        assert session.until("turn_end")["status"] == "done"
        listener.setblocking(False)  # a connection that came would wait in the backlog
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    connect, interfaces = [e for e in session.events if e["type"] == "tool_result"]
    tried = json.loads(connect["summary"])
    assert tried == {"connected": False, "errno": 1, "error": "PermissionError"}  # EPERM
    assert interfaces["summary"] == "lo"


def _answer(result: dict[str, Any]) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = json.loads(result["summary"])
    except ValueError:
        raise AssertionError(f"not the tool's JSON answer: {result}") from None
    return answer


def test_a_server_reaches_its_allowed_host_through_the_proxy_and_no_other(
    kit: dict[str, Any],
) -> None:
    port, other = kit["port"], kit["other"]
    added = kit["added"]["web"]
    assert added["server"]["allowed_hosts"] == [f"127.0.0.1:{port}", "api.example.com"]
    [warning] = added["warnings"]  # the policy does not allow api.example.com
    assert warning.startswith("api.example.com is not in the network_whitelist")
    session = Session(kit["client"])
    fetch = "mcp.web.fetch"
    turns = [
        {"say": "Fetch both.", "calls": [_call(fetch, host="127.0.0.1", port=port, path="/ok"),
                                         _call(fetch, host="127.0.0.1", port=other)]},
        {"say": "Done.", "calls": []},
    ]  # fmt: skip
    session.start("fetch through the proxy", turns, auto_approve=True)
    end = session.until("turn_end")
    assert end["status"] == "done", session.events[-6:]
    fetched, refused = (_answer(e) for e in session.events if e["type"] == "tool_result")
    assert fetched["ok"] and fetched["status"] == 200, fetched
    assert fetched["body"] == "hello from /ok"
    assert fetched["proxy"].startswith("http://127.0.0.1:")  # the sandbox's forwarder
    assert not refused["ok"] and "403" in refused["error"], refused
    requests = [e for e in audit(kit, "network_request") if e["caller"] == "sandbox:mcp-web"]
    decided = {
        (e["input_summary"], e["policy_decision"], e["deny_reason"])
        for e in requests
        if e["metadata"]["phase"] == "decision"
    }
    assert decided == {
        (f"CONNECT 127.0.0.1:{port}", "allowed", None),
        (f"CONNECT 127.0.0.1:{other}", "denied", "not in the sandbox's allowed hosts"),
    }
    closed = [e for e in requests if e["metadata"]["phase"] == "close"]
    assert closed and int(closed[0]["metadata"]["bytes_down"]) > 0
