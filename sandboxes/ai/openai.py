"""The OpenAI chat-completions adapter (also Ollama, vLLM, llama.cpp, LM Studio, ...).

One wire format serves OpenAI and the local servers that copy it, so this adapter is
deliberately lenient in what it reads: a missing ``index`` on a streamed tool call, a
call sent whole in one chunk, arguments as an object instead of a JSON string, a stream
that ends without ``[DONE]`` after its finish reason.  ``Authorization`` is only sent
when there is a key (local servers need none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec

from fluffy.ipc.ai_types import (
    AIResponse,
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
from fluffy.sandboxes.ai.httpio import (
    Endpoint,
    context_too_long,
    is_context_length,
    provider_code,
    provider_message,
    redact,
)

DEFAULT_BASE_URL = endpoints.OPENAI
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


# -- the parts of the wire format we read (unknown fields are ignored) -------------------
class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class _WireCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Function = msgspec.field(default_factory=_Function)


class _WireMessage(msgspec.Struct):
    content: str | list[Any] | None = None
    tool_calls: list[_WireCall] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _WireMessage | None = None
    delta: _WireMessage | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: _PromptDetails | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None
    model: str | None = None
    error: Any = None


def _text(content: str | list[Any] | None) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _usage(usage: _Usage | None) -> Usage:
    if usage is None:
        return Usage()
    details = usage.prompt_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        reported=True,
    )


def normalise_stop(finish: str | None, has_calls: bool) -> str:
    """stop | tool_calls | length | error (servers differ on tool_calls vs stop)."""
    if finish == "length":
        return "length"
    if has_calls:
        return "tool_calls"
    if finish == "content_filter":
        return "error"
    return "stop"


class OpenAIAdapter:
    name = "openai"

    def __init__(self, config: ProviderConfig, client: httpx.Client) -> None:
        self.config = config
        base = (config.base_url or DEFAULT_BASE_URL).rstrip("/")
        headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._endpoint = Endpoint(
            client,
            provider="openai",
            url=f"{base}/chat/completions",
            headers=headers,
            api_key=config.api_key,
            timeout_s=config.timeout_s,
        )
        # OpenAI's own newer models refuse max_tokens; the compatible servers know only it
        self._max_key = (
            "max_completion_tokens" if httpx.URL(base).host == "api.openai.com" else "max_tokens"
        )

    def __repr__(self) -> str:
        return f"OpenAIAdapter({self.config!r})"

    # -- the request ---------------------------------------------------------------------
    def format_tools(self, tools: list[ToolDefinition]) -> list[dict[str, Any]]:
        return self._format_tools(tools, ToolNames(t.name for t in tools))

    @staticmethod
    def _format_tools(tools: list[ToolDefinition], names: ToolNames) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": names.wire(t.name),
                    "description": t.description,
                    "parameters": t.parameters or EMPTY_SCHEMA,
                },
            }
            for t in tools
        ]

    def format_messages(self, messages: list[Message], names: ToolNames) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "tool":
                out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
            elif m.role == "assistant" and m.tool_calls:
                out.append(
                    {
                        "role": "assistant",
                        "content": m.content or None,
                        "tool_calls": [self._wire_call(c, names) for c in m.tool_calls],
                    }
                )
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    @staticmethod
    def _wire_call(call: ToolCall, names: ToolNames) -> dict[str, Any]:
        # invalid arguments go back as {}: some servers re-parse the history's arguments
        return {
            "id": call.id,
            "type": "function",
            "function": {
                "name": names.wire(call.name),
                "arguments": msgspec.json.encode(call.arguments).decode(),
            },
        }

    def _body(
        self, messages: list[Message], tools: list[ToolDefinition], *, stream: bool
    ) -> tuple[dict[str, Any], ToolNames]:
        names = ToolNames(t.name for t in tools)
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": self.format_messages(messages, names),
            self._max_key: self.config.max_tokens,
        }
        if tools:
            body["tools"] = self._format_tools(tools, names)
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body, names

    # -- the answer ----------------------------------------------------------------------
    def chat(self, messages: list[Message], tools: list[ToolDefinition]) -> AIResponse:
        body, names = self._body(messages, tools, stream=False)
        completion = self._endpoint.decode(self._endpoint.post(body), _Completion)
        if completion.error is not None:
            raise self._stream_error(completion.error)
        if not completion.choices or completion.choices[0].message is None:
            raise self._endpoint.malformed("the answer has no choices[0].message")
        choice = completion.choices[0]
        message = choice.message or _WireMessage()
        calls = [
            make_call(
                c.id or f"call_{i}", names.original(c.function.name or ""), c.function.arguments
            )
            for i, c in enumerate(message.tool_calls or [])
            if c.function.name
        ]
        return AIResponse(
            text=_text(message.content),
            tool_calls=calls,
            stop_reason=normalise_stop(choice.finish_reason, bool(calls)),
            usage=_usage(completion.usage),
            model=completion.model or self.config.model,
        )

    def chat_stream(
        self, messages: list[Message], tools: list[ToolDefinition]
    ) -> Iterator[StreamEvent]:
        body, names = self._body(messages, tools, stream=True)
        assembler = CallAssembler(names)
        keys = _CallKeys()
        text: list[str] = []
        finish: str | None = None
        usage = Usage()
        model = ""
        finished = False
        with contextlib.closing(self._endpoint.stream(body)) as events:
            for event in events:
                if event.data.strip() == "[DONE]":
                    finished = True
                    break
                chunk = self._endpoint.decode(event.data, _Completion)
                if chunk.error is not None:
                    raise self._stream_error(chunk.error)
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    delta = choice.delta or choice.message or _WireMessage()
                    piece = _text(delta.content)
                    if piece:
                        text.append(piece)
                        yield TextDelta(content=piece)
                    for position, call in enumerate(delta.tool_calls or []):
                        key = keys.key(call, position)
                        if call.id or call.function.name:
                            yield from assembler.start(key, call.id or "", call.function.name or "")
                        arguments = call.function.arguments
                        if isinstance(arguments, dict):
                            arguments = msgspec.json.encode(arguments).decode()
                        yield from assembler.delta(key, arguments or "")
                    if choice.finish_reason:
                        finish = choice.finish_reason
        if not finished and finish is None:
            raise stream_cut("no finish_reason and no [DONE] before the connection closed")
        yield from finish_stream(
            assembler,
            text,
            lambda has_calls: normalise_stop(finish, has_calls),
            usage,
            model or self.config.model,
        )

    def _stream_error(self, error: Any) -> ProviderError:
        body = msgspec.json.encode({"error": error})
        message = redact(provider_message(body), self.config.api_key)
        if is_context_length(provider_code(body), message):
            return context_too_long(f"the provider said: {message}")
        return ProviderError(
            "the provider reported an error",
            why=message or "an error object without a message",
            fix="Retry; if it persists, check the model and the request on the provider's side.",
            retryable=True,
            kind="server",
        )

    def parse_tool_calls(self, response: AIResponse) -> list[ToolCall]:
        return list(response.tool_calls)

    def format_tool_result(self, call: ToolCall, result: ToolResult) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call.id, "content": result.content}


class _CallKeys:
    """Streamed calls by ``index``; a new ``id`` on a used index (seen from some local
    servers that send every call as index 0) starts a new call."""

    def __init__(self) -> None:
        self._ids: dict[int, str] = {}
        self._alias: dict[int, int] = {}
        self._next = 1_000_000

    def key(self, call: _WireCall, position: int) -> int:
        index = call.index if call.index is not None else position
        key = self._alias.get(index, index)
        if call.id:
            seen = self._ids.get(key)
            if seen is not None and seen != call.id:
                key = self._next
                self._next += 1
                self._alias[index] = key
            self._ids[key] = call.id
        return key
