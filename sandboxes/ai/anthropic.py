"""The Anthropic Messages API adapter.

The Messages API differs from chat completions in ways the conversion below absorbs:
the system prompt is a top-level field, there is no ``tool`` role (results are
``tool_result`` blocks in a *user* message, all results of one assistant turn in one
message, before any text), ``max_tokens`` is required, and the stream is a sequence of
typed events over content blocks.  Unknown event and block types (``thinking``, new
ones) are ignored, as Anthropic's versioning policy asks of clients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec

from fluffy.ipc.ai_types import (
    AIResponse,
    ErrorKind,
    Message,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolDefinition,
    ToolResult,
    Usage,
)
from fluffy.sandboxes.ai import endpoints
from fluffy.sandboxes.ai.calls import (
    CallAssembler,
    ToolNames,
    finish_stream,
    make_call,
    stream_cut,
)
from fluffy.sandboxes.ai.httpio import Endpoint, context_too_long, is_context_length, redact

DEFAULT_BASE_URL = endpoints.ANTHROPIC
API_VERSION = "2023-06-01"
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "error",
}
RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


# -- the parts of the wire format we read (unknown fields are ignored) -------------------
class _Block(msgspec.Struct):
    type: str = ""
    text: str = ""
    id: str = ""
    name: str = ""
    input: Any = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    def usage(self, output_tokens: int | None = None) -> Usage:
        """The neutral usage: input counts the cache reads and writes too."""
        return Usage(
            input_tokens=self.inputs() or 0,
            output_tokens=output_tokens if output_tokens is not None else self.output_tokens or 0,
            cached_tokens=self.cache_read_input_tokens or 0,
            reported=self.input_tokens is not None or self.output_tokens is not None,
        )

    def inputs(self) -> int | None:
        if self.input_tokens is None:
            return None
        cached = (self.cache_creation_input_tokens or 0) + (self.cache_read_input_tokens or 0)
        return self.input_tokens + cached


class _Message(msgspec.Struct):
    content: list[_Block] = msgspec.field(default_factory=list)
    stop_reason: str | None = None
    usage: _Usage = msgspec.field(default_factory=_Usage)
    model: str = ""


class _Delta(msgspec.Struct):
    type: str = ""
    text: str = ""
    partial_json: str = ""
    stop_reason: str | None = None


class _Error(msgspec.Struct):
    type: str = ""
    message: str = ""


class _Event(msgspec.Struct):
    type: str = ""
    message: _Message | None = None
    index: int = 0
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: _Error | None = None


def normalise_stop(reason: str | None, has_calls: bool) -> str:
    stop = STOP_REASONS.get(reason or "", "stop")
    if has_calls and stop == "stop":
        return "tool_calls"
    return stop


class AnthropicAdapter:
    name = "anthropic"

    def __init__(self, config: ProviderConfig, client: httpx.Client) -> None:
        self.config = config
        base = (config.base_url or DEFAULT_BASE_URL).rstrip("/")
        url = f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"
        headers = {"anthropic-version": API_VERSION}
        if config.api_key:
            headers["x-api-key"] = config.api_key
        self._endpoint = Endpoint(
            client,
            provider="anthropic",
            url=url,
            headers=headers,
            api_key=config.api_key,
            timeout_s=config.timeout_s,
        )

    def __repr__(self) -> str:
        return f"AnthropicAdapter({self.config!r})"

    # -- the request ---------------------------------------------------------------------
    def format_tools(self, tools: list[ToolDefinition]) -> list[dict[str, Any]]:
        return self._format_tools(tools, ToolNames(t.name for t in tools))

    @staticmethod
    def _format_tools(tools: list[ToolDefinition], names: ToolNames) -> list[dict[str, Any]]:
        return [
            {
                "name": names.wire(t.name),
                "description": t.description,
                "input_schema": t.parameters or EMPTY_SCHEMA,
            }
            for t in tools
        ]

    def format_messages(
        self, messages: list[Message], names: ToolNames
    ) -> tuple[str, list[dict[str, Any]]]:
        """``(system, messages)``: consecutive same-role messages merged into one."""
        system: list[str] = []
        out: list[dict[str, Any]] = []

        def push(role: str, blocks: list[dict[str, Any]]) -> None:
            if not blocks:
                return
            if out and out[-1]["role"] == role:
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})

        for m in messages:
            if m.role == "system":
                if m.content:
                    system.append(m.content)
            elif m.role == "user":
                push("user", [{"type": "text", "text": m.content}] if m.content else [])
            elif m.role == "tool":
                push("user", [_result_block(m.tool_call_id, m.content, is_error=False)])
            else:
                blocks: list[dict[str, Any]] = []
                if m.content:
                    blocks.append({"type": "text", "text": m.content})
                blocks.extend(
                    {
                        "type": "tool_use",
                        "id": c.id,
                        "name": names.wire(c.name),
                        "input": c.arguments,
                    }
                    for c in m.tool_calls
                )
                push("assistant", blocks)
        for message in out:  # tool results must open their user message
            if message["role"] == "user":
                message["content"].sort(key=lambda b: b["type"] != "tool_result")
        return "\n\n".join(system), out

    def _body(
        self, messages: list[Message], tools: list[ToolDefinition], *, stream: bool
    ) -> tuple[dict[str, Any], ToolNames]:
        names = ToolNames(t.name for t in tools)
        system, wire = self.format_messages(messages, names)
        body: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": self.config.max_tokens,
            "messages": wire,
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = self._format_tools(tools, names)
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if stream:
            body["stream"] = True
        return body, names

    # -- the answer ----------------------------------------------------------------------
    def chat(self, messages: list[Message], tools: list[ToolDefinition]) -> AIResponse:
        body, names = self._body(messages, tools, stream=False)
        message = self._endpoint.decode(self._endpoint.post(body), _Message)
        text = "".join(b.text for b in message.content if b.type == "text")
        calls = [
            make_call(b.id, names.original(b.name), _raw_input(b.input))
            for b in message.content
            if b.type == "tool_use"
        ]
        return AIResponse(
            text=text,
            tool_calls=calls,
            stop_reason=normalise_stop(message.stop_reason, bool(calls)),
            usage=message.usage.usage(),
            model=message.model or self.config.model,
        )

    def chat_stream(
        self, messages: list[Message], tools: list[ToolDefinition]
    ) -> Iterator[StreamEvent]:
        body, names = self._body(messages, tools, stream=True)
        assembler = CallAssembler(names)
        text: list[str] = []
        stop: str | None = None
        started = _Usage()  # message_start's usage: input and cache counts
        output_tokens: int | None = None
        model = ""
        finished = False
        with contextlib.closing(self._endpoint.stream(body)) as events:
            for sse in events:
                event = self._endpoint.decode(sse.data, _Event)
                kind = event.type or sse.event
                if kind == "message_start" and event.message is not None:
                    model = event.message.model or model
                    started = event.message.usage
                elif kind == "content_block_start" and event.content_block is not None:
                    block = event.content_block
                    if block.type == "text" and block.text:
                        text.append(block.text)
                        yield TextDelta(content=block.text)
                    elif block.type == "tool_use":
                        yield from assembler.start(event.index, block.id, block.name)
                        if isinstance(block.input, dict) and block.input:
                            piece = msgspec.json.encode(block.input).decode()
                            yield from assembler.delta(event.index, piece)
                elif kind == "content_block_delta" and event.delta is not None:
                    delta = event.delta
                    if delta.type == "text_delta" and delta.text:
                        text.append(delta.text)
                        yield TextDelta(content=delta.text)
                    elif delta.type == "input_json_delta" and event.index in assembler:
                        yield from assembler.delta(event.index, delta.partial_json)
                elif kind == "content_block_stop":
                    yield from assembler.end(event.index)
                elif kind == "message_delta":
                    if event.delta is not None and event.delta.stop_reason:
                        stop = event.delta.stop_reason
                    if event.usage is not None:  # cumulative counts: the latest wins
                        output_tokens = event.usage.output_tokens or output_tokens
                        if event.usage.input_tokens is not None:
                            started = event.usage
                elif kind == "message_stop":
                    finished = True
                    break
                elif kind == "error":
                    raise self._stream_error(event.error or _Error())
                # ping and unknown events: nothing to do
        if not finished:
            raise stream_cut("the connection closed before message_stop")
        yield from finish_stream(
            assembler,
            text,
            lambda has_calls: normalise_stop(stop, has_calls),
            started.usage(output_tokens),
            model or self.config.model,
        )

    def _stream_error(self, error: _Error) -> ProviderError:
        said = redact(error.message, self.config.api_key)
        why = f"{error.type or 'error'}: {said}" if said else (error.type or "an error event")
        if error.type == "invalid_request_error" and is_context_length("", said):
            return context_too_long(f"the provider said: {why}")
        retryable = error.type in RETRYABLE_ERRORS
        kind: ErrorKind = "server" if retryable else "request"
        if error.type == "overloaded_error":
            kind = "overloaded"
        elif error.type == "rate_limit_error":
            kind = "rate_limit"
        return ProviderError(
            "the provider is overloaded"
            if kind == "overloaded"
            else "the provider reported an error",
            why=why,
            fix="Retry in a moment." if retryable else "Check the request.",
            retryable=retryable,
            kind=kind,
        )

    def parse_tool_calls(self, response: AIResponse) -> list[ToolCall]:
        return list(response.tool_calls)

    def format_tool_result(self, call: ToolCall, result: ToolResult) -> dict[str, Any]:
        """One result as the user message that carries it (see format_tool_results)."""
        return self.format_tool_results([(call, result)])

    def format_tool_results(self, results: list[tuple[ToolCall, ToolResult]]) -> dict[str, Any]:
        """All results of one assistant turn: ONE user message, as the API requires."""
        return {
            "role": "user",
            "content": [_result_block(c.id, r.content, is_error=not r.ok) for c, r in results],
        }


def _raw_input(value: Any) -> str | dict[str, Any] | None:
    """A tool_use block's input as make_call takes it (a non-object becomes invalid)."""
    if value is None or isinstance(value, dict):
        return value
    return msgspec.json.encode(value).decode()


def _result_block(call_id: str, content: str, *, is_error: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if content:
        block["content"] = content
    if is_error:
        block["is_error"] = True
    return block
