"""MCP servers that need the network (ADR-046): ``allowed_hosts`` in the record and on
the command line, and a real server process reaching a loopback HTTP server through the
kernel's CONNECT proxy -- when both the policy and its own hosts allow it, and refused
(and audited) when only the policy does.  No proxy socket for a server without hosts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from benchmarks._proxy import loopback_server
from fluffy.cli.main import parse
from fluffy.cli.mcp import _draft, _host_warnings, _unlisted_hosts
from fluffy.errors import McpServerInvalid
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.mcp.connection import McpConnection
from fluffy.kernel.mcp.record import McpTool, parse_record, save_record
from fluffy.kernel.mcp.servers import McpServers
from fluffy.kernel.net import AllowList, ConnectProxy, ProxyRecord
from fluffy.kernel.syscalls.assemble_ai import proxy_auditor
from tests.unit.mcp_support import fake_server

pytestmark = pytest.mark.timeout(60)

Stop = Callable[[], Awaitable[None]]


# -- the record and the command line ------------------------------------------------------
def test_allowed_hosts_take_the_allow_list_syntax_and_round_trip(tmp_path: Path) -> None:
    hosts = ["api.github.com", "Example.org:8443", "*.googleapis.com", "127.0.0.1:8080",
             "[::1]:9000"]  # fmt: skip
    server = fake_server(allowed_hosts=[f" {hosts[0]} ", *hosts[1:]])
    assert server.allowed_hosts == hosts
    path = save_record(tmp_path, server)
    assert parse_record(path.read_bytes(), "x").allowed_hosts == hosts
    allow = server.hosts()
    assert allow is not None
    assert allow.allows("api.github.com", 443) == "api.github.com"
    assert allow.allows("example.org", 8443) and not allow.allows("example.org", 443)
    assert allow.allows("storage.googleapis.com", 443) == "*.googleapis.com"
    assert not allow.allows("evil.example.com", 443)
    assert fake_server().hosts() is None  # no hosts: no list at all, not an empty one


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("*", "is allowed only as the whole first label"),
        ("*.com", "two labels or more"),
        ("api.*.com", "is allowed only as the whole first label"),
        ("https://api.github.com", "port"),
        ("api.github.com:99999", "from 1 to 65535"),
        ("::1", "in brackets"),
        ("2130706433", "non-canonical IP"),
        ("*.10.0.0.1", "cannot cover IP"),
        ("", "not a hostname"),
    ],
)
def test_a_bad_allowed_host_is_refused_saying_why(host: str, said: str) -> None:
    with pytest.raises(ValidationError) as caught:
        fake_server(allowed_hosts=[host])
    text = str(caught.value)
    assert said in text and repr(host) in text and "'host:port'" in text


def test_a_host_given_twice_or_too_many_hosts_are_refused() -> None:
    with pytest.raises(ValidationError, match="given twice"):
        fake_server(allowed_hosts=["api.github.com", "API.github.com"])
    with pytest.raises(ValidationError, match="at most 32"):
        fake_server(allowed_hosts=[f"h{i}.example.com" for i in range(33)])


def test_allow_host_is_repeatable_and_checked_before_anything_is_built() -> None:
    args = parse(["mcp", "add", "web", "--allow-host", "api.github.com", "--allow-host",
                  "127.0.0.1:8080", "--", "web-server", "--allow-host", "x"])  # fmt: skip
    assert args.allow_host == ["api.github.com", "127.0.0.1:8080"]
    assert args.command == ["web-server", "--allow-host", "x"]  # the server's own option
    assert _draft(args).allowed_hosts == ["api.github.com", "127.0.0.1:8080"]
    bad = parse(["mcp", "add", "web", "--allow-host", "*", "--", "web-server"])
    with pytest.raises(McpServerInvalid) as caught:
        _draft(bad)
    assert "cannot register web" in caught.value.what
    assert "allowed_hosts" in caught.value.what and "'*'" in caught.value.what


def _project(tmp_path: Path, whitelist: list[str]) -> Path:
    (tmp_path / ".fluffy").mkdir()
    entries = "".join(f"\n  - '{entry}'" for entry in whitelist)
    (tmp_path / ".fluffy" / "policy.yaml").write_text(
        f"network_whitelist:{entries}\n" if whitelist else "network_whitelist: []\n"
    )
    return tmp_path


def test_hosts_the_policy_does_not_allow_are_warned_about_with_what_to_add(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, ["api.github.com", "*.example.org"])
    hosts = ["api.github.com", "a.example.org", "*.b.example.org", "pypi.org",
             "api.github.com:8443"]  # fmt: skip
    assert _unlisted_hosts(project, hosts) == (["pypi.org", "api.github.com:8443"], None)
    [warning] = _host_warnings(project, hosts)
    assert warning.startswith("pypi.org, api.github.com:8443 are not in the network_whitelist")
    assert "network_whitelist:\n    - 'pypi.org'\n    - 'api.github.com:8443'" in warning
    assert "restart fluffy" in warning
    assert _host_warnings(project, ["api.github.com"]) == []
    assert _host_warnings(project, []) == []


def test_a_policy_that_does_not_load_warns_about_every_host(tmp_path: Path) -> None:
    project = _project(tmp_path, [])
    (project / ".fluffy" / "policy.yaml").write_text("network_whitelist: [':']\n")
    [warning] = _host_warnings(project, ["api.github.com"])
    assert warning.startswith("api.github.com is not in the network_whitelist")
    assert "the policy does not load" in warning


# -- a server process through the proxy ----------------------------------------------------
class Proxy:
    """The kernel's proxy as assemble_ai starts it for a sandbox, with its audit kept."""

    def __init__(self, entries: list[str]) -> None:
        self.records: list[ProxyRecord] = []
        self.started: list[tuple[Path, str, AllowList]] = []
        self.proxy = ConnectProxy(AllowList.from_entries(entries), self._audit)

    async def _audit(self, record: ProxyRecord) -> None:
        self.records.append(record)

    async def start(
        self, path: Path, tag: str, mode: int, owner: tuple[int, int] | None, hosts: AllowList
    ) -> Stop:
        self.started.append((path, tag, hosts))
        await self.proxy.start(path, tag=tag, mode=mode, owner=owner, hosts=hosts)

        async def stop() -> None:
            await self.proxy.stop(path)

        return stop


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server process inherits this environment (the harness): none of the tester's."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY",
                 "no_proxy", "ALL_PROXY", "all_proxy"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")  # the host must drop it for the server


