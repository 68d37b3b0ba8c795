"""Audit entries and their hash (the design's Record Format and Storage).

Every field of an entry is covered by its hash.  The canonical encoding is the JSON
array of the field values in a fixed order (msgspec: strings escaped one way, ints and
floats told apart, ``null`` for absent), prefixed by a domain-separation tag::

    hash = SHA-256(b"fluffy.audit.v1\\0" + json([seq, timestamp, prev_hash, event_type, ...]))

A JSON array of typed scalars is injective, so no two different entries encode alike.
The table stores exactly those bytes (``entry``) beside the hash, plus copies of
``seq``, ``timestamp`` and ``event_type`` for its indexes (:mod:`.store`): changing any
byte of any stored value changes the hash or breaks the match between a copy and the
entry.  Verification recomputes every hash from what is stored.

The genesis entry (the first ``kernel_start`` of a chain) has
``prev_hash = SHA-256("genesis:" + its timestamp)``.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

DOMAIN: Final = b"fluffy.audit.v1\x00"
SUMMARY_LIMIT: Final = 500

EVENT_TYPES: Final = frozenset(
    {
        "syscall",
        "tool_execute",
        "tool_result",
        "state_transition",
        "policy_update",
        "session_mode_change",
        "sandbox_created",
        "sandbox_destroyed",
        "sandbox_failed",
        "capability_issued",
        "capability_expired",
        "merge_approved",
        "merge_rejected",
        "merge_overlap",
        "kernel_start",
        "kernel_shutdown",
        "audit_storage_warning",
        "audit_storage_critical",
        "audit_archive_deleted",
        "audit_chain_break",
        "policy_rule_failed",
        "exemption_requested",
        "exemption_granted",
        "exemption_denied",
        "test_run_recorded",
        "network_request",
        "session_quarantined",
        "plugin_install_approved",
        "plugin_install_refused",
        "mcp_server_started",
        "mcp_server_stopped",
        "mcp_server_failed",
        "mcp_servers_loaded",
        "project_instructions_read",
    }
)

# Written synchronously: the caller waits for the durable commit (design's SYNC_EVENTS,
# plus the events fluffy adds that a reader of the log must never miss).
SYNC_EVENTS: Final = frozenset(
    {
        "policy_update",
        "merge_approved",
        "merge_rejected",
        "merge_overlap",
        "session_mode_change",
        "capability_issued",
        "kernel_start",
        "kernel_shutdown",
        "audit_archive_deleted",
        "audit_chain_break",
        "policy_rule_failed",
        "state_transition",
        "session_quarantined",
        "exemption_requested",
        "exemption_granted",
        "exemption_denied",
        "test_run_recorded",
        "plugin_install_approved",
        "plugin_install_refused",
    }
)

# Entries whose metadata the verifier reads (recorded deletions and chain breaks)
SPECIAL_EVENTS: Final = frozenset({"audit_archive_deleted", "audit_chain_break"})

Decision = Literal["allowed", "denied", "review_required", "allowed_by_token"]
DECISIONS: Final = ("allowed", "denied", "review_required", "allowed_by_token")

# Stored column order == encoding order.  ``hash`` is stored last and never encoded.
COLUMNS: Final = (
    "seq",
    "timestamp",
    "prev_hash",
    "event_type",
    "syscall_type",
    "tool_name",
    "caller",
    "session_id",
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

# the fields that are never null (the others may be; duration_ms is a number or null)
REQUIRED: Final = (
    "seq",
    "timestamp",
    "prev_hash",
    "event_type",
    "caller",
    "session_mode",
    "state_machine_state",
    "input_summary",
)

_encode = msgspec.json.Encoder().encode
_BASE = hashlib.sha256(DOMAIN)


def digest(entry: bytes) -> str:
    """Hash of an entry's canonical encoding."""
    hashed = _BASE.copy()
    hashed.update(entry)
    return hashed.hexdigest()


def entry_hash(row: tuple[Any, ...]) -> str:
    """Hash of one entry (the values of :data:`COLUMNS`, in order)."""
    return digest(_encode(row))


