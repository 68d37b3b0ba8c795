"""What a session keeps beside its mode and state, as one typed struct.

The workflow, the tool path and the AI loop each note something in a session (an
exemption, the trees its guards compare against, that a merge started, why the review
needs a person...).  :class:`SessionData` names every such field with its type; it is
stored as canonical JSON in ``sessions.data`` and chained in ``state_log`` with the mode
and state (kernel/workflow/store.py), a field at its default left out.  Others change
it through :meth:`~fluffy.kernel.workflow.machine.Workflow.annotate`, whose keywords
are :class:`DataChange`'s: a field no one declared is a type error, not a new key.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec


class Exemption(msgspec.Struct, frozen=True, kw_only=True):
    """A granted TDD exemption: its category, the paths it covers, why, its rule's condition."""

    category: str
    paths: list[str]
    reason: str
    condition: str = ""


class PendingExemption(msgspec.Struct, frozen=True, kw_only=True):
    """An exemption the AI asked for, held until the person decides on ``request_id``."""

    category: str
    paths: list[str]
    reason: str
    #: "" in sessions written before requests had ids (the person cancels those)
    request_id: str = ""


class SessionData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Everything a session notes beside its mode and state."""

    #: the exemption in force (granted), which replaces the TDD flow for its paths
    exemption: Exemption | None = None
    #: the AI's request the person has not decided on yet
    exemption_pending: PendingExemption | None = None
    #: the tests' and the sources' trees (path -> sha256) when the state was entered:
    #: the guards compare a run's tree with them (None: this state took none; an empty
    #: tree is a snapshot too)
    tests_base: dict[str, str] | None = None
    sources_base: dict[str, str] | None = None
    #: the newest test run's id when the state was entered (the guards want a newer one)
    runs_since: int = 0
    #: the person approved the merge this review is for (committing only)
    merge_approved: bool = False
    #: who approved the merge that started writing the project (a crash resumes it)
    merge_started: str | None = None
    #: why this review needs a person (support code changed, a green run in doubt...)
    review_required: list[str] = []
    #: the reason the model gave for asking for tests at the review
    tests_requested: str | None = None
    #: an explore change is being committed without tests first
    unverified: bool = False
    #: why the session's AI is quarantined (its calls are refused until a person lifts it)
    quarantined: str | None = None
    #: the person's identity for the session's commits ``{name, email}``, and the trailer
    commit_author: dict[str, str] | None = None
    commit_trailer: str | None = None


class DataChange(TypedDict, total=False):
    """The fields :meth:`Workflow.annotate` may set; ``None`` puts one back to its default."""

    exemption: Exemption | None
    exemption_pending: PendingExemption | None
    merge_started: str | None
    review_required: list[str] | None
    tests_requested: str | None
    quarantined: str | None
    commit_author: dict[str, str] | None
    commit_trailer: str | None


_DEFAULTS: dict[str, Any] = {
    field.name: field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
    for field in msgspec.structs.fields(SessionData)
}


def changed(data: SessionData, change: DataChange) -> SessionData:
    """``data`` with ``change`` applied (``None``: the field's default)."""
    values = {k: _DEFAULTS[k] if v is None else v for k, v in change.items()}
    return msgspec.structs.replace(data, **values)


def decode(raw: Any) -> SessionData:
    """A stored session's data (the JSON object ``sessions.data`` holds) as the struct;
    ValueError when a field has a type the workflow never writes."""
    try:
        return msgspec.convert(raw, SessionData, strict=True)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
