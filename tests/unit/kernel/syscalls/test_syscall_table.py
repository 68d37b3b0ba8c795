"""The typed syscall table: one declaration per method, checked before any handler runs.

On a real Unix socket: strict params (wrong type, unknown field, missing field, not an
object) and a CLI-only method from another socket are refused with the stable codes,
nothing runs, the connection stays open, and the audit observer sees a denial.  On the
kernel's served table (built by kernel/serve.py's own function): a name declared twice
stops start-up, every declaration is well-formed, and the table, docs/ipc.md's method
table and CHANGELOG.md's list are the same set.  The same for the tables of the
sandboxes' own sockets (each for its own kind of sandbox only), against docs/ipc.md's
"Sandbox sockets" table and CHANGELOG.md's list of them;
tests/unit/kernel/syscalls/test_sandbox_syscalls.py refuses their malformed params on real
sockets.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from fluffy.errors import DuplicateSyscall, InvalidPayload, KernelStartFailed, PeerRejected
from fluffy.ipc.client import AsyncClient
from fluffy.ipc.protocol import CURRENT_API_VERSION
from fluffy.ipc.results import Result
from fluffy.kernel.ipc.context import CallContext, CallRecord
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.ipc.syscalls import (
    ANY,
    CLI,
    NoParams,
    OwnSocket,
    Syscall,
    SyscallTable,
)
from fluffy.kernel.syscalls.kernel import default_methods
from fluffy.kernel.syscalls.workflow import workflow_methods
from unit.kernel_table import sandbox_tables, served_table

pytestmark = pytest.mark.anyio  # async tests run on asyncio (tests/conftest.py)


ROOT = Path(__file__).resolve().parents[4]


class EchoParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    approved: bool = False
    limit: int | None = None
    paths: list[str] = []


class EchoResult(Result):
    session_id: str
    approved: bool
    typed: bool


ran: list[Any] = []


async def echo(context: CallContext, params: EchoParams) -> dict[str, Any]:
    ran.append(params)
    return {"session_id": params.session_id, "approved": params.approved, "typed": True}


def optional(context: CallContext, params: NoParams) -> str:
    ran.append(params)
    return "ok"


TABLE = SyscallTable(
    default_methods(),
    [
        Syscall("test.echo", EchoParams, echo, EchoResult, since=1),
        Syscall("test.none", NoParams, optional, str, since=1),
        Syscall("test.user", NoParams, optional, str, since=1, callers=CLI, refusal="do it"),
    ],
)


async def serve(tmp: Path, binding: str = "cli") -> tuple[KernelServer, list[CallRecord], str]:
    server = KernelServer(TABLE)
    seen: list[CallRecord] = []
    server.observer = seen.append
    path = tmp / "run" / "kernel.sock"
    await server.listen(path, binding=binding)
    return server, seen, str(path)


REFUSED = [
    ({"session_id": 7}, "params.session_id: expected `str`, got `int`"),
    ({"session_id": "s", "approved": 1}, "params.approved: expected `bool`, got `int`"),
    ({"session_id": "s", "limit": "5"}, "params.limit: expected `int | null`, got `str`"),
    ({"session_id": "s", "paths": ["a", 2]}, "params.paths[1]: expected `str`, got `int`"),
    ({"session_id": "s", "mode": "x"}, "params: unknown field mode"),
    ({"approved": True}, "params: missing session_id"),
    (None, "params: missing session_id"),
    (["s"], "params: expected `object`, got `array`"),
]


@pytest.mark.parametrize(("params", "said"), REFUSED)
async def test_params_are_decoded_strictly_before_the_handler_runs(
    tmp_path: Path, params: Any, said: str
) -> None:
    ran.clear()
    server, seen, path = await serve(tmp_path)
    client = await AsyncClient.connect(path)
    with pytest.raises(InvalidPayload) as caught:
        await client.call("test.echo", params)
    # the connection stays open: the next call is served
    answer = await client.call("test.echo", {"session_id": "s", "approved": True})
    await client.close()
    await server.close()
    assert caught.value.what == f"test.echo: {said}"
    assert caught.value.fix is not None and "{session_id, approved?" in caught.value.fix
    assert ran == [EchoParams("s", approved=True)]  # the refused call never ran
    assert answer == {"session_id": "s", "approved": True, "typed": True}
    refusal = next(r for r in seen if r.error is not None)
    assert (refusal.method, refusal.decision, refusal.rule) == (
        "test.echo",
        "denied",
        "kernel.method_table",
    )
    assert refusal.error.code == "ipc.invalid_payload"


@pytest.mark.parametrize("params", [None, {}])
async def test_no_params_is_the_empty_struct(tmp_path: Path, params: Any) -> None:
    ran.clear()
    server, _, path = await serve(tmp_path)
    client = await AsyncClient.connect(path)
    assert await client.call("test.none", params) == "ok"
    with pytest.raises(InvalidPayload, match=r"test\.none: params: unknown field x"):
        await client.call("test.none", {"x": 1})
    await client.close()
    await server.close()
    assert ran == [NoParams()]


async def test_a_cli_only_syscall_refuses_another_socket_before_reading_params(
    tmp_path: Path,
) -> None:
    ran.clear()
    server, seen, path = await serve(tmp_path, binding="sb-1")
    client = await AsyncClient.connect(path)
    with pytest.raises(PeerRejected) as caught:
        await client.call("test.user", {"junk": True})  # refused as the caller first
    assert await client.call("test.none") == "ok"  # open; any caller may call this
    await client.close()
    await server.close()
    assert caught.value.what == "only the user may do it"
    assert "sb-1" in (caught.value.why or "")
    assert ran == [NoParams()]
    (refusal,) = [r for r in seen if r.error is not None]
    assert refusal.decision == "denied" and refusal.error.code == "ipc.peer_rejected"


async def test_the_cli_socket_may_call_a_cli_only_syscall(tmp_path: Path) -> None:
    server, _, path = await serve(tmp_path, binding="cli")
    client = await AsyncClient.connect(path)
    assert await client.call("test.user") == "ok"
    await client.close()
    await server.close()


def test_a_name_declared_twice_is_an_error_at_start_up() -> None:
    again = Syscall("session.create", NoParams, optional, str, since=1)
    with pytest.raises(DuplicateSyscall, match=r"'session\.create' is declared twice") as caught:
        SyscallTable(workflow_methods(SimpleNamespace()), [again])  # type: ignore[arg-type]
    # the kernel refuses to start, and says so as the tree's error (code, why, fix)
    assert isinstance(caught.value, KernelStartFailed)
    assert caught.value.to_dict()["code"] == "kernel.duplicate_syscall"
    assert "shadow" in caught.value.why and "one declaration" in caught.value.fix
    with pytest.raises(DuplicateSyscall, match=r"'test\.none' is declared twice"):
        SyscallTable(TABLE, [Syscall("test.none", NoParams, optional, str, since=1)])


@pytest.mark.parametrize(
    ("method", "params", "named"),
    [
        ("session.create", {"mode": "yolo"}, "params.mode: invalid enum value"),
        ("session.set_mode", {"session_id": "s", "mode": "STRICT"}, "params.mode"),
        ("session.message", {"session_id": "s", "text": "   "}, "params.text"),
        ("session.message", {"session_id": "s", "text": ""}, "params.text"),
        ("session.message", {"session_id": "s", "text": "x" * 100_001}, "params.text"),
        ("session.message", {"session_id": "s", "text": "t", "max_rounds": 0}, ">= 1"),
        ("session.message", {"session_id": "s", "text": "t", "max_rounds": 1001}, "<= 1000"),
        ("session.list", {"limit": 501}, "params.limit"),
        ("session.pin", {"session_id": "s", "text": "\n\t"}, "params.text"),
        ("tool.decide", {"session_id": "s", "review_id": "r", "decision": "maybe"},
         "params.decision"),
        ("tool.decide", {"session_id": "s", "review_id": "r" * 101, "decision": "deny"},
         "params.review_id"),
        ("workflow.decide_exemption", {"session_id": "s", "grant": True, "request_id": ""},
         "params.request_id"),
    ],
)  # fmt: skip
def test_bounds_are_declared_on_the_params_and_refused_before_any_handler(
    method: str, params: dict[str, Any], named: str
) -> None:
    syscall = served_table().syscall(method)
    assert syscall is not None, method
    with pytest.raises(InvalidPayload, match=re.escape(named)) as refused:
        syscall.decode(params)
    assert refused.value.code == "ipc.invalid_payload" and refused.value.fix


def test_every_served_declaration_is_typed_closed_and_versioned() -> None:
    table = served_table()
    assert table.syscall("session.message") is not None  # the AI layer's, not the tools'
    for syscall in table.syscalls():
        assert syscall.params is not None, syscall.name
        assert issubclass(syscall.params, msgspec.Struct), syscall.name
        assert syscall.params.__struct_config__.forbid_unknown_fields, syscall.name
        assert 0 <= syscall.since <= CURRENT_API_VERSION, syscall.name
        assert syscall.callers in (CLI, ANY), syscall.name
        assert syscall.result is not None, syscall.name


def test_every_cli_only_served_syscall_refuses_a_plugin_socket() -> None:
    table = served_table()
    plugin: Any = SimpleNamespace(binding="tool:demo:c1", plugin_name="demo")
    cli_only = [s for s in table.syscalls() if s.callers == CLI]
    assert {s.name for s in cli_only} >= {"session.message", "review.approve", "tool.decide"}
    for syscall in cli_only:
        with pytest.raises(PeerRejected, match=r"^only the user may "):
            syscall.admit(plugin)
        assert syscall.refusal, f"{syscall.name} says what only the user may do"


def _doc_table(heading: str = "## Method table (closed)") -> dict[str, tuple[int, str]]:
    """docs/ipc.md's method table under ``heading``: name -> (since, who)."""
    text = (ROOT / "docs" / "ipc.md").read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    table = section.split("| method | since | who | params | result |", 1)[1]
    table = table.split("\n\n", 1)[0]
    rows: dict[str, tuple[int, str]] = {}
    for line in table.splitlines():
        found = re.match(r"\| `([a-z_.]+)` \| (\d+) \| ([^|]+) \|", line)
        if found:
            assert found[1] not in rows, f"docs/ipc.md lists {found[1]} twice"
            rows[found[1]] = (int(found[2]), found[3].strip())
    return rows