def stored(row: tuple[Any, ...]) -> tuple[int, int, str, bytes, str]:
    """The table row of an entry: seq, timestamp, event_type, the entry's bytes, hash."""
    entry = _encode(row)
    return (row[0], row[1], row[3], entry, digest(entry))


def genesis_hash(timestamp: int) -> str:
    return hashlib.sha256(f"genesis:{timestamp}".encode()).hexdigest()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def truncate(text: str, limit: int = SUMMARY_LIMIT) -> str:
    if len(text) <= limit:
        return text
    marker = f"...[{len(text) - limit + 20} chars cut]"
    return text[: max(0, limit - len(marker))] + marker


_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_isfinite = math.isfinite


def _metadata(metadata: Mapping[str, str]) -> str:
    """The metadata column: a JSON object, keys sorted, keys and values as strings."""
    for key, value in metadata.items():
        if type(key) is not str or type(value) is not str:  # the general (slow) path
            return _encode({str(k): str(v) for k, v in sorted(metadata.items())}).decode()
    # plain strings: msgspec sorts by code point, exactly like sorted() on the keys
    return _encode_sorted(metadata).decode()


class Event(msgspec.Struct, frozen=True):
    """What a caller asks to record; the log adds seq, timestamp and the hashes.

    Immutable; a Struct (its ``__init__`` in C: this is made for every audited call) whose
    ``__post_init__`` refuses an unknown event type or decision and a duration that is
    not finite.
    """

    event_type: str
    caller: str = "kernel"
    session_mode: str = "strict"
    state_machine_state: str = "idle"
    session_id: str | None = None
    syscall_type: str | None = None
    tool_name: str | None = None
    policy_decision: str | None = None
    policy_rule_name: str | None = None
    capability_id: str | None = None
    deny_reason: str | None = None
    input_summary: str = ""
    output_summary: str | None = None
    duration_ms: float | None = None
    sandbox_id: str | None = None
    metadata: Mapping[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.event_type not in EVENT_TYPES:
            raise ValueError(f"unknown audit event type {self.event_type!r}")
        decision = self.policy_decision
        if decision is not None and decision not in DECISIONS:
            raise ValueError(f"unknown policy decision {decision!r}")
        if self.duration_ms is not None and not _isfinite(self.duration_ms):
            raise ValueError("duration_ms must be finite")

    @property
    def sync(self) -> bool:
        return self.event_type in SYNC_EVENTS

    def row(self, seq: int, timestamp: int, prev_hash: str) -> tuple[Any, ...]:
        """The stored row (values exactly as SQLite will return them)."""
        input_summary = self.input_summary
        if len(input_summary) > SUMMARY_LIMIT:
            input_summary = truncate(input_summary)
        output_summary = self.output_summary
        if output_summary is not None and len(output_summary) > SUMMARY_LIMIT:
            output_summary = truncate(output_summary)
        duration_ms = self.duration_ms
        if duration_ms is not None:  # + 0.0: SQLite stores -0.0 as 0.0
            duration_ms = float(duration_ms) + 0.0
        return (
            seq,
            timestamp,
            prev_hash,
            self.event_type,
            self.syscall_type,
            self.tool_name,
            self.caller,
            self.session_id,
            self.session_mode,
            self.state_machine_state,
            self.policy_decision,
            self.policy_rule_name,
            self.capability_id,
            self.deny_reason,
            input_summary,
            output_summary,
            duration_ms,
            self.sandbox_id,
            _metadata(self.metadata) if self.metadata else None,
        )


def row_to_dict(row: tuple[Any, ...], hash_: str | None = None) -> dict[str, Any]:
    """A stored row as the design's AuditEntry (``id`` is the sequence number)."""
    data = dict(zip(COLUMNS, row, strict=True))
    data["id"] = data.pop("seq")
    raw = data.get("metadata")
    try:
        data["metadata"] = msgspec.json.decode(raw) if isinstance(raw, str) and raw else {}
    except (msgspec.DecodeError, RecursionError):  # not what the log writes: as stored
        data["metadata"] = raw
    if hash_ is not None:
        data["hash"] = hash_
    return {"id": data.pop("id"), **data}
