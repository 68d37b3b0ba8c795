"""Errors of the AI session and its provider."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


class AiError(FluffyError):
    code = "ai.error"
    default_why = "the AI session could not go on"


class TurnRunning(AiError):
    """The session already runs a turn; it takes one message at a time."""

    code = "ai.turn_running"
    default_why = "a session works on one task at a time"
    default_fix = "Wait for it to finish (or cancel it with Ctrl-C / session.cancel)."


class Quarantined(AiError):
    """The session is quarantined (read-only) after repeated refusals."""

    code = "ai.quarantined"
    default_why = "too many of the session's tool calls were refused"
    default_fix = "Look at what was refused (fluffy audit log), then lift it with /unquarantine."


class ProviderFailed(AiError):
    code = "ai.provider_failed"
    default_why = "the AI provider's request failed"
    default_fix = "Check the provider settings (fluffy config show) and try again."


class ProviderBusy(ProviderFailed):
    """A failure a later attempt may fix: rate limit, overload, 5xx, a dropped connection.

    ``kind`` is the sandbox's classification; ``retry_after_s`` the wait the provider
    asked for (None: it named none).  The kernel's retry policy reads both (ADR-044).
    """

    code = "ai.provider_busy"
    retryable = True

    def __init__(
        self,
        what: str,
        *,
        why: str | None = None,
        fix: str | None = None,
        kind: str = "server",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(what, why=why, fix=fix)
        self.kind = kind
        self.retry_after_s = retry_after_s


class ContextTooLong(ProviderFailed):
    """The provider refused the prompt: it does not fit the model's context window."""

    code = "ai.context_too_long"
    default_why = "the provider refused the prompt as longer than the model's context window"
    default_fix = (
        "Start a new session, or set context_window to the model's real window "
        "(`fluffy config set context_window N`)."
    )


class TurnNotStarted(AiError):
    """A task was not handed to the session: what stopped it is the ``what``."""

    code = "ai.start"
    default_why = "the session could not take the task (its state or the kernel refused it)"
    default_fix = "Fix what the message names, then send the task again."


class LoopFailed(AiError):
    """An unexpected exception ended a turn (a bug of the kernel's, reported, not hidden)."""

    code = "ai.loop_failed"
    default_why = "an unexpected error ended the kernel's session loop"
    default_fix = "Retry; if it persists, report it with the kernel's log."


class CallCancelled(AiError):
    """A tool call had no result: the turn was cancelled or interrupted while it ran.
    Sent to the model as the call's answer (providers refuse an unanswered call)."""

    code = "ai.cancelled"
    default_why = "the turn was cancelled or interrupted before the call finished"
    default_fix = "Nothing to repair: ask again to go on."
