"""The Anthropic Messages adapter against a fake server over real loopback HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fluffy.ipc.ai_types import (
    AIResponse,
    Message,
    ProviderConfig,
    ProviderError,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolDefinition,
    ToolResult,
)
from fluffy.sandboxes.ai.anthropic import AnthropicAdapter
from fluffy.sandboxes.ai.calls import ToolNames
from tests.fakes import FakeAnthropicServer, RefusingProxy, Reply
from tests.fakes.llm_wire import sse
from tests.unit.ai_support import done

pytestmark = pytest.mark.unit

KEY = "sk-ant-api03-9d8c7b6a5f4e"
TOOLS = [
    ToolDefinition(
        "fs.read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}
    ),
    ToolDefinition("fs.write", "Write a file", {"type": "object"}),
    ToolDefinition("noargs", "No arguments"),
]
ASK = [Message("system", "You are fluffy."), Message("user", "fix it")]


def adapter(server: FakeAnthropicServer, client: httpx.Client, **config: Any) -> AnthropicAdapter:
    values = {"name": "anthropic", "model": "claude-test", "base_url": server.base_url, **config}
    return AnthropicAdapter(ProviderConfig(**values), client)


def test_stream_text_then_tool_calls(client: httpx.Client) -> None:
    reply = Reply(
        "Reading both.",
        [("fs__read", {"path": "a.py"}), ("fs__write", {"path": "b.py", "content": "x = 1\n"})],
        usage=(321, 45),
    )
    with FakeAnthropicServer([reply], api_key=KEY, chunk=4) as server:
        events = list(adapter(server, client, api_key=KEY).chat_stream(ASK, TOOLS))
    assert "".join(e.content for e in events if isinstance(e, TextDelta)) == "Reading both."
    lifecycle = [
        (type(e).__name__, e.call_id) for e in events if isinstance(e, ToolCallStart | ToolCallEnd)
    ]
    assert lifecycle == [
        ("ToolCallStart", "toolu_fake0"),
        ("ToolCallEnd", "toolu_fake0"),  # content_block_stop ends each call at once
        ("ToolCallStart", "toolu_fake1"),
        ("ToolCallEnd", "toolu_fake1"),
    ]
    assert [e.tool_name for e in events if isinstance(e, ToolCallStart)] == ["fs.read", "fs.write"]
    second = [
        e.arguments_delta
        for e in events
        if isinstance(e, ToolCallDelta) and e.call_id == "toolu_fake1"
    ]
    assert len(second) > 3
    assert json.loads("".join(second)) == {"path": "b.py", "content": "x = 1\n"}
    response = done(events)
    assert response.tool_calls == [
        ToolCall("toolu_fake0", "fs.read", {"path": "a.py"}),
        ToolCall("toolu_fake1", "fs.write", {"path": "b.py", "content": "x = 1\n"}),
    ]
    assert response.stop_reason == "tool_calls"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (321, 45)
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.body["system"] == "You are fluffy."
    assert sent.body["max_tokens"] == 4096
    assert sent.body["stream"] is True
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]}
    ]
    assert sent.body["tools"][0] == {
        "name": "fs__read",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    assert sent.body["tools"][2]["input_schema"] == {"type": "object", "properties": {}}


def test_non_streaming_chat(client: httpx.Client) -> None:
    with FakeAnthropicServer([Reply("Sure.", [("noargs", {})], usage=(9, 3))]) as server:
        response = adapter(server, client, max_tokens=512).chat(ASK, TOOLS)
    assert response == AIResponse(
        text="Sure.",
        tool_calls=[ToolCall("toolu_fake0", "noargs", {})],
        stop_reason="tool_calls",
        usage=response.usage,
        model="fake-model",
    )
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 3)
    sent = server.requests[0]
    assert sent.body["max_tokens"] == 512 and "stream" not in sent.body
    assert "x-api-key" not in sent.headers  # no key configured: none sent


@pytest.mark.parametrize(
    ("wire", "normal"), [("end_turn", "stop"), ("max_tokens", "length"), ("stop_sequence", "stop")]
)
def test_stop_reasons(client: httpx.Client, wire: str, normal: str) -> None:
    with FakeAnthropicServer([Reply("text", stop_reason=wire)] * 2) as server:
        assert done(list(adapter(server, client).chat_stream(ASK, []))).stop_reason == normal
        assert adapter(server, client).chat(ASK, []).stop_reason == normal


def test_tool_results_merge_into_one_user_message(client: httpx.Client) -> None:
    """Validated by the fake as the API does: alternation, ids, results first."""
    calls = [ToolCall("toolu_1", "fs.read", {"path": "a"}), ToolCall("toolu_2", "fs.write")]
    history = [
        *ASK,
        Message("assistant", "Reading.", tool_calls=calls),
        Message("tool", "contents of a", tool_call_id="toolu_1", name="fs.read"),
        Message("tool", "", tool_call_id="toolu_2", name="fs.write"),
        Message("user", "and hurry"),
        Message("system", "Workflow state: test_writing."),
    ]
    with FakeAnthropicServer([Reply("ok")]) as server:
        assert adapter(server, client).chat(history, TOOLS).text == "ok"
    body = server.requests[0].body
    assert body["system"] == "You are fluffy.\n\nWorkflow state: test_writing."
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "fs__read", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "fs__write", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "contents of a"},
                {"type": "tool_result", "tool_use_id": "toolu_2"},
                {"type": "text", "text": "and hurry"},
            ],
        },
    ]


def test_format_tool_results(client: httpx.Client) -> None:
    a = AnthropicAdapter(ProviderConfig(name="anthropic", model="m"), client)
    one, two = ToolCall("t1", "fs.read"), ToolCall("t2", "fs.write")
    merged = a.format_tool_results(
        [(one, ToolResult("t1", True, "data")), (two, ToolResult("t2", False, "denied"))]
    )
    assert merged == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "data"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "denied", "is_error": True},
        ],
    }
    assert (
        a.format_tool_result(one, ToolResult("t1", True, "data"))["content"]
        == merged["content"][:1]
    )
    assert a.parse_tool_calls(AIResponse(tool_calls=[one])) == [one]
    assert a.format_tools(TOOLS)[1]["name"] == "fs__write"


def test_invalid_tool_input_json(client: httpx.Client) -> None:
    with FakeAnthropicServer([Reply("", [("fs__read", '{"path": ')])] * 2) as server:
        (call,) = done(list(adapter(server, client).chat_stream(ASK, TOOLS))).tool_calls
        (plain,) = adapter(server, client).chat(ASK, TOOLS).tool_calls  # input: a string
    assert (call.name, call.arguments, call.invalid_arguments) == ("fs.read", {}, '{"path": ')
    assert (plain.arguments, plain.invalid_arguments) == ({}, json.dumps('{"path": '))


def test_unknown_events_and_blocks_are_ignored(client: httpx.Client) -> None:
    frames = [
        sse({"type": "message_start", "message": {"model": "m1", "usage": {"input_tokens": 5}}}),
        sse({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}}),
        sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "hm"},
            }
        ),
        sse({"type": "content_block_stop", "index": 0}),
        sse({"type": "some_future_event", "x": 1}),
        sse(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "text", "text": "Hi"},
            }
        ),
        sse({"type": "content_block_stop", "index": 1}),
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 2},
            }
        ),
        sse({"type": "message_stop"}),
    ]
    with FakeAnthropicServer([Reply(raw=frames)]) as server:
        response = done(list(adapter(server, client).chat_stream(ASK, [])))
    assert (response.text, response.stop_reason, response.model) == ("Hi", "stop", "m1")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (5, 2)


# -- errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False])
def test_401_never_shows_the_key(client: httpx.Client, stream: bool) -> None:
    with FakeAnthropicServer(api_key="the-right-key") as server:
        a = adapter(server, client, api_key=KEY)
        with pytest.raises(ProviderError) as info:
            list(a.chat_stream(ASK, [])) if stream else a.chat(ASK, [])
    error = info.value
    assert error.what == "the provider refused the API key"
    assert "ANTHROPIC_API_KEY" in error.fix
    assert not error.retryable
    rendered = " ".join([str(error), repr(error), json.dumps(error.to_dict()), repr(a)])
    assert KEY not in rendered and KEY[10:] not in rendered


@pytest.mark.parametrize(
    ("status", "retryable"), [(529, True), (429, True), (404, False), (400, False)]
)
def test_status_errors(client: httpx.Client, status: int, retryable: bool) -> None:
    with FakeAnthropicServer() as server:
        server.fail(status, message="nope from anthropic")
        with pytest.raises(ProviderError) as info:
            list(adapter(server, client).chat_stream(ASK, []))
    assert info.value.retryable is retryable
    assert "nope from anthropic" in info.value.why


def test_illegal_tool_names_are_hashed_into_legal_ones(client: httpx.Client) -> None:
    tools = [ToolDefinition("bad name!", "")]
    with FakeAnthropicServer([Reply("", [(ToolNames(["bad name!"]).wire("bad name!"), {})])]) as s:
        (call,) = adapter(s, client).chat([Message("user", "x")], tools).tool_calls
    assert call.name == "bad name!"
    assert s.requests[0].body["tools"][0]["name"] != "bad name!"


def test_a_request_the_api_rejects_says_why(client: httpx.Client) -> None:
    with FakeAnthropicServer() as server, pytest.raises(ProviderError) as info:
        adapter(server, client, model="").chat(ASK, [])
    assert info.value.what == "the provider rejected the request"
    assert "model: Field required" in info.value.why
    assert not info.value.retryable


@pytest.mark.parametrize(
    ("kind", "retryable"), [("overloaded_error", True), ("invalid_request_error", False)]
)
def test_an_error_event_mid_stream(client: httpx.Client, kind: str, retryable: bool) -> None:
    frames = [
        sse({"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 1}}}),
        sse({"type": "error", "error": {"type": kind, "message": "Overloaded"}}, "error"),
    ]
    with FakeAnthropicServer([Reply(raw=frames)]) as server, pytest.raises(ProviderError) as info:
        list(adapter(server, client).chat_stream(ASK, []))
    assert info.value.retryable is retryable
    assert kind in info.value.why


def test_malformed_stream(client: httpx.Client) -> None:
    with (
        FakeAnthropicServer([Reply("hello world", malformed=True)]) as server,
        pytest.raises(ProviderError) as info,
    ):
        list(adapter(server, client).chat_stream(ASK, []))
    assert "malformed" in info.value.what


def test_dropped_stream_is_retryable(client: httpx.Client) -> None:
    with (
        FakeAnthropicServer([Reply("x" * 40, drop_after=5)]) as server,
        pytest.raises(ProviderError) as info,
    ):
        list(adapter(server, client).chat_stream(ASK, []))
    assert info.value.retryable


def test_stream_without_message_stop_is_retryable(client: httpx.Client) -> None:
    frames = [sse({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})]
    with FakeAnthropicServer([Reply(raw=frames)]) as server, pytest.raises(ProviderError) as info:
        list(adapter(server, client).chat_stream(ASK, []))
    assert info.value.retryable and "ended before" in info.value.what


def test_proxy_refusal(client: httpx.Client) -> None:
    with RefusingProxy() as proxy, httpx.Client(proxy=proxy.url) as via_proxy:
        config = ProviderConfig(name="anthropic", model="m", api_key=KEY)
        with pytest.raises(ProviderError) as info:
            AnthropicAdapter(config, via_proxy).chat(ASK, [])
    assert proxy.request_lines == ["CONNECT api.anthropic.com:443 HTTP/1.1"]
    assert "network_whitelist" in info.value.why
    assert KEY not in json.dumps(info.value.to_dict())


def test_base_url_with_or_without_v1(client: httpx.Client) -> None:
    with FakeAnthropicServer([Reply("a"), Reply("b")]) as server:
        assert adapter(server, client).chat(ASK, []).text == "a"
        assert adapter(server, client, base_url=server.base_url + "/v1/").chat(ASK, []).text == "b"
    assert [r.path for r in server.requests] == ["/v1/messages", "/v1/messages"]
