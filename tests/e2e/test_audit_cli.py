"""`fluffy kernel serve` audits its calls; `fluffy audit verify|log|export` read them back.

One kernel run per module: the state folder is seeded first with older entries (three
hours ago, two sessions) through :class:`AuditLog`, then the kernel serves a ping (not
audited), unknown methods (audited as denied by ``kernel.method_table``, one carrying a
secret-looking parameter) and a malformed frame after the handshake, and stops on
SIGTERM.  Tests that change the state work on a copy.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.errors import UnknownMethod
from fluffy.ipc.client import SyncClient
from fluffy.ipc.protocol import HEADER
from fluffy.kernel.audit.entry import COLUMNS, Event, entry_hash, now_ms
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.store import db_path
from tests.audit_support import change_entry

FLUFFY = str(Path(sys.executable).parent / "fluffy")
SECRET = "sk-" + "abcdefghijklmnopqrstuvwxyzabcd"
HOURS_AGO = 3
FIELDS = (
    "id",
    "timestamp",
    "prev_hash",
    "hash",
    "event_type",
    "syscall_type",
    "tool_name",
    "caller",
    "session_mode",
    "state_machine_state",
    "policy_decision",
    "policy_rule_name",
    "capability_id",
    "deny_reason",
    "input_summary",
    "output_summary",
    "duration_ms",
    "sandbox_id",
    "metadata",
)


@dataclass(frozen=True)
class Served:
    state: Path
    seeded: int  # entries recorded before the kernel ran


def fluffy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def audit(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    return fluffy("audit", command, "--state-dir", str(state), *rest)


def log_json(state: Path, *filters: str) -> list[dict[str, Any]]:
    proc = audit("log", "--json", *filters, state=state)
    assert proc.returncode == 0, proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)["entries"]
    return found


async def _seed(state: Path) -> int:
    """Older entries in two sessions: three hours ago, one every second."""
    moment = [now_ms() - HOURS_AGO * 3_600_000]

    def clock() -> int:
        moment[0] += 1000
        return moment[0]

    log = await AuditLog.open(state, clock=clock)
    await log.record(Event("kernel_start", input_summary="an earlier kernel"))
    for session in ("sess-a", "sess-b"):
        await log.record(Event("session_mode_change", session_id=session, session_mode="strict"))
        for i in range(3):
            log.record_nowait(
                Event(
                    "syscall",
                    session_id=session,
                    syscall_type="fs.read",
                    policy_decision="allowed",
                    policy_rule_name="fs.read.workspace",
                    input_summary=f"{session} read {i}",
                )
            )
    log.record_nowait(Event("tool_execute", session_id="sess-a", tool_name="code_executor"))
    await log.record(Event("kernel_shutdown"))
    seeded = log.head.seq
    await log.close()
    return seeded


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the kernel did not create its socket"
        time.sleep(0.05)


def _read_frame(sock: socket.socket) -> bytes:
    def exact(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            assert chunk, "the kernel closed the connection"
            data += chunk
        return data

    (length,) = HEADER.unpack(exact(HEADER.size))
    return exact(length)


def _calls(socket_path: Path) -> None:
    with SyncClient(str(socket_path), timeout=5) as client:
        assert client.call("kernel.ping")["pong"] is True
        with pytest.raises(UnknownMethod):
            client.call("shell.run", {"cmd": "cat ~/.env", "api_key": SECRET})
        with pytest.raises(UnknownMethod):
            client.call("fs.delete", {"path": "/"})
        # a frame that is not a message, after the handshake: answered and audited
        payload = b'{"id": "bad-1", "type": "request", "method": 42'
        client.sock.sendall(HEADER.pack(len(payload)) + payload)
        reply = msgspec.json.decode(_read_frame(client.sock))
        assert reply["error"]["code"] == "ipc.invalid_payload"
        assert client.call("kernel.ping")["pong"] is True  # the connection still serves


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("audit-cli")
    state = root / "state"
    seeded = asyncio.run(_seed(state))
    socket_path = root / "run" / "kernel.sock"
    # The seeded entries are hours old: between 00:00 and 03:00 UTC they would be
    # yesterday's, and daily rotation would archive them. This kernel's policy keeps one
    # file (and shows that policy.yaml's `audit:` section reaches the kernel).
    project = root / "project"
    (project / ".fluffy").mkdir(parents=True)
    (project / ".fluffy" / "policy.yaml").write_text("audit: {rotation: none}\n")
    proc = subprocess.Popen(
        [
            FLUFFY,
            "kernel",
            "serve",
            "--socket",
            str(socket_path),
            "--state-dir",
            str(state),
            "--project",
            str(project),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(socket_path, proc)
        _calls(socket_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    yield Served(state, seeded)


@pytest.fixture()
def copy(served: Served, tmp_path: Path) -> Path:
    target = tmp_path / "state"
    shutil.copytree(served.state, target)
    return target


def kernel_entries(served: Served) -> list[dict[str, Any]]:
    return [e for e in log_json(served.state) if e["id"] > served.seeded]


# -- verify -----------------------------------------------------------------------------


def test_verify_passes_after_a_clean_kernel_run(served: Served) -> None:
    proc = audit("verify", state=served.state)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the audit chain is intact" in proc.stdout

    proc = audit("verify", "--json", state=served.state)
    assert proc.returncode == 0
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["problem"] is None
    everything = log_json(served.state)
    assert report["entries"] == len(everything)
    assert report["head"]["seq"] == everything[-1]["id"] == report["checkpoint"]["seq"]


def test_verify_names_a_tampered_entry_and_its_kind(served: Served, copy: Path) -> None:
    target = next(e for e in kernel_entries(served) if e["syscall_type"] == "fs.delete")
    with closing(sqlite3.connect(db_path(copy))) as conn:
        change_entry(conn, target["id"], policy_decision="allowed")
        conn.commit()

    proc = audit("verify", state=copy)
    assert proc.returncode == 1, proc.stdout
    assert "modified" in proc.stdout
    assert f"entry {target['id']} " in proc.stdout

    proc = audit("verify", "--json", state=copy)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert (report["problem"]["kind"], report["problem"]["id"]) == ("modified", target["id"])


def test_verify_checks_a_witness_held_outside(served: Served, copy: Path) -> None:
    report = json.loads(audit("verify", "--json", state=copy).stdout)
    witness = copy.parent / "witness.json"
    witness.write_text(json.dumps({**report["head"], "seq": report["head"]["seq"] + 3}))
    proc = audit("verify", "--witness", str(witness), state=copy)
    assert proc.returncode == 1
    assert "rolled_back" in proc.stdout


def test_verify_names_a_replaced_database_without_an_entry(
    served: Served, copy: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    asyncio.run(_seed(other))
    shutil.copyfile(db_path(other), db_path(copy))
    proc = audit("verify", state=copy)
    assert proc.returncode == 1
    assert "replaced: fluffy.db:" in proc.stdout
    assert "None" not in proc.stdout


def test_a_missing_witness_file_is_an_error_not_a_pass(served: Served) -> None:
    proc = audit("verify", "--witness", str(served.state / "no-such-witness"), state=served.state)
    assert proc.returncode == 3
    assert "missing or empty" in proc.stderr and "Fix:" in proc.stderr


def test_a_corrupt_database_is_a_clear_error(served: Served, copy: Path) -> None:
    path = db_path(copy)
    with closing(sqlite3.connect(path)) as conn:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
    data = bytearray(path.read_bytes())
    data[4096 : pages * 4096] = b"\xa5" * (pages * 4096 - 4096)  # all but the header page
    path.write_bytes(bytes(data))
    for command in ("verify", "log", "export"):
        proc = audit(command, state=copy)
        assert proc.returncode == 3, (command, proc.stdout, proc.stderr)
        assert "cannot be read" in proc.stderr and "Fix:" in proc.stderr
        assert "Traceback" not in proc.stderr


# -- what the kernel recorded -----------------------------------------------------------


def test_the_kernel_audits_every_call_but_ping(served: Served) -> None:
    recorded = kernel_entries(served)
    types = [e["event_type"] for e in recorded]
    assert types[0] == "kernel_start" and types[-1] == "kernel_shutdown"
    calls = [e for e in recorded if e["event_type"] == "syscall"]
    assert [e["syscall_type"] for e in calls] == ["shell.run", "fs.delete", "(invalid frame)"]
    assert all(e["syscall_type"] != "kernel.ping" for e in log_json(served.state))

    for call in calls:
        assert call["policy_decision"] == "denied"
        assert call["policy_rule_name"] == "kernel.method_table"
        assert call["caller"] == "user"
        assert call["metadata"]["binding"] == "cli"
        assert call["duration_ms"] is not None and call["duration_ms"] >= 0
    unknown, _, malformed = calls
    assert "unknown method 'shell.run'" in unknown["deny_reason"]
    assert unknown["output_summary"].startswith("error ipc.unknown_method:")
    assert unknown["metadata"]["error_code"] == "ipc.unknown_method"
    assert malformed["metadata"]["error_code"] == "ipc.invalid_payload"
    assert malformed["deny_reason"]


def test_a_secret_in_the_parameters_is_redacted_everywhere(served: Served) -> None:
    (call,) = [e for e in log_json(served.state) if e["syscall_type"] == "shell.run"]
    # a secret-named field is masked whatever its value looks like
    assert '"api_key":"[REDACTED:field]"' in call["input_summary"]
    assert SECRET not in call["input_summary"]
    assert "cat ~/.env" in call["input_summary"]  # the rest of the parameters is kept
    exported = audit("export", "--format", "jsonl", state=served.state)
    assert SECRET not in exported.stdout
    for path in served.state.rglob("*"):  # database, WAL, archives, backups, checkpoint
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


# -- log filters ------------------------------------------------------------------------


def test_log_filters_by_type(served: Served) -> None:
    everything = log_json(served.state)
    syscalls = log_json(served.state, "--type", "syscall")
    assert syscalls == [e for e in everything if e["event_type"] == "syscall"]
    assert len(syscalls) == 6 + 3  # seeded, and the kernel's three
    assert [e["id"] for e in log_json(served.state, "--type", "kernel_start")] == [
        e["id"] for e in everything if e["event_type"] == "kernel_start"
    ]


def test_log_filters_by_decision(served: Served) -> None:
    denied = log_json(served.state, "--decision", "denied")
    assert [e["syscall_type"] for e in denied] == ["shell.run", "fs.delete", "(invalid frame)"]
    allowed = log_json(served.state, "--decision", "allowed")
    assert len(allowed) == 6 and all(e["policy_decision"] == "allowed" for e in allowed)
    assert log_json(served.state, "--decision", "review_required") == []


def test_log_filters_by_time(served: Served) -> None:
    recent = log_json(served.state, "--since", "1h")
    assert [e["id"] for e in recent] == [e["id"] for e in kernel_entries(served)]
    everything = log_json(served.state, "--since", f"{HOURS_AGO + 1}h")
    assert len(everything) == len(log_json(served.state))
    assert log_json(served.state, "--since", "2999-01-01") == []


def test_log_filters_by_session_and_limit(served: Served) -> None:
    session_a = log_json(served.state, "--session", "sess-a")
    assert len(session_a) == 1 + 3 + 1
    assert {e["session_id"] for e in session_a} == {"sess-a"}
    assert log_json(served.state, "--session", "x") == []
    both = log_json(served.state, "--session", "sess-b", "--type", "syscall")
    assert [e["input_summary"] for e in both] == [f"sess-b read {i}" for i in range(3)]
    newest = log_json(served.state, "--limit", "2")
    assert [e["id"] for e in newest] == [e["id"] for e in log_json(served.state)[-2:]]


def test_log_prints_one_line_per_entry(served: Served) -> None:
    proc = audit("log", "--type", "syscall", "--decision", "denied", state=served.state)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 + 1  # entries and the count
    assert "shell.run" in lines[0] and "rule=kernel.method_table" in lines[0]
    assert lines[-1] == "3 entries"


# -- export -----------------------------------------------------------------------------


def test_export_writes_every_field_of_every_entry_as_json_lines(
    served: Served, tmp_path: Path
) -> None:
    out = tmp_path / "audit.jsonl"
    proc = audit("export", "--format", "jsonl", "--output", str(out), state=served.state)
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert f"exported {len(lines)} entries" in proc.stderr
    objects = [json.loads(line) for line in lines]
    assert all(isinstance(o, dict) for o in objects)
    assert [o["id"] for o in objects] == list(range(1, len(objects) + 1))
    assert objects == log_json(served.state)
    for entry in objects:
        assert set(FIELDS) <= set(entry), set(FIELDS) - set(entry)
        # every field the hash covers is there: the export can be re-verified on its own
        metadata = entry["metadata"]
        row = tuple(
            entry["id"]
            if column == "seq"
            else (msgspec.json.encode(metadata).decode() if metadata else None)
            if column == "metadata"
            else entry[column]
            for column in COLUMNS
        )
        assert entry_hash(row) == entry["hash"], entry["id"]
    assert all(b["prev_hash"] == a["hash"] for a, b in pairwise(objects))

    to_stdout = audit("export", "--format", "jsonl", "--type", "syscall", state=served.state)
    assert to_stdout.returncode == 0
    assert [json.loads(line)["event_type"] for line in to_stdout.stdout.splitlines()] == [
        "syscall"
    ] * 9


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("log", "--since", "garbage"), "--since 'garbage' is neither a duration nor a date"),
        (("export", "--since", "yesterday-ish"), "is neither a duration nor a date"),
        (("log", "--type", "unknown"), "unknown event type 'unknown'"),
        (("export", "--type", "syscalls"), "unknown event type 'syscalls'"),
        (("log", "--decision", "maybe"), "unknown decision 'maybe'"),
        (("log", "--limit", "0"), "--limit must be 1 or more"),
    ],
)
def test_bad_filters_exit_3_with_a_clear_error(
    served: Served, args: tuple[str, ...], message: str
) -> None:
    proc = audit(*args, state=served.state)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Fix:" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["verify", "log", "export"])
def test_a_missing_state_folder_exits_3(tmp_path: Path, command: str) -> None:
    proc = audit(command, state=tmp_path / "nowhere")
    assert proc.returncode == 3
    assert "does not exist" in proc.stderr and "Fix:" in proc.stderr


def test_errors_are_json_with_json(served: Served) -> None:
    proc = audit("log", "--json", "--since", "garbage", state=served.state)
    assert proc.returncode == 3
    error = json.loads(proc.stdout)
    assert error["ok"] is False
    assert error["error"]["code"] == "audit.query_invalid"