def _changelog_list(sandboxes: bool = False) -> dict[str, tuple[int, str]]:
    """CHANGELOG.md's list of the syscalls served (the main socket's, or the sandboxes'
    own sockets'): name -> (since, who)."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    section = text.split("## The syscalls served", 1)[1].split("\n## ", 1)[0]
    main, _, own = section.partition("\n### The sandboxes' own sockets")
    section = own if sandboxes else main
    rows: dict[str, tuple[int, str]] = {}
    for found in re.finditer(
        r"^- `([a-z_.]+)` \(API (\d+)(?:; ([^)]+))?\)(?: → .+)?$", section, re.M
    ):
        assert found[1] not in rows, f"CHANGELOG.md lists {found[1]} twice"
        rows[found[1]] = (int(found[2]), found[3] or "any")
    return rows


def test_the_served_table_docs_and_changelog_are_the_same_set() -> None:
    served = {s.name: s for s in served_table().syscalls()}
    docs, changelog = _doc_table(), _changelog_list()
    assert len(served) > 30
    assert set(docs) == set(served), "docs/ipc.md's method table vs the served table"
    assert set(changelog) == set(served), "CHANGELOG.md's list vs the served table"
    for name, syscall in served.items():
        who = "CLI only" if syscall.callers == CLI else "any"
        assert docs[name][0] == syscall.since, f"docs/ipc.md: since of {name}"
        assert docs[name][1].startswith(who), f"docs/ipc.md: who of {name}"
        assert changelog[name] == (syscall.since, who), f"CHANGELOG.md: {name}"


def test_every_sandbox_declaration_is_typed_closed_and_for_its_own_socket() -> None:
    served = {s.name for s in served_table().syscalls()}
    for kind, table in sandbox_tables().items():
        (own,) = {s.callers for s in table.syscalls()}  # one kind of sandbox per table
        assert isinstance(own, OwnSocket), kind
        for syscall in table.syscalls():
            assert syscall.name not in served, syscall.name
            assert issubclass(syscall.params, msgspec.Struct), syscall.name
            assert syscall.params.__struct_config__.forbid_unknown_fields, syscall.name
            assert 0 <= syscall.since <= CURRENT_API_VERSION, syscall.name
    plugin: Any = SimpleNamespace(binding="tool:demo:c1", plugin_name="demo")
    cli: Any = SimpleNamespace(binding="cli", plugin_name="")
    for syscall in sandbox_tables()["plugin"].syscalls():
        syscall.admit(plugin)
        with pytest.raises(PeerRejected, match=r"on its own socket only$"):
            syscall.admit(cli)


def test_the_sandbox_tables_docs_and_changelog_are_the_same_set() -> None:
    declared = {s.name: s for t in sandbox_tables().values() for s in t.syscalls()}
    docs = _doc_table("## Sandbox sockets (closed)")
    changelog = _changelog_list(sandboxes=True)
    assert len(declared) == 8
    assert set(docs) == set(declared), "docs/ipc.md's sandbox sockets vs the declarations"
    assert set(changelog) == set(declared), "CHANGELOG.md's sandbox list vs the declarations"
    for name, syscall in declared.items():
        assert isinstance(syscall.callers, OwnSocket)
        who = syscall.callers.who
        assert docs[name][0] == syscall.since, f"docs/ipc.md: since of {name}"
        assert docs[name][1].startswith(who), f"docs/ipc.md: who of {name}"
        assert changelog[name] == (syscall.since, who), f"CHANGELOG.md: {name}"
