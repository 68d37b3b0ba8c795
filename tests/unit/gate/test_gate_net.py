"""The gate's dialler (L1 has no network): real Unix sockets, real loopback servers.

The kernel's CONNECT proxy in L1 gets its upstream connections only from here; the gate
re-checks each target against the allow-list written on the host, resolves names itself
and passes the connected socket back.  tests/integration/test_engine_gate.py makes the
same requests from inside a real L1.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._proxy import loopback_server
from fluffy.gate import net
from fluffy.kernel.net import AllowList, ConnectProxy, ProxyRecord
from fluffy.kernel.net.dial import DialRefused, gate_dial

pytestmark = pytest.mark.unit


def rules_of(entries: list[str]) -> list[net.Rule]:
    """What the CLI writes for these policy.yaml entries (fluffy.cli.lifecycle)."""
    return [(r.host, r.port, r.wildcard) for r in AllowList.from_entries(entries).rules]


@pytest.mark.parametrize(
    ("entries", "host", "port", "admitted"),
    [
        (["api.openai.com"], "api.openai.com", 443, True),
        (["api.openai.com"], "api.openai.com", 80, False),
        (["api.openai.com:8443"], "api.openai.com", 8443, True),
        (["*.example.com"], "a.b.example.com", 443, True),
        (["*.example.com"], "example.com", 443, False),  # strict subdomains only
        (["*.example.com"], "badexample.com", 443, False),
        (["127.0.0.1:11434"], "127.0.0.1", 11434, True),
        (["127.0.0.1:11434"], "127.0.0.2", 11434, False),
        (["127.0.0.1:11434"], "localhost", 11434, False),  # a name never matches an IP rule
        (["localhost:11434"], "127.0.0.1", 11434, False),  # nor an address a name rule
        (["[::1]:8080"], "::1", 8080, True),
        (["[::1]:8080"], "0:0:0:0:0:0:0:1", 8080, True),
        ([], "api.openai.com", 443, False),
    ],
)
def test_the_gate_admits_what_the_kernels_allow_list_admits(
    entries: list[str], host: str, port: int, admitted: bool
) -> None:
    assert net.admits(rules_of(entries), host, port) is admitted
    assert (AllowList.from_entries(entries).allows(host, port) is not None) is admitted


def test_a_missing_or_unreadable_allow_list_admits_nothing(tmp_path: Path) -> None:
    assert net.load(tmp_path / "absent.json") == []
    bad = tmp_path / "bad.json"
    for text in ("not json", '{"rules": 3}', '{"rules": [["a"]]}', "[]"):
        bad.write_text(text)
        assert net.load(bad) == []


class Gate:
    def __init__(self, folder: Path, entries: list[str]) -> None:
        self.sock, self.rules = folder / "net.sock", folder / "net.json"
        self.allow(entries)
        self.refusals: list[tuple[str, str, str]] = []
        self.server = net.Dialler(self.sock, self.rules, lambda *r: self.refusals.append(r))

    def allow(self, entries: list[str]) -> None:
        self.rules.write_text(json.dumps({"rules": rules_of(entries)}))


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    made = Gate(tmp_path, [])
    thread = threading.Thread(target=made.server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield made
    made.server.shutdown()
    made.server.server_close()
    thread.join()


def http_get(sock: socket.socket, path: str = "/models") -> bytes:
    with sock:
        sock.settimeout(5)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return b"".join(iter(lambda: sock.recv(65536), b""))


def test_an_admitted_target_comes_back_as_a_connected_socket(gate: Gate) -> None:
    with loopback_server() as port:
        gate.allow([f"127.0.0.1:{port}"])
        answer = http_get(gate_dial(str(gate.sock), "127.0.0.1", port, 5))
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello from /models")
    assert gate.refusals == []


def test_a_target_not_admitted_is_refused_and_logged(gate: Gate) -> None:
    with loopback_server() as port:
        gate.allow([f"127.0.0.1:{port}"])
        with pytest.raises(DialRefused, match="not in the network allow-list"):
            gate_dial(str(gate.sock), "127.0.0.1", port + 1 if port < 65535 else 1, 5)
        with pytest.raises(DialRefused):
            gate_dial(str(gate.sock), "api.openai.com", 443, 5)
        with pytest.raises(DialRefused):  # an address in a name's clothes: never a rule
            gate_dial(str(gate.sock), "0x7f.1", port, 5)
    assert [(m, t) for m, t, _ in gate.refusals] == [
        ("CONNECT", f"127.0.0.1:{port + 1 if port < 65535 else 1}"),
        ("CONNECT", "api.openai.com:443"),
        ("CONNECT", f"0x7f.1:{port}"),
    ]


def test_a_name_that_resolves_to_loopback_needs_an_ip_entry(gate: Gate) -> None:
    with loopback_server() as port:
        gate.allow([f"localhost:{port}"])
        with pytest.raises(DialRefused, match="private or loopback"):
            gate_dial(str(gate.sock), "localhost", port, 5)
        gate.allow([f"localhost:{port}", f"127.0.0.1:{port}"])  # read again per request
        answer = http_get(gate_dial(str(gate.sock), "localhost", port, 5))
    assert answer.endswith(b"hello from /models")


@pytest.mark.parametrize(
    "request_line",
    [
        b"not json\n",
        b'{"host": "a b", "port": 443}\n',
        b'{"host": "x.com", "port": 0}\n',
        b'{"host": "x.com"}\n',
        b'{"host": ["x.com"], "port": 80}\n',
        b"\n",
    ],
)
def test_a_malformed_request_gets_a_400_and_the_gate_keeps_serving(
    gate: Gate, request_line: bytes
) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(gate.sock))
        sock.sendall(request_line)
        answer = json.loads(sock.recv(4096))
    assert answer["status"] == 400
    with loopback_server() as port:
        gate.allow([f"127.0.0.1:{port}"])
        assert http_get(gate_dial(str(gate.sock), "127.0.0.1", port, 5)).endswith(b"/models")


def test_an_admitted_target_that_does_not_answer_is_a_dial_error(gate: Gate) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: refused
        gate.allow([f"127.0.0.1:{port}"])
        with pytest.raises(OSError, match=r"cannot reach 127\.0\.0\.1") as caught:
            gate_dial(str(gate.sock), "127.0.0.1", port, 5)
    assert not isinstance(caught.value, DialRefused)


def test_the_proxy_dials_through_the_gate_and_the_gate_has_the_last_word(
    gate: Gate, tmp_path: Path
) -> None:
    """The kernel's allow-list admits both ports; the gate's (the host's copy) only one."""
    records: list[ProxyRecord] = []

    async def audit(record: ProxyRecord) -> None:
        records.append(record)

    async def through(path: Path, port: int) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"HTTP/1.1 200"):
                writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = head + await reader.read()
        writer.close()
        return answer

    async def main(allowed: int, other: int) -> tuple[bytes, bytes]:
        proxy = ConnectProxy(
            AllowList.from_entries([f"127.0.0.1:{allowed}", f"127.0.0.1:{other}"]),
            audit,
            dial=lambda host, port, timeout: gate_dial(str(gate.sock), host, port, timeout),
        )
        await proxy.start(tmp_path / "proxy.sock", tag="s1")
        try:
            return (
                await through(tmp_path / "proxy.sock", allowed),
                await through(tmp_path / "proxy.sock", other),
            )
        finally:
            await proxy.close()

    with loopback_server() as allowed, loopback_server() as other:
        gate.allow([f"127.0.0.1:{allowed}"])
        ok, refused = asyncio.run(main(allowed, other))
    assert ok.startswith(b"HTTP/1.1 200 Connection established") and ok.endswith(b"hello from /x")
    assert refused.startswith(b"HTTP/1.1 403") and b"not in the network allow-list" in refused
    closes = [(r.port, r.decision, r.status) for r in records if r.phase == "close"]
    assert closes == [(allowed, "allow", 200), (other, "deny", 403)]


