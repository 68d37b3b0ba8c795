"""A kernel stand-in for the CLI's session tests: the session API contract, in memory.

``FakeKernel.call(method, params)`` answers like the kernel's CLI socket: sessions,
modes (debug needs ``approved``), and a turn whose events are scripted as pages.  A
page holding a review that needs a person holds back the later pages until
``review.approve`` / ``review.reject`` arrives, as the kernel's waiting turn does.
What the CLI sends is decoded against the kernel's own declarations first (the served
syscall table), so a CLI test fails on params the real kernel would refuse; and every
event it pages out is one the kernel could send (:func:`complete`: a test names the
fields it cares about, the rest get neutral values, and a wrong type or a field the
kernel never sends fails), except a kind the kernel does not have (a newer kernel's).
"""

from __future__ import annotations

import copy
import typing
from typing import Any

import msgspec
import msgspec.inspect as mi

from fluffy.cli.events import Shown, Unknown, plain, read
from fluffy.errors import (
    ExemptionMismatch,
    ModeDenied,
    PolicyError,
    SessionNotFound,
    UnknownMethod,
)
from fluffy.ipc.results.events import SessionEvent
from unit.kernel_table import served_table

KINDS = {cls.__struct_config__.tag: cls for cls in typing.get_args(SessionEvent)}


def _neutral(info: mi.Type) -> Any:
    """A value of the type ``info`` that says nothing: "", 0, false, [], null."""
    if isinstance(info, mi.UnionType):
        nullable = any(isinstance(t, mi.NoneType) for t in info.types)
        return None if nullable else _neutral(info.types[0])
    if isinstance(info, mi.LiteralType):
        return info.values[0]
    if isinstance(info, mi.StructType):
        return {f.encode_name: _neutral(f.type) for f in info.fields if f.required}
    if isinstance(info, mi.ListType | mi.DictType):
        return [] if isinstance(info, mi.ListType) else {}
    return {mi.StrType: "", mi.IntType: 0, mi.FloatType: 0.0, mi.BoolType: False}[type(info)]


def _filled(value: Any, info: mi.Type) -> Any:
    """``value`` with the required fields its objects leave out given neutral values."""
    if isinstance(info, mi.UnionType):
        for member in info.types:
            if isinstance(member, mi.StructType) and isinstance(value, dict):
                return _filled(value, member)
        return value
    if isinstance(info, mi.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f for f in info.fields}
        given = {k: _filled(v, fields[k].type) if k in fields else v for k, v in value.items()}
        missing = [f for f in info.fields if f.required and f.encode_name not in value]
        return {**{f.encode_name: _neutral(f.type) for f in missing}, **given}
    if isinstance(info, mi.ListType) and isinstance(value, list):
        return [_filled(item, info.item_type) for item in value]
    return value


def complete(event: dict[str, Any]) -> dict[str, Any]:
    """A kernel event with the fields ``event`` leaves out given neutral values, checked
    to decode as its kind exactly (an unknown kind is left as it is)."""
    kind = KINDS.get(event.get("type"))
    if kind is None:
        return event
    whole: dict[str, Any] = _filled(event, mi.type_info(kind))
    msgspec.convert(whole, kind)  # a wrong type, or a field the kernel never sends, fails
    return whole


def shown(event: dict[str, Any]) -> Shown:
    """``event`` as the CLI reads it off the wire (:func:`complete` first)."""
    return read(complete(event))


class AsSent(dict[str, Any]):
    """An event the fake kernel pages out as it is, unchecked: what a newer kernel sends."""


