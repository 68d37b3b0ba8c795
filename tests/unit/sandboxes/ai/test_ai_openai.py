"""The OpenAI-compatible adapter against a fake server over real loopback HTTP."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.ipc.ai_types import (
    AIResponse,
    Done,
    Message,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolDefinition,
    ToolResult,
)
from fluffy.sandboxes.ai.calls import WIRE_NAME, ToolNames
from fluffy.sandboxes.ai.openai import OpenAIAdapter
from tests.fakes import Fail, FakeOpenAIServer, RefusingProxy, Reply
from tests.fakes.llm_wire import sse
from tests.unit.ai_support import done

pytestmark = pytest.mark.unit

KEY = "sk-test-4f9c2b7e1a8d"
TOOLS = [
    ToolDefinition(
        "fs.read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}
    ),
    ToolDefinition("search.grep", "Search", {"type": "object"}),
    ToolDefinition("noargs", "No arguments"),
]
ASK = [Message("system", "You are fluffy."), Message("user", "read a.py")]


def adapter(server: FakeOpenAIServer, client: httpx.Client, **config: Any) -> OpenAIAdapter:
    settings_ = {"name": "openai", "model": "gpt-test", "base_url": server.base_url, **config}
    return OpenAIAdapter(ProviderConfig(**settings_), client)


# -- round trips ---------------------------------------------------------------------
def test_stream_text_and_a_tool_call_assembled_across_chunks(client: httpx.Client) -> None:
    reply = Reply("Let me read it.", [("fs__read", {"path": "src/a.py", "limit": 200})])
    with FakeOpenAIServer([reply], api_key=KEY, chunk=4) as server:
        events = list(adapter(server, client, api_key=KEY).chat_stream(ASK, TOOLS))
    text = "".join(e.content for e in events if isinstance(e, TextDelta))
    assert text == "Let me read it."
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert starts == [ToolCallStart(call_id="call_fake0", tool_name="fs.read")]
    deltas = [e.arguments_delta for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 3  # the arguments came in pieces
    assert json.loads("".join(deltas)) == {"path": "src/a.py", "limit": 200}
    kinds = [type(e) for e in events if not isinstance(e, TextDelta)]
    assert kinds[0] is ToolCallStart and kinds[-2] is ToolCallEnd
    response = done(events)
    assert response.text == "Let me read it."
    assert response.tool_calls == [
        ToolCall("call_fake0", "fs.read", {"path": "src/a.py", "limit": 200})
    ]
    assert response.stop_reason == "tool_calls"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
    assert response.model == "fake-model"
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["max_tokens"] == 4096  # a compatible server: the classic field
    assert [t["function"]["name"] for t in sent.body["tools"]] == [
        "fs__read",
        "search__grep",
        "noargs",
    ]
    assert sent.body["tools"][2]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are fluffy."},
        {"role": "user", "content": "read a.py"},
    ]


def test_non_streaming_chat(client: httpx.Client) -> None:
    reply = Reply("", [("search__grep", {"pattern": "TODO"}), ("fs__read", {"path": "b"})])
    with FakeOpenAIServer([reply]) as server:
        response = adapter(server, client, temperature=0.2).chat(ASK, TOOLS)
    assert response == AIResponse(
        text="",
        tool_calls=[
            ToolCall("call_fake0", "search.grep", {"pattern": "TODO"}),
            ToolCall("call_fake1", "fs.read", {"path": "b"}),
        ],
        stop_reason="tool_calls",
        usage=response.usage,
        model="fake-model",
    )
    sent = server.requests[0]
    assert "authorization" not in sent.headers  # no key: local servers need none
    assert "stream" not in sent.body
    assert sent.body["temperature"] == 0.2


def test_parallel_calls_streamed_by_index(client: httpx.Client) -> None:
    calls: list[tuple[str, dict[str, Any] | str]] = [
        ("fs__read", {"path": f"f{i}.py"}) for i in range(3)
    ]
    with FakeOpenAIServer([Reply("", calls)], chunk=3) as server:
        events = list(adapter(server, client).chat_stream(ASK, TOOLS))
    response = done(events)
    assert [c.arguments["path"] for c in response.tool_calls] == ["f0.py", "f1.py", "f2.py"]
    ends = [e.call_id for e in events if isinstance(e, ToolCallEnd)]
    assert ends == ["call_fake0", "call_fake1", "call_fake2"]
    for call in response.tool_calls:  # each call's deltas rebuild exactly its arguments
        pieces = [
            e.arguments_delta
            for e in events
            if isinstance(e, ToolCallDelta) and e.call_id == call.id
        ]
        assert json.loads("".join(pieces)) == call.arguments


def test_plain_text_answer_stops(client: httpx.Client) -> None:
    with FakeOpenAIServer([Reply("All done here.")] * 2) as server:
        streamed = done(list(adapter(server, client).chat_stream(ASK, [])))
        plain = adapter(server, client).chat(ASK, [])
    for response in (streamed, plain):
        assert (response.text, response.tool_calls, response.stop_reason) == (
            "All done here.",
            [],
            "stop",
        )
    assert "tools" not in server.requests[0].body


def test_length_stop_reason(client: httpx.Client) -> None:
    with FakeOpenAIServer([Reply("truncat", stop_reason="length")] * 2) as server:
        assert done(list(adapter(server, client).chat_stream(ASK, []))).stop_reason == "length"
        assert adapter(server, client).chat(ASK, []).stop_reason == "length"


@pytest.mark.parametrize("raw", ['{"path": "a"', "[1, 2]", "not json"])
def test_arguments_that_are_not_a_json_object(client: httpx.Client, raw: str) -> None:
    with FakeOpenAIServer([Reply("", [("fs__read", raw)])] * 2) as server:
        streamed = done(list(adapter(server, client).chat_stream(ASK, TOOLS)))
        plain = adapter(server, client).chat(ASK, TOOLS)
    for response in (streamed, plain):
        (call,) = response.tool_calls
        assert (call.name, call.arguments, call.invalid_arguments) == ("fs.read", {}, raw)


def test_history_with_tool_calls_and_results_is_accepted(client: httpx.Client) -> None:
    """The fake rejects (400) what the real API would: dotted names, orphan results."""
    call = ToolCall("call_1", "fs.read", {"path": "a.py"})
    bad = ToolCall("call_2", "search.grep", invalid_arguments="{oops")
    history = [
        *ASK,
        Message("assistant", "", tool_calls=[call, bad]),
        Message("tool", "print('a')", tool_call_id="call_1", name="fs.read"),
        Message("tool", "invalid arguments", tool_call_id="call_2", name="search.grep"),
    ]
    with FakeOpenAIServer([Reply("a.py prints a")]) as server:
        response = adapter(server, client).chat(history, TOOLS)
    assert response.text == "a.py prints a"
    messages = server.requests[0].body["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "fs__read", "arguments": '{"path":"a.py"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "search__grep", "arguments": "{}"},
            },
        ],
    }
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "print('a')"}


def test_format_tool_result_and_parse_tool_calls(client: httpx.Client) -> None:
    a = OpenAIAdapter(ProviderConfig(name="openai", model="m"), client)
    call = ToolCall("call_9", "fs.read", {"path": "x"})
    assert a.format_tool_result(call, ToolResult("call_9", True, "data")) == {
        "role": "tool",
        "tool_call_id": "call_9",
        "content": "data",
    }
    assert a.parse_tool_calls(AIResponse(tool_calls=[call])) == [call]
    assert a.format_tools(TOOLS[:1])[0]["function"]["name"] == "fs__read"


def test_the_respond_callback_sees_what_was_sent(client: httpx.Client) -> None:
    def respond(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        return Reply(f"you said {last['content']}")

    with FakeOpenAIServer(respond=respond) as server:
        response = adapter(server, client).chat([Message("user", "ping")], [])
    assert response.text == "you said ping"


def test_official_endpoint_uses_max_completion_tokens(client: httpx.Client) -> None:
    a = OpenAIAdapter(ProviderConfig(name="openai", model="m"), client)
    body, _ = a._body(ASK, [], stream=False)
    assert "max_completion_tokens" in body and "max_tokens" not in body


# -- lenient reading of quirky compatible servers ------------------------------------
def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_calls_without_index_and_reused_index_and_object_arguments(
    client: httpx.Client,
) -> None:
    frames = [
        chunk({"content": "ok"}),
        # no index, whole call at once, arguments as an object
        chunk(
            {
                "tool_calls": [
                    {"id": "a", "function": {"name": "fs__read", "arguments": {"path": "1"}}}
                ]
            }
        ),
        # index 0 again but a new id: a second call
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "b", "function": {"name": "noargs", "arguments": ""}}
                ]
            }
        ),
        chunk({}, "stop"),  # some servers say stop even with calls; no [DONE] either
    ]
    with FakeOpenAIServer([Reply(raw=frames)]) as server:
        response = done(list(adapter(server, client).chat_stream(ASK, TOOLS)))
    assert response.tool_calls == [ToolCall("a", "fs.read", {"path": "1"}), ToolCall("b", "noargs")]
    assert response.stop_reason == "tool_calls"
    assert response.text == "ok"


def test_an_error_object_in_the_stream(client: httpx.Client) -> None:
    frames = [chunk({"content": "x"}), sse({"error": {"message": "model crashed"}})]
    with FakeOpenAIServer([Reply(raw=frames)]) as server, pytest.raises(ProviderError) as info:
        list(adapter(server, client).chat_stream(ASK, []))
    assert "model crashed" in info.value.why
    assert info.value.retryable


# -- errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("key", [KEY, "0123456789abcdef-no-prefix"])
@pytest.mark.parametrize("stream", [True, False])
def test_401_never_shows_the_key(client: httpx.Client, stream: bool, key: str) -> None:
    with FakeOpenAIServer(api_key="sk-the-right-one") as server:
        a = adapter(server, client, api_key=key)
        with pytest.raises(ProviderError) as info:
            list(a.chat_stream(ASK, [])) if stream else a.chat(ASK, [])
    error = info.value
    assert error.what == "the provider refused the API key"
    assert "OPENAI_API_KEY" in error.fix
    assert not error.retryable
    assert "401" in error.why
    assert "Incorrect API key provided: [redacted]" in error.why
    rendered = " ".join([str(error), repr(error), json.dumps(error.to_dict()), repr(a)])
    assert key not in rendered and key[8:] not in rendered
    assert error.__cause__ is None
    assert server.requests[0].headers["authorization"] == f"Bearer {key}"


@pytest.mark.parametrize(
    ("status", "retryable", "what"),
    [
        (404, False, "no such model or endpoint"),
        (400, False, "rejected the request"),
        (429, True, "rate limiting"),
        (500, True, "failed to answer"),
        (503, True, "failed to answer"),
    ],
)
def test_status_errors(client: httpx.Client, status: int, retryable: bool, what: str) -> None:
    with FakeOpenAIServer() as server:
        server.fail(status, times=2, message="the server says no")
        a = adapter(server, client)
        for call in (lambda: a.chat(ASK, []), lambda: list(a.chat_stream(ASK, []))):
            with pytest.raises(ProviderError) as info:
                call()
            assert what in info.value.what
            assert info.value.retryable is retryable
            assert "the server says no" in info.value.why


def test_a_wrong_model_path_is_a_404(client: httpx.Client) -> None:
    with FakeOpenAIServer() as server:
        config = ProviderConfig(name="openai", model="m", base_url=server.base_url + "/nope")
        with pytest.raises(ProviderError) as info:
            OpenAIAdapter(config, client).chat(ASK, [])
    assert "no such model" in info.value.what
    assert "base_url" in info.value.fix


def test_retry_after_is_reported(client: httpx.Client) -> None:
    with (
        FakeOpenAIServer([Fail(429, "slow down", {"retry-after": "7"})]) as server,
        pytest.raises(ProviderError) as info,
    ):
        adapter(server, client).chat(ASK, [])
    assert "retry after 7s" in info.value.why


def test_malformed_stream_is_a_provider_error(client: httpx.Client) -> None:
    with (
        FakeOpenAIServer([Reply("some text here", malformed=True)]) as server,
        pytest.raises(ProviderError) as info,
    ):
        list(adapter(server, client).chat_stream(ASK, []))
    assert "malformed" in info.value.what
    assert not info.value.retryable


@pytest.mark.parametrize("body", [b"<html>bad gateway</html>", b"[]", b'{"choices": 3}', b"{}"])
def test_malformed_json_answer_is_a_provider_error(client: httpx.Client, body: bytes) -> None:
    with FakeOpenAIServer([Reply(raw=[body])]) as server, pytest.raises(ProviderError) as info:
        adapter(server, client).chat(ASK, [])
    assert "malformed" in info.value.what
    assert not info.value.retryable


def test_an_error_object_in_a_200_answer(client: httpx.Client) -> None:
    with (
        FakeOpenAIServer([Reply(raw=[b'{"error": {"message": "busy"}}'])]) as server,
        pytest.raises(ProviderError) as info,
    ):
        adapter(server, client).chat(ASK, [])
    assert "busy" in info.value.why


@pytest.mark.parametrize("after", [1, 4])
def test_a_dropped_stream_is_retryable(client: httpx.Client, after: int) -> None:
    with FakeOpenAIServer([Reply("a long answer " * 5, drop_after=after)]) as server:
        events: list[StreamEvent] = []
        with pytest.raises(ProviderError) as info:
            events.extend(adapter(server, client).chat_stream(ASK, []))
    assert info.value.retryable
    assert not any(isinstance(e, Done) for e in events)


def test_a_stream_that_ends_without_finishing_is_retryable(client: httpx.Client) -> None:
    with (
        FakeOpenAIServer([Reply(raw=[chunk({"content": "half"})])]) as server,
        pytest.raises(ProviderError) as info,
    ):
        list(adapter(server, client).chat_stream(ASK, []))
    assert info.value.retryable
    assert "ended before" in info.value.what


def test_connection_refused_is_retryable(client: httpx.Client) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ProviderConfig(name="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ProviderError) as info:
        OpenAIAdapter(config, client).chat(ASK, [])
    assert info.value.retryable
    assert "cannot connect to 127.0.0.1" in info.value.what


def test_proxy_refusing_connect_names_the_whitelist() -> None:
    with RefusingProxy() as proxy, httpx.Client(proxy=proxy.url) as via_proxy:
        a = OpenAIAdapter(ProviderConfig(name="openai", model="m", api_key=KEY), via_proxy)
        with pytest.raises(ProviderError) as info:
            list(a.chat_stream(ASK, []))
    assert proxy.request_lines == ["CONNECT api.openai.com:443 HTTP/1.1"]
    assert "api.openai.com" in info.value.what
    assert "network_whitelist" in info.value.why
    assert KEY not in repr(info.value.to_dict())


# -- tool names ------------------------------------------------------------------------
def test_dotted_names_map_reversibly() -> None:
    names = ToolNames(["fs.read", "git.commit", "a__b", "a.b", "weird name/with:chars", "x" * 80])
    wires = [names.wire(n) for n in ["fs.read", "git.commit", "a__b", "a.b"]]
    assert wires[:3] == ["fs__read", "git__commit", "a__b"]
    assert wires[3] != "a__b"  # the collision got a hashed name
    for name in ["fs.read", "git.commit", "a__b", "a.b", "weird name/with:chars", "x" * 80]:
        assert WIRE_NAME.match(names.wire(name))
        assert names.original(names.wire(name)) == name
    assert ToolNames().original("plugin__tool") == "plugin.tool"  # undeclared: the plain rule


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=100), max_size=8, unique=True))
def test_property_name_map_is_legal_distinct_and_reversible(names: list[str]) -> None:
    table = ToolNames(names)
    wires = [table.wire(n) for n in names]
    assert len(set(wires)) == len(wires)
    assert all(WIRE_NAME.match(w) for w in wires)
    assert [table.original(w) for w in wires] == names