def _fetched(answer: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(answer["content"][0]["text"])
    return result


def test_a_server_reaches_its_allowed_host_and_only_it_through_the_proxy(
    local_manager: Any, no_proxy_env: None
) -> None:
    async def run(port: int, other: int) -> tuple[dict[str, Any], dict[str, Any], Proxy]:
        proxy = Proxy([f"127.0.0.1:{port}", f"127.0.0.1:{other}"])  # the policy: both
        server = fake_server("web", allowed_hosts=[f"127.0.0.1:{port}"])  # its own: one
        connection = McpConnection(
            local_manager, server, start_timeout_s=20, start_proxy=proxy.start
        )
        await connection.start()
        try:
            assert connection.folder is not None
            assert proxy.proxy.paths == [connection.folder / "proxy.sock"]
            allowed = await connection.call("fetch", {"host": "127.0.0.1", "port": port,
                                                       "path": "/through"}, 10)  # fmt: skip
            refused = await connection.call("fetch", {"host": "127.0.0.1", "port": other}, 10)
        finally:
            await connection.close()
        assert proxy.proxy.paths == []  # stopped with the sandbox
        await proxy.proxy.close()
        return _fetched(allowed), _fetched(refused), proxy

    with loopback_server() as port, loopback_server() as other:
        allowed, refused, proxy = asyncio.run(run(port, other))
    assert allowed["ok"] and allowed["status"] == 200, allowed
    assert allowed["body"] == "hello from /through"
    assert allowed["proxy"].startswith("http://127.0.0.1:")  # the forwarder on loopback
    assert not refused["ok"] and "403" in refused["error"], refused
    [(_, tag, hosts)] = proxy.started
    assert tag == "mcp:web" and [r.entry for r in hosts.rules] == [f"127.0.0.1:{port}"]
    [config] = local_manager.created  # IP sockets to reach the forwarder, lo only
    assert (config.seccomp_profile, config.network_mode) == ("standard-net", "none")
    decisions = [(r.tag, r.phase, r.decision, r.port, r.reason) for r in proxy.records]
    assert ("mcp:web", "decision", "allow", port, "") in decisions
    assert ("mcp:web", "decision", "deny", other, "not in the sandbox's allowed hosts") in (
        decisions
    )


def test_a_server_without_hosts_gets_no_proxy_and_no_proxy_variables(
    local_manager: Any, no_proxy_env: None
) -> None:
    async def run(port: int) -> tuple[dict[str, Any], Proxy]:
        proxy = Proxy([f"127.0.0.1:{port}"])
        connection = McpConnection(
            local_manager, fake_server(), start_timeout_s=20, start_proxy=proxy.start
        )
        await connection.start()
        try:
            assert connection.folder is not None
            assert not (connection.folder / "proxy.sock").exists()
            fetched = await connection.call("fetch", {"host": "127.0.0.1", "port": port}, 10)
        finally:
            await connection.close()
        return _fetched(fetched), proxy

    with loopback_server() as port:
        fetched, proxy = asyncio.run(run(port))
    assert fetched == {"ok": False, "error": "no HTTP_PROXY"}
    assert proxy.started == [] and proxy.records == []
    [config] = local_manager.created
    assert (config.seccomp_profile, config.network_mode) == ("standard", "none")


def test_the_probe_without_a_proxy_starts_a_server_with_hosts_and_no_network(
    local_manager: Any, no_proxy_env: None
) -> None:
    """`fluffy mcp add` lists the tools without the proxy: the server still starts."""

    async def run() -> dict[str, Any]:
        server = fake_server("web", allowed_hosts=["api.github.com"])
        connection = McpConnection(local_manager, server, start_timeout_s=20)
        await connection.start()
        try:
            assert connection.stop_proxy is None
            return _fetched(await connection.call("fetch", {"host": "x", "port": 1}, 10))
        finally:
            await connection.close()

    assert asyncio.run(run()) == {"ok": False, "error": "no HTTP_PROXY"}
    assert local_manager.created[0].seccomp_profile == "standard"


def test_the_kernel_s_servers_get_the_proxy_and_stop_it_with_the_server(
    tmp_path: Path, local_manager: Any, no_proxy_env: None
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    events: list[Event] = []

    async def run(port: int) -> tuple[dict[str, Any], list[dict[str, Any]], Proxy]:
        proxy = Proxy([f"127.0.0.1:{port}"])
        hosts = [f"127.0.0.1:{port}"]
        save_record(project, fake_server("web", allowed_hosts=hosts, tools=[McpTool(name="fetch")]))
        servers = McpServers(project, lambda: local_manager, record=events.append,
                             start_timeout_s=20)  # fmt: skip
        servers.load()
        servers.start_proxy = proxy.start  # as assemble_ai sets it
        try:
            fetched = await servers.call("mcp.web.fetch", {"host": "127.0.0.1", "port": port}, 10)
            status = servers.status()
            assert len(proxy.proxy.paths) == 1
        finally:
            await servers.close()
        assert proxy.proxy.paths == []
        await proxy.proxy.close()
        return _fetched(fetched), status, proxy

    with loopback_server() as port:
        fetched, status, proxy = asyncio.run(run(port))
    assert fetched["ok"] and fetched["body"] == "hello from /", fetched
    assert status[0]["allowed_hosts"] == [f"127.0.0.1:{port}"]
    started = next(e for e in events if e.event_type == "mcp_server_started")
    assert started.metadata["allowed_hosts"] == f"127.0.0.1:{port}"
    assert [r.tag for r in proxy.records] == ["mcp:web", "mcp:web"]  # decision, close


def test_the_proxy_audits_an_mcp_server_s_requests_under_its_sandbox() -> None:
    class Audit:
        def __init__(self) -> None:
            self.events: list[Event] = []

        async def record(self, event: Event) -> int:
            self.events.append(event)
            return len(self.events)

    audit = Audit()
    record = proxy_auditor(audit)  # type: ignore[arg-type]
    why = "not in the sandbox's allowed hosts"
    denied = ProxyRecord("mcp:web", "decision", "deny", 403, "127.0.0.1", 9, reason=why,
                         session="mcp:web")  # fmt: skip
    allowed = ProxyRecord("mcp:web", "decision", "allow", 200, "api.github.com", 443,
                          rule="api.github.com", host_rule="api.github.com")  # fmt: skip
    turn = ProxyRecord("s-1", "decision", "allow", 200, "api.openai.com", 443, session="s-1")
    for item in (denied, allowed, turn):
        asyncio.run(record(item))
    first, second, third = audit.events
    assert (first.event_type, first.caller, first.tool_name, first.session_id) == (
        "network_request", "sandbox:mcp-web", "mcp.web", None,
    )  # fmt: skip
    assert first.policy_decision == "denied"
    assert first.deny_reason == "not in the sandbox's allowed hosts"
    assert second.metadata["host_rule"] == "api.github.com"
    assert (third.caller, third.session_id, third.tool_name) == ("sandbox:ai-provider", "s-1", None)
    assert "host_rule" not in third.metadata
