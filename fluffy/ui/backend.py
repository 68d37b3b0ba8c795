"""What the web view shows and does, through the kernel's CLI socket and the audit log.

Each call opens its own connection to the project's kernel (the server answers requests
on several threads; a connection serves one request at a time).  Decisions go through
the same syscalls as the terminal's (``review.approve``, ``review.reject``,
``tool.decide``), on the CLI's binding: the kernel audits them as the person's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fluffy.errors import AuditQueryError, FluffyError

#: The audit entries a session's timeline shows, newest last (at most this many).
TIMELINE_LIMIT = 500
AUDIT_LIMIT = 200


class Backend(Protocol):
    """What the pages need (the kernel's, or a stand-in in tests)."""

    project: Path

    def sessions(self) -> list[dict[str, Any]]: ...
    def session(self, session_id: str) -> dict[str, Any] | None: ...
    def review(self, session_id: str) -> dict[str, Any] | None: ...
    def held_call(self, session_id: str) -> dict[str, Any] | None: ...
    def decide_review(self, session_id: str, plan_id: str, approve: bool) -> dict[str, Any]: ...
    def decide_call(self, session_id: str, review_id: str, decision: str) -> dict[str, Any]: ...
    def entries(self, filters: dict[str, str]) -> list[dict[str, Any]]: ...
    def entry(self, seq: int) -> dict[str, Any] | None: ...
    def test_runs(self, session_id: str) -> list[dict[str, Any]]: ...
    #: read after ``entries`` of the same page, which flushed the log for both
    def reviews(self, session_id: str) -> list[dict[str, Any]]: ...
    def verification(self) -> dict[str, Any]: ...
    def policy(self) -> dict[str, Any]: ...
    def environment(self) -> dict[str, Any]: ...
    def head(self) -> str: ...


@dataclass
class KernelBackend:
    """The project's kernel (running while the view serves) and its audit log."""

    project: Path
    socket: Path
    state: Path
    witness: Path | None = None
    _shown: dict[str, str] = field(default_factory=dict)  # session -> plan_id shown

    def _call(self, method: str, params: Any = None) -> Any:
        from fluffy.ipc.client import SyncClient

        with SyncClient(str(self.socket), timeout=60, plugin_name="fluffy-ui") as client:
            return client.call(method, params)

    def sessions(self) -> list[dict[str, Any]]:
        answer = self._call("session.list", {"limit": 100}) or {}
        return list(answer.get("sessions") or [])

    def session(self, session_id: str) -> dict[str, Any] | None:
        try:
            found = self._call("session.get", {"session_id": session_id})
        except FluffyError:
            return None
        return dict(found) if found else None

    def review(self, session_id: str) -> dict[str, Any] | None:
        session = self.session(session_id)
        if session is None or session.get("state") != "reviewing":
            return None
        return dict(self._call("review.show", {"session_id": session_id}))

    def held_call(self, session_id: str) -> dict[str, Any] | None:
        answer = self._call("tool.pending", {"session_id": session_id}) or {}
        held = answer.get("pending")
        return dict(held) if held else None

    def decide_review(self, session_id: str, plan_id: str, approve: bool) -> dict[str, Any]:
        method = "review.approve" if approve else "review.reject"
        return dict(self._call(method, {"session_id": session_id, "plan_id": plan_id}) or {})

    def decide_call(self, session_id: str, review_id: str, decision: str) -> dict[str, Any]:
        params = {"session_id": session_id, "review_id": review_id, "decision": decision}
        return dict(self._call("tool.decide", params) or {})

    def entries(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        from fluffy.host.audit import Filters, entries, parse_since

        before = filters.get("before") or ""
        if before and not before.isdigit():
            raise AuditQueryError(f"not an entry number: {before!r}", fix="Use the page's links.")
        self._flush()
        chosen = Filters(
            before=int(before) if before else None,
            since_ms=parse_since(filters["since"]) if filters.get("since") else None,
            event_type=filters.get("type") or None,
            session=filters.get("session") or None,
            decision=filters.get("decision") or None,
            limit=TIMELINE_LIMIT if filters.get("session") else AUDIT_LIMIT,
        )
        return list(entries(self.state, chosen))

    def entry(self, seq: int) -> dict[str, Any] | None:
        from fluffy.host.audit import Filters, entries

        return next(entries(self.state, Filters(seq=seq)), None)

    def test_runs(self, session_id: str) -> list[dict[str, Any]]:
        from fluffy.ui.records import test_runs

        return test_runs(self.state, session_id)

    def reviews(self, session_id: str) -> list[dict[str, Any]]:
        from fluffy.ui.records import reviews

        return reviews(self.state, session_id)  # entries() just flushed the log

    def verification(self) -> dict[str, Any]:
        from fluffy.host.audit import read_head, verify

        self._flush()
        witness = read_head(self.witness) if self.witness and self.witness.exists() else None
        report = verify(self.state, witness=witness)
        return dict(report.to_dict())

    def policy(self) -> dict[str, Any]:
        return dict(self._call("policy.get") or {})

    def environment(self) -> dict[str, Any]:
        return dict(self._call("project.info") or {})

    def head(self) -> str:
        """What changes when something is recorded that a page shows: the newest entry
        other than the IPC layer's own (``syscall``), read from the log without a call
        to the kernel -- the view's own reads are audited, and must not wake it again."""
        from fluffy.host.audit import connect_ro, db_path

        conn = connect_ro(db_path(self.state))
        try:
            row = conn.execute(
                "SELECT max(seq) FROM audit_log WHERE event_type != 'syscall'"
            ).fetchone()
        finally:
            conn.close()
        return str(row[0] if row else 0)

    def _flush(self) -> None:
        with contextlib.suppress(FluffyError, OSError):  # else the log as it is on disk
            self._call("audit.flush")
