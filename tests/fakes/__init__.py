"""Fake network peers for tests and benchmarks (loopback only).

:mod:`tests.fakes.llm` holds scripted OpenAI- and Anthropic-compatible servers that speak
the real wire formats (JSON and SSE) over real HTTP, and a proxy that refuses CONNECT.
"""

from tests.fakes.llm import (
    Fail,
    FakeAnthropicServer,
    FakeOpenAIServer,
    Recorded,
    RefusingProxy,
    Reply,
    Reset,
)

__all__ = [
    "Fail",
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "Recorded",
    "RefusingProxy",
    "Reply",
    "Reset",
]