@pytest.mark.parametrize(
    "text",
    [
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::1",
        "2002:7f00:1::",
        "::127.0.0.1",
        "fec0::1",
        "10.0.0.1",
        "169.254.169.254",
        "::ffff:127.0.0.1",
        "127.0.0.1",
    ],
)
def test_addresses_that_can_lead_to_private_ones_are_never_public(text: str) -> None:
    import ipaddress

    from fluffy.kernel.net.proxy import public  # what the kernel's proxy applies

    found = ipaddress.ip_address(text)
    assert not net.public(found) and not public(found)
    assert net.public(ipaddress.ip_address("8.8.8.8")) and public(ipaddress.ip_address("1.1.1.1"))


def test_a_port_that_is_not_an_integer_gets_a_400(gate: Gate) -> None:
    for line in (b'{"host": "x.com", "port": 1e400}\n', b'{"host": "x.com", "port": 443.0}\n',
                 b"[" * 1500 + b"\n"):  # fmt: skip
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(gate.sock))
            sock.sendall(line)
            assert json.loads(sock.recv(4096))["status"] == 400


def test_connections_beyond_the_limit_are_closed_at_once(gate: Gate) -> None:
    idle = []
    try:
        for _ in range(net.MAX_CONNECTIONS):  # each holds a thread, sending nothing
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(gate.sock))
            idle.append(sock)
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(str(gate.sock))  # blocking: waits in the backlog until accepted
        extra.settimeout(5)
        try:  # the gate may close it before the request is even sent (EPIPE)
            extra.sendall(b'{"host": "x.com", "port": 443}\n')
            said = extra.recv(4096)
        except (BrokenPipeError, ConnectionResetError):  # closed with the request unread
            said = b""
        assert said == b""  # closed without an answer
        extra.close()
    finally:
        for sock in idle:
            sock.close()
    with loopback_server() as port:  # the slots come back
        gate.allow([f"127.0.0.1:{port}"])
        for attempt in range(50):
            try:
                answer = http_get(gate_dial(str(gate.sock), "127.0.0.1", port, 5))
                break
            except OSError:  # a slot is released just after its connection closes
                assert attempt < 49, "the gate never served again"
                time.sleep(0.1)
    assert answer.endswith(b"/models")


