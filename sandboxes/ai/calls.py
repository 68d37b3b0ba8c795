"""Tool names on the wire, tool-call arguments, and tool calls assembled from a stream.

fluffy's tools are dotted (``fs.read``) but both OpenAI and Anthropic only accept
function names matching ``^[a-zA-Z0-9_-]{1,64}$``.  :class:`ToolNames` maps them
reversibly for one request: ``.`` becomes ``__``; a name that is still illegal, or that
would collide with another tool's wire name, gets a short hash instead.  The map is
built from the request's tools so the answer's names are translated back exactly;
names the request did not declare fall back to the plain ``__`` -> ``.`` rule.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from fluffy.ipc.ai_types import (
    AIResponse,
    Done,
    ProviderError,
    StreamEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

WIRE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ILLEGAL = re.compile(r"[^a-zA-Z0-9_-]")


def wire_name(name: str) -> str:
    """The plain mapping (``fs.read`` -> ``fs__read``), hashed only when still illegal."""
    simple = name.replace(".", "__")
    if WIRE_NAME.match(simple):
        return simple
    return _hashed(name)


def _hashed(name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    stem = _ILLEGAL.sub("_", name.replace(".", "__"))[:55] or "tool"
    return f"{stem}_{digest}"


class ToolNames:
    """One request's reversible name map (see the module doc)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._to_wire: dict[str, str] = {}
        self._from_wire: dict[str, str] = {}
        for name in names:
            self.add(name)

    def add(self, name: str) -> str:
        if name in self._to_wire:
            return self._to_wire[name]
        wire = wire_name(name)
        if wire in self._from_wire:  # "a.b" and "a__b" both want "a__b"
            wire = _hashed(name)
        self._to_wire[name] = wire
        self._from_wire[wire] = name
        return wire

    def wire(self, name: str) -> str:
        return self._to_wire.get(name) or self.add(name)

    def original(self, wire: str) -> str:
        known = self._from_wire.get(wire)
        if known is not None:
            return known
        return wire.replace("__", ".")


def parse_arguments(raw: str | dict[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """``(arguments, invalid)``: a JSON object, or ``({}, raw)`` when it is not one.

    An empty string means no arguments (models send it for parameterless tools).
    """
    if raw is None:
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not raw.strip():
        return {}, None
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return {}, raw
    if not isinstance(value, dict):
        return {}, raw
    return value, None


def make_call(call_id: str, name: str, raw: str | dict[str, Any] | None) -> ToolCall:
    arguments, invalid = parse_arguments(raw)
    return ToolCall(id=call_id, name=name, arguments=arguments, invalid_arguments=invalid)


class _Pending:
    __slots__ = ("call_id", "name", "parts", "started")

    def __init__(self, call_id: str, name: str) -> None:
        self.call_id, self.name = call_id, name
        self.parts: list[str] = []
        self.started = False


class CallAssembler:
    """Tool calls built from stream pieces, keyed by the provider's block/index number.

    A call's start event waits until its name is known (the first OpenAI delta normally
    carries id and name, but a server may send the name later); argument pieces that
    arrive before then are replayed after the start.
    """

    def __init__(self, names: ToolNames) -> None:
        self._names = names
        self._calls: dict[int, _Pending] = {}
        self._order: list[int] = []
        self._ended: set[int] = set()

    def __contains__(self, key: int) -> bool:
        return key in self._calls

    def start(self, key: int, call_id: str, wire: str) -> list[StreamEvent]:
        pending = self._calls.get(key)
        if pending is None:
            pending = _Pending(call_id or f"call_{key}", wire)
            self._calls[key] = pending
            self._order.append(key)
        else:
            if call_id and not pending.started and pending.call_id == f"call_{key}":
                pending.call_id = call_id
            if wire and not pending.name:
                pending.name = wire
        return self._maybe_start(pending)

    def delta(self, key: int, piece: str) -> list[StreamEvent]:
        pending = self._calls.get(key)
        if pending is None:
            pending = _Pending(f"call_{key}", "")
            self._calls[key] = pending
            self._order.append(key)
        if not piece:
            return []
        pending.parts.append(piece)
        if not pending.started:
            return []
        return [ToolCallDelta(call_id=pending.call_id, arguments_delta=piece)]

    def _maybe_start(self, pending: _Pending) -> list[StreamEvent]:
        if pending.started or not pending.name:
            return []
        pending.started = True
        events: list[StreamEvent] = [
            ToolCallStart(call_id=pending.call_id, tool_name=self._names.original(pending.name))
        ]
        if pending.parts:
            events.append(
                ToolCallDelta(call_id=pending.call_id, arguments_delta="".join(pending.parts))
            )
        return events

    def end(self, key: int) -> list[StreamEvent]:
        pending = self._calls.get(key)
        if pending is None or key in self._ended:
            return []
        self._ended.add(key)
        events = self._maybe_start(pending) if pending.name else []
        if pending.started:
            events.append(ToolCallEnd(call_id=pending.call_id))
        return events

    def end_all(self) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for key in self._order:
            events.extend(self.end(key))
        return events

    def calls(self) -> list[ToolCall]:
        """The finished calls, in the order they started (nameless fragments dropped)."""
        return [
            make_call(p.call_id, self._names.original(p.name), "".join(p.parts))
            for p in (self._calls[k] for k in self._order)
            if p.name
        ]


def stream_cut(why: str) -> ProviderError:
    """The error of a stream that ended before the answer did (worth a retry)."""
    return ProviderError(
        "the provider's stream ended before the answer did",
        why=why,
        fix="Retry the request.",
        retryable=True,
        kind="network",
    )


def finish_stream(
    assembler: CallAssembler,
    text: list[str],
    stop_of: Callable[[bool], str],
    usage: Usage,
    model: str,
) -> Iterator[StreamEvent]:
    """The stream's last events: the open calls' ends, then Done with the whole response
    (``stop_of(has_calls)`` is the provider's normalised stop reason)."""
    yield from assembler.end_all()
    calls = assembler.calls()
    yield Done(
        response=AIResponse(
            text="".join(text),
            tool_calls=calls,
            stop_reason=stop_of(bool(calls)),
            usage=usage,
            model=model,
        )
    )
