"""How both adapters classify failures and read usage, against fake servers on loopback.

The sandbox makes one attempt; what it hands back (``kind``, ``retryable``, the wait the
provider asked for) is what the kernel's retry policy decides on (ADR-044).
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx
import pytest

from fluffy.ipc.ai_types import Message, ProviderConfig, ProviderError, TextDelta
from fluffy.sandboxes.ai.anthropic import AnthropicAdapter
from fluffy.sandboxes.ai.httpio import retry_after
from fluffy.sandboxes.ai.openai import OpenAIAdapter
from fluffy.sandboxes.ai_host import run_request
from tests.fakes import Fail, FakeAnthropicServer, FakeOpenAIServer, Reply, Reset
from tests.fakes.llm_wire import ANTHROPIC_TOO_LONG, OPENAI_TOO_LONG, sse
from tests.unit.ai_support import done

pytestmark = pytest.mark.unit

ASK = [Message("system", "You are fluffy."), Message("user", "hello")]
WIRES = ["openai", "anthropic"]


def _server(wire: str, replies: list[Any]) -> FakeOpenAIServer | FakeAnthropicServer:
    return FakeOpenAIServer(replies) if wire == "openai" else FakeAnthropicServer(replies)


def _adapter(wire: str, base_url: str, client: httpx.Client) -> OpenAIAdapter | AnthropicAdapter:
    config = ProviderConfig(name=wire, model="m", base_url=base_url)  # type: ignore[arg-type]
    if wire == "openai":
        return OpenAIAdapter(config, client)
    return AnthropicAdapter(config, client)


def _failure(wire: str, reply: Any, client: httpx.Client, *, stream: bool = True) -> ProviderError:
    with _server(wire, [reply]) as server:
        adapter = _adapter(wire, server.base_url, client)
        with pytest.raises(ProviderError) as caught:
            if stream:
                list(adapter.chat_stream(ASK, []))
            else:
                adapter.chat(ASK, [])
    return caught.value


# -- what may be retried, and after how long ---------------------------------------------
@pytest.mark.parametrize("wire", WIRES)
def test_a_429_is_a_rate_limit_with_the_wait_the_provider_asked_for(
    wire: str, client: httpx.Client
) -> None:
    error = _failure(wire, Fail(429, "slow down", {"retry-after": "7"}), client)
    assert (error.kind, error.retryable, error.retry_after_s) == ("rate_limit", True, 7.0)
    assert "retry after 7s" in error.why


@pytest.mark.parametrize("wire", WIRES)
def test_retry_after_ms_is_preferred_to_retry_after(wire: str, client: httpx.Client) -> None:
    headers = {"retry-after": "9", "retry-after-ms": "1500"}
    error = _failure(wire, Fail(429, "slow down", headers), client, stream=False)
    assert error.retry_after_s == 1.5


def test_retry_after_as_an_http_date_and_nonsense() -> None:
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after({"retry-after": date}, now=now) == pytest.approx(30, abs=1)
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after-ms": "-5", "retry-after": "2"}) == 2.0
    assert retry_after({}) is None


def test_a_529_is_anthropic_overloaded(client: httpx.Client) -> None:
    error = _failure("anthropic", Fail(529, "Overloaded"), client)
    assert (error.kind, error.retryable) == ("overloaded", True)
    assert error.what == "the provider is overloaded"


def test_an_overloaded_error_event_mid_stream_is_retryable(client: httpx.Client) -> None:
    frames = [
        sse({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}, "message_start"),
        sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]
    error = _failure("anthropic", Reply(raw=frames), client)
    assert (error.kind, error.retryable) == ("overloaded", True)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("status", [408, 409, 500, 502, 503])
def test_server_side_statuses_are_retryable(wire: str, status: int, client: httpx.Client) -> None:
    error = _failure(wire, Fail(status, "try later", {"retry-after": "2"}), client)
    assert (error.kind, error.retryable, error.retry_after_s) == ("server", True, 2.0)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_never_retryable(wire: str, status: int, client: httpx.Client) -> None:
    error = _failure(wire, Fail(status, "no"), client)
    assert not error.retryable
    assert error.kind in ("auth", "request")


@pytest.mark.parametrize("wire", WIRES)
def test_a_reset_before_any_answer_is_a_retryable_network_failure(
    wire: str, client: httpx.Client
) -> None:
    error = _failure(wire, Reset(), client)
    assert (error.kind, error.retryable) == ("network", True)
    assert "dropped" in error.what or "connect" in error.what


@pytest.mark.parametrize("wire", WIRES)
def test_a_stream_cut_after_some_text_is_a_retryable_network_failure(
    wire: str, client: httpx.Client
) -> None:
    shown: list[str] = []
    with _server(wire, [Reply("a long answer that is cut", drop_after=5)]) as server:
        adapter = _adapter(wire, server.base_url, client)
        with pytest.raises(ProviderError) as caught:
            for event in adapter.chat_stream(ASK, []):
                if isinstance(event, TextDelta):
                    shown.append(event.content)
    assert shown  # some text was already on its way to the user
    assert (caught.value.kind, caught.value.retryable) == ("network", True)


# -- a prompt that does not fit ----------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(
    ("wire", "fail"), [("openai", OPENAI_TOO_LONG), ("anthropic", ANTHROPIC_TOO_LONG)]
)
def test_a_context_length_error_is_its_own_kind(
    wire: str, fail: Fail, stream: bool, client: httpx.Client
) -> None:
    error = _failure(wire, fail, client, stream=stream)
    assert (error.kind, error.retryable) == ("context_length", False)
    assert error.what == "the conversation is too long for the model's context window"
    assert "compacts" in error.fix


def test_an_openai_stream_error_object_about_length_is_context_length(
    client: httpx.Client,
) -> None:
    frames = [
        sse({"error": {"message": "maximum context length exceeded", "code": None}}),
    ]
    error = _failure("openai", Reply(raw=frames), client)
    assert error.kind == "context_length"


# -- usage -------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("wire", WIRES)
def test_usage_with_cached_tokens_is_read_from_both_wires(
    wire: str, stream: bool, client: httpx.Client
) -> None:
    reply = Reply("hi", usage=(1200, 40), cached=1000)
    with _server(wire, [reply]) as server:
        adapter = _adapter(wire, server.base_url, client)
        response = done(list(adapter.chat_stream(ASK, []))) if stream else adapter.chat(ASK, [])
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (1200, 40, 1000)
    assert usage.reported


def test_a_server_that_reports_no_usage_says_so(client: httpx.Client) -> None:
    frames = [
        sse({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}),
        sse("[DONE]"),
    ]
    with FakeOpenAIServer([Reply(raw=frames)]) as server:
        response = done(list(_adapter("openai", server.base_url, client).chat_stream(ASK, [])))
    assert not response.usage.reported


# -- the sandbox's answer to the kernel --------------------------------------------------
def _job(wire: str, base_url: str) -> dict[str, Any]:
    provider = {"name": wire, "model": "m", "base_url": base_url}
    return {"job_id": "j1", "provider": provider, "messages": [{"role": "user", "content": "x"}]}


def test_run_request_hands_the_kernel_the_kind_and_the_wait() -> None:
    with FakeOpenAIServer([Fail(429, "slow", {"retry-after-ms": "250"})]) as server:
        reply = run_request(
            _job("openai", server.base_url),
            "",
            lambda e: None,
            client_for=lambda c, p: httpx.Client(),
        )
    assert reply["ok"] is False
    assert reply["error"]["kind"] == "rate_limit"
    assert reply["error"]["retryable"] is True
    assert reply["error"]["retry_after_s"] == 0.25
    assert len(server.requests) == 1  # the sandbox made one attempt: the kernel decides


def test_run_request_returns_the_usage() -> None:
    with FakeAnthropicServer([Reply("hi", usage=(50, 7), cached=20)]) as server:
        reply = run_request(
            _job("anthropic", server.base_url),
            "",
            lambda e: None,
            client_for=lambda c, p: httpx.Client(),
        )
    assert reply["ok"] is True
    assert reply["response"]["usage"] == {
        "input_tokens": 50,
        "output_tokens": 7,
        "cached_tokens": 20,
        "reported": True,
    }