def test_entries_new_in_policy_yaml_reach_the_gate_only_when_approved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """policy.yaml is in the project, which the kernel can write: the gate's list widens
    only with the person's yes (the first list is taken as written; narrowing is free),
    at the terminal or by --yes."""
    from fluffy.cli import connect
    from fluffy.cli.lifecycle import approver, write_network_allowlist

    monkeypatch.setattr(connect.sys.stdin, "isatty", lambda: False)

    project, net_json = tmp_path / "project", tmp_path / "base" / "net.json"
    (project / ".fluffy").mkdir(parents=True)

    def policy(*entries: str) -> None:
        (project / ".fluffy" / "policy.yaml").write_text(f"network_whitelist: {list(entries)}\n")

    def gate_rules() -> list[list[object]]:
        return list(json.loads(net_json.read_text())["rules"])

    asked: list[str] = []
    policy("api.openai.com")
    assert write_network_allowlist(str(project), net_json, None) == []
    assert gate_rules() == [["api.openai.com", 443, False]]
    policy("api.openai.com", "169.254.169.254:80")  # what a compromised kernel would add
    left_out = write_network_allowlist(str(project), net_json, None)  # no terminal
    assert left_out == ["169.254.169.254:80"] and gate_rules() == [["api.openai.com", 443, False]]
    assert write_network_allowlist(str(project), net_json, lambda q: asked.append(q) or False)
    assert "169.254.169.254:80" in asked[0] and len(gate_rules()) == 1
    assert write_network_allowlist(str(project), net_json, lambda q: True) == []
    assert gate_rules()[1] == ["169.254.169.254", 80, False]
    policy("api.openai.com", "169.254.169.254:80", "127.0.0.1:11434")
    assert write_network_allowlist(str(project), net_json, approver(False)) == [
        "127.0.0.1:11434"
    ]  # no terminal, no --yes
    assert write_network_allowlist(str(project), net_json, approver(True)) == []  # --yes
    assert gate_rules()[2] == ["127.0.0.1", 11434, False]
    assert "127.0.0.1:11434. Allow it? yes (--yes)" in capsys.readouterr().out  # said
    policy()  # narrowed: no question
    assert write_network_allowlist(str(project), net_json, None) == [] and gate_rules() == []


