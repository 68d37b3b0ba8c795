"""A session's events as the CLI reads them: the kernel's, typed, and the CLI's own.

``session.events`` carries the kernel's events (fluffy/ipc/results/events.py); :func:`read`
decodes each as its kind.  A kernel newer than this CLI may send more than it knows:

* a field it does not know is dropped, at any depth (a new field is not a breaking
  change: CHANGELOG.md);
* an event of a kind it does not know, or one that does not decode even so, becomes
  :class:`Unknown`: a person is not shown it and :func:`~fluffy.cli.turns.follow` never
  acts on it (as a client of an event stream treats kinds newer than itself), while
  ``--json`` prints it as it came, for a script that knows it.

The CLI shows two kinds of its own: :class:`Ended` when it stops following a turn (the
kernel's turn may go on, waiting for the person), and :class:`Refusal` when the kernel
refuses the person's answer; ``--json`` prints them as ``turn_end`` and ``notice``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import msgspec.inspect as mi
from msgspec import UNSET, UnsetType

from fluffy.ipc.results.events import ExemptionAsked, ReviewShown, SessionEvent, ToolCallHeld

#: The events that ask the person something (unless the kernel decides: ``kernel_decides``).
Asked = ReviewShown | ExemptionAsked | ToolCallHeld


class Problem(msgspec.Struct, kw_only=True):
    """An error as the CLI shows it: what / why / fix, and its code when it has one."""

    what: str
    why: str
    fix: str
    code: str | UnsetType = UNSET


class Refusal(msgspec.Struct, kw_only=True, tag="notice", tag_field="type"):
    """The kernel refused the person's answer (an error notice the CLI shows itself)."""

    level: Literal["error"] = "error"
    what: str
    why: str
    fix: str
    code: str


class Ended(msgspec.Struct, kw_only=True, tag="turn_end", tag_field="type"):
    """Where following a turn stopped: at the kernel's turn_end (``synthetic`` false), or
    where the CLI stopped following (the kernel's turn may go on: what waits is named)."""

    status: str
    #: where the stream stands: the ``after`` to follow on from
    next: int
    turn_id: str | None = None
    text: str = ""
    error: Problem | None = None
    synthetic: bool = True
    #: a review waits: the plan that review.approve / .reject name
    plan_id: str | UnsetType = UNSET
    can_add_tests: bool | UnsetType = UNSET
    #: the model's exemption request ``request_id`` waits
    exemption: bool | UnsetType = UNSET
    request_id: str | UnsetType = UNSET
    #: a held tool call waits: its review id, and the tool
    tool_review: str | UnsetType = UNSET
    tool: str | UnsetType = UNSET


@dataclass(frozen=True)
class Unknown:
    """An event this CLI cannot read (a newer kernel's), kept as it came."""

    raw: Any


#: What a renderer is given: the kernel's events and the CLI's own.
Shown = SessionEvent | Ended | Refusal | Unknown

_KINDS: dict[object, type[SessionEvent]] = {
    cls.__struct_config__.tag: cls for cls in typing.get_args(SessionEvent)
}


def read(raw: Any) -> SessionEvent | Unknown:
    """One event of ``session.events``, as its kind (:class:`Unknown`: not readable here)."""
    tag = raw.get("type") if isinstance(raw, dict) else None
    kind = _KINDS.get(tag) if isinstance(tag, str) else None
    if kind is None:
        return Unknown(raw)
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError:
        pass
    try:  # a newer kernel's: without the fields this CLI does not know
        return msgspec.convert(_known(raw, mi.type_info(kind)), kind)
    except msgspec.ValidationError:
        return Unknown(raw)


def _known(value: Any, info: mi.Type) -> Any:
    """``value`` without the object fields ``info`` does not declare, at any depth."""
    if isinstance(info, mi.UnionType):
        for member in info.types:
            if isinstance(value, dict) and isinstance(member, mi.StructType | mi.DictType):
                return _known(value, member)
            if isinstance(value, list) and isinstance(member, mi.ListType):
                return _known(value, member)
        return value
    if isinstance(info, mi.StructType) and isinstance(value, dict):
        fields = {field.encode_name: field.type for field in info.fields}
        return {key: _known(item, fields[key]) for key, item in value.items() if key in fields}
    if isinstance(info, mi.DictType) and isinstance(value, dict):
        return {key: _known(item, info.value_type) for key, item in value.items()}
    if isinstance(info, mi.ListType) and isinstance(value, list):
        return [_known(item, info.item_type) for item in value]
    return value


def plain(event: Shown | dict[str, Any]) -> Any:
    """``event`` as JSON-ready values, as ``--json`` prints it."""
    return event.raw if isinstance(event, Unknown) else msgspec.to_builtins(event)