class Seen:
    """A renderer that keeps what it is given, as ``--json`` would print it (an event
    the CLI could not read, as ``{"type": "(unknown)", "raw": ...}``)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def render(self, event: Shown) -> None:
        unread = isinstance(event, Unknown)
        self.events.append({"type": "(unknown)", "raw": event.raw} if unread else plain(event))

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


def turn(text: str, *events: dict[str, Any], status: str = "done") -> list[dict[str, Any]]:
    """A whole turn as one page: turn_start, ``events``, turn_end."""
    return [
        {"type": "turn_start", "turn_id": "t1", "text": text},
        *events,
        {"type": "turn_end", "turn_id": "t1", "status": status, "text": "", "error": None},
    ]


EXEMPTION = {
    "type": "exemption",
    "request_id": "ex-0123456789abcdef",
    "category": "documentation",
    "paths": ["README.md"],
    "reason": "a typo",
    "kernel_decides": False,
}
REVIEW = {
    "type": "review",
    "plan_id": "plan-1",
    "files": ["src/app.py"],
    "diff": "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1,2 @@\n-a\n+b\n+c",
    "lines": 3,
    "reasons": ["src/app.py is a sensitive path"],
    "auto": False,
    "kernel_decides": False,
}


class FakeKernel:
    def __init__(self, pages: list[list[dict[str, Any]]] | None = None) -> None:
        self.pages = [list(page) for page in pages or []]
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.sessions: dict[str, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []  # every event delivered, with its seq
        self.seq = 0
        self.blocked = False  # a review waits for a decision
        self.interrupt_on_poll: int | None = None  # raise KeyboardInterrupt on that poll
        self.polls = 0
        self.pins: list[str] = []
        self.instructions: dict[str, Any] = {"files": [], "limit": 32768, "truncated": False}
        self.approve_error: Exception | None = None
        self.exemption: dict[str, Any] | None = None  # the AI's request that waits
        self.tool_held: dict[str, Any] | None = None  # a tool call that waits (ADR-046)
        #: session.usage / session.list's usage: per session, the turn, the calibration
        self.usage: dict[str, dict[str, Any]] = {}
        self.turn_usage: dict[str, Any] | None = None
        self.calibration: dict[str, Any] = {"calibration": None, "scale": 1.0}

    # -- the socket ---------------------------------------------------------------------
    def call(self, method: str, params: Any = None) -> Any:
        declared = served_table().syscall(method)
        if declared is not None:
            declared.decode(params)  # ipc.invalid_payload, as the kernel answers
        params = dict(params or {})
        self.calls.append((method, params))
        handler = getattr(self, "m_" + method.replace(".", "_"), None)
        if handler is None:
            raise UnknownMethod(f"unknown method {method}")
        return handler(params)

    def methods(self, name: str) -> list[dict[str, Any]]:
        return [params for method, params in self.calls if method == name]

    # -- sessions -----------------------------------------------------------------------
    def _session(self, sid: str) -> dict[str, Any]:
        if sid not in self.sessions:
            raise SessionNotFound(f"no session {sid}")
        return self.sessions[sid]

    def m_session_create(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = f"s{len(self.sessions) + 1}"
        self.sessions[sid] = {"session_id": sid, "mode": "strict", "state": "idle"}
        return dict(self.sessions[sid])

    def m_project_info(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"policy": {"default": False}, "layout": None, "environment": None}

    def m_session_instructions(self, params: dict[str, Any]) -> dict[str, Any]:
        self._session(str(params.get("session_id")))
        return copy.deepcopy(self.instructions)

    def m_session_pins(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"pins": list(self.pins)}

    def m_session_get(self, params: dict[str, Any]) -> dict[str, Any] | None:
        sid = params.get("session_id") or next(reversed(self.sessions), None)
        if sid is None or sid not in self.sessions:
            return None
        pending = None
        if self.exemption is not None:
            keys = ("request_id", "category", "paths", "reason")
            pending = {k: self.exemption[k] for k in keys}
        return {**self.sessions[sid], "pins": list(self.pins), "exemption_pending": pending}

    def m_session_set_mode(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params["session_id"])
        if params["mode"] == "debug" and not params.get("approved"):
            raise ModeDenied("debug mode needs approval")
        session["mode"] = params["mode"]
        return dict(session)

    def m_session_list(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "sessions": [
                {
                    **s,
                    "updated_at": 1_700_000_000_000,
                    "title": f"task of {sid}",
                    "turns": 1,
                    "usage": self.usage.get(sid, {"requests": 0, "reported": 0}),
                }
                for sid, s in reversed(self.sessions.items())
            ][: params.get("limit", 20)]
        }

    def m_session_usage(self, params: dict[str, Any]) -> dict[str, Any]:
        self._session(params["session_id"])
        whole = self.usage.get(params["session_id"], {"requests": 0, "reported": 0})
        return {"turn": self.turn_usage or whole, "session": whole, **self.calibration}

    def m_session_message(self, params: dict[str, Any]) -> dict[str, Any]:
        self._session(params["session_id"])
        return {"turn_id": "t1", "session_id": params["session_id"]}

    def m_session_events(self, params: dict[str, Any]) -> dict[str, Any]:
        self.polls += 1
        if self.interrupt_on_poll == self.polls:
            raise KeyboardInterrupt
        after = int(params.get("after", 0))
        if after < 0:  # the kernel's "where does the stream stand"
            return {"events": [], "next": self.seq, "running": bool(self.pages)}
        if params.get("wait_ms") and self.pages and not self.blocked:
            for page_event in self.pages.pop(0):
                self.seq += 1
                sent = copy.deepcopy(page_event)
                event = {"seq": self.seq, **(sent if isinstance(sent, AsSent) else complete(sent))}
                self.log.append(event)
                asks = not event.get("auto") and not event.get("kernel_decides")
                if event["type"] in ("review", "exemption") and asks:
                    self.blocked = True
                    self.exemption = event if event["type"] == "exemption" else None
                if event["type"] == "tool_review":
                    self.blocked, self.tool_held = True, event
        found = [e for e in self.log if e["seq"] > after]
        running = bool(self.pages) or self.blocked
        return {
            "events": found,
            "next": found[-1]["seq"] if found else after,
            "running": running,
            "mode": "strict",
            "state": "idle",
            "quarantined": False,
        }

    def m_session_cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        self.pages.clear()
        return dict(self._session(params["session_id"]))

    def m_session_pin(self, params: dict[str, Any]) -> dict[str, Any]:
        self.pins.append(params["text"])
        return {"pins": list(self.pins)}

    def m_session_unpin(self, params: dict[str, Any]) -> dict[str, Any]:
        del self.pins[params["index"]]
        return {"pins": list(self.pins)}

    def m_session_budget(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "mode": "explore",
            "baseline": 80.0,
            "current": 77.5,
            "delta": -2.5,
            "locked": False,
            "warn_at": -2.0,
            "lock_at": -5.0,
        }

    def m_session_lift_quarantine(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(self._session(params["session_id"]))

    def m_session_history(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"seq": 1, "timestamp": 1_700_000_000_000, "event": "user_message",
             "from": "idle", "to": "planning", "mode": "strict"},
        ]  # fmt: skip

    # -- reviews ------------------------------------------------------------------------
    def m_review_show(self, params: dict[str, Any]) -> dict[str, Any] | None:
        return {"plan_id": "plan-1", "files": [], "lines": 3} if self.blocked else None

    def m_review_approve(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.approve_error is not None:
            raise self.approve_error
        self.blocked = False
        return {"merged": ["src/app.py"]}

    def m_review_reject(self, params: dict[str, Any]) -> dict[str, Any]:
        self.blocked = False
        return {"rejected": True}

    def m_workflow_request_exemption(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params["session_id"])
        exemption = {k: params[k] for k in ("category", "paths", "reason")}
        session.update(state="exploring", exemption=exemption)
        return dict(session)

    def m_workflow_decide_exemption(self, params: dict[str, Any]) -> dict[str, Any]:
        held = self.exemption["request_id"] if self.exemption else None
        if params["request_id"] != held:  # the kernel decides only on the request named
            raise ExemptionMismatch(f"the exemption request {params['request_id']} is not it")
        asked, self.exemption, self.blocked = self.exemption, None, False
        session = self._session(params["session_id"])
        if params["grant"] and asked is not None:
            exemption = {k: asked[k] for k in ("category", "paths", "reason")}
            session.update(state="exploring", exemption=exemption)
        return dict(session)

    def m_tool_pending(self, params: dict[str, Any]) -> dict[str, Any]:
        held = self.tool_held  # the call as the person is shown it (not the event)
        shown = {
            k: v for k, v in (held or {}).items() if k not in ("type", "seq", "kernel_decides")
        }
        return {"session_id": params["session_id"], "pending": shown if held else None}

    def m_tool_decide(self, params: dict[str, Any]) -> dict[str, Any]:
        held = self.tool_held["review_id"] if self.tool_held else None
        if params["review_id"] != held:
            raise PolicyError(f"no tool call {params['review_id']} waits for a decision")
        self.tool_held, self.blocked = None, False
        return dict(params)

    def m_review_add_tests(self, params: dict[str, Any]) -> dict[str, Any]:
        self.blocked = False
        return {"state": "retroactive_testing", "kept": True}