class _Launched:
    """Stands in for the bootstrap process: notes whether the gate had a list when it
    was launched, and reports itself healthy at once."""

    def __init__(self, net_json: Path, status: Path, seen: list[bool]) -> None:
        seen.append(net_json.exists())
        self.pid, self.returncode, self.terminated = 4242, None, False
        status.write_text(json.dumps({"pid": self.pid, "health": "healthy"}))

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.terminated = True

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_the_gate_admits_nothing_while_a_start_makes_its_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous list is put aside before the bootstrap is launched (the dialler reads
    net.json at each connection), is what a new entry is compared with, and an
    interrupted question stops the supervisor that was launched."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli import lifecycle

    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    (project / ".fluffy").mkdir(parents=True)
    (project / ".fluffy" / "policy.yaml").write_text("network_whitelist: [api.openai.com]\n")
    p = paths(tmp_path / "home", str(project))
    net_json = p["base"] / "net.json"
    seen: list[bool] = []
    launched: list[_Launched] = []

    def popen(*args: object, **kwargs: object) -> _Launched:
        launched.append(_Launched(net_json, p["status"], seen))
        return launched[-1]

    monkeypatch.setattr(lifecycle.subprocess, "Popen", popen)
    lifecycle.launch_supervisor(str(project), detach=True)  # the first list
    assert json.loads(net_json.read_text())["rules"] == [["api.openai.com", 443, False]]
    (project / ".fluffy" / "policy.yaml").write_text(
        "network_whitelist: [api.openai.com, 'evil.example:443']\n"
    )

    def interrupted(question: str) -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        lifecycle.launch_supervisor(str(project), detach=True, confirm=interrupted)
    assert seen == [False, False]  # no list at either launch
    assert launched[-1].terminated  # no kernel left on a half start
    assert not net_json.exists()  # nothing admitted; the approved list kept aside
    status = lifecycle.launch_supervisor(str(project), detach=True)[0]
    assert json.loads(net_json.read_text())["rules"] == [["api.openai.com", 443, False]]
    assert status["health"] == "healthy"  # evil.example: not approved, left out
    assert not (p["base"] / "net.approved.json").exists()


def test_a_broken_policy_is_reported_at_once_not_as_a_crash_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy.yaml that does not load is read on the host as the kernel starts: the
    start ends at once with its file:line:field, the supervisor launched is stopped,
    and the gate's list admits nothing."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli import lifecycle
    from fluffy.errors import KernelStartFailed

    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    (project / ".fluffy").mkdir(parents=True)
    (project / ".fluffy" / "policy.yaml").write_text(
        "network_whitelist: [api.openai.com]\ncapabilities:\n"
        "  - {name: x, match: {syscall: fs.read}, action: alow}\n"
    )
    p = paths(tmp_path / "home", str(project))
    launched: list[_Launched] = []

    def popen(*args: object, **kwargs: object) -> _Launched:
        launched.append(_Launched(p["base"] / "net.json", p["status"], []))
        return launched[-1]

    monkeypatch.setattr(lifecycle.subprocess, "Popen", popen)
    with pytest.raises(KernelStartFailed) as raised:
        lifecycle.launch_supervisor(str(project), detach=True)
    error = raised.value
    assert "policy.yaml:3: capabilities.0.action" in error.what
    assert str(project) in error.what  # the host path, not where L1 mounts it
    assert "fluffy policy validate" in (error.fix or "")
    assert launched[-1].terminated
    assert not (p["base"] / "net.json").exists()  # nothing admitted
    p["base"].mkdir(parents=True, exist_ok=True)
    (p["base"] / "net.json").write_text('{"rules": [["api.openai.com", 443, false]]}')
    with pytest.raises(KernelStartFailed):  # again, with a list approved before
        lifecycle.launch_supervisor(str(project), detach=True)
    approved = json.loads((p["base"] / "net.json").read_text())["rules"]
    assert approved == [["api.openai.com", 443, False]]  # kept for the next start
