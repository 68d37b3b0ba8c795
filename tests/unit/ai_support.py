"""Shared by the provider adapter tests (their ``client`` fixture is in conftest.py)."""

from __future__ import annotations

from fluffy.ipc.ai_types import AIResponse, Done, StreamEvent


def done(events: list[StreamEvent]) -> AIResponse:
    """The whole response: the stream's one Done event, which comes last."""
    assert isinstance(events[-1], Done)
    assert events[-1].response is not None
    assert not any(isinstance(e, Done) for e in events[:-1])
    return events[-1].response
