"""The wire formats the fake LLM servers speak: replies, SSE frames, request checks.

Kept apart from the servers so the formats can be read (and compared with the public
API references) in one place.  Each builder returns what a real provider would send:
JSON bodies, or SSE frames (``bytes``) with tool-call arguments split in pieces.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class Reply:
    """One scripted model answer; ``calls`` are (wire name, arguments) pairs.

    Arguments given as a string are sent verbatim (to script invalid JSON).
    ``stop_reason`` overrides the wire-level reason; ``malformed`` puts a non-JSON event
    in the stream; ``drop_after`` closes the connection after that many SSE events;
    ``raw`` replaces the answer's bytes: a stream's frames, or the pieces of a JSON body
    (to mimic a quirky or broken server).
    """

    text: str = ""
    calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: tuple[int, int] = (12, 5)
    cached: int = 0  # of usage[0], read from the prompt cache
    malformed: bool = False
    drop_after: int | None = None
    raw: list[bytes] | None = None


@dataclass
class Fail:
    """An HTTP error answer; ``code`` is OpenAI's ``error.code`` (Anthropic: ``type``)."""

    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None


@dataclass
class Reset:
    """No answer: the server reads the request and closes the connection (a reset)."""


#: What the providers answer when the prompt does not fit (their documented texts).
OPENAI_TOO_LONG = Fail(
    400,
    "This model's maximum context length is 128000 tokens. However, your messages "
    "resulted in 131072 tokens. Please reduce the length of the messages.",
    code="context_length_exceeded",
)
ANTHROPIC_TOO_LONG = Fail(400, "prompt is too long: 210000 tokens > 200000 maximum")


def pieces(text: str, size: int) -> list[str]:
    """``text`` in pieces of ``size`` characters (at least one piece, maybe empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


# -- OpenAI chat completions -------------------------------------------------------------
def openai_finish(reply: Reply) -> str:
    return reply.stop_reason or ("tool_calls" if reply.calls else "stop")


def openai_json(reply: Reply, model: str, call_ids: list[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": arguments_text(args)},
            }
            for cid, (name, args) in zip(call_ids, reply.calls, strict=True)
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": openai_finish(reply)}],
        "usage": openai_usage(reply),
    }


def openai_usage(reply: Reply) -> dict[str, Any]:
    return {
        "prompt_tokens": reply.usage[0],
        "completion_tokens": reply.usage[1],
        "total_tokens": sum(reply.usage),
        "prompt_tokens_details": {"cached_tokens": reply.cached},
    }


def openai_frames(
    reply: Reply, model: str, call_ids: list[str], size: int, include_usage: bool
) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    frames = [b": keep-alive comment\n\n", chunk({"role": "assistant", "content": ""})]
    if reply.text:
        frames += [chunk({"content": p}) for p in pieces(reply.text, size)]
    for index, (cid, (name, args)) in enumerate(zip(call_ids, reply.calls, strict=True)):
        first = {"index": index, "id": cid, "type": "function"}
        frames.append(
            chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]})
        )
        frames += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in pieces(arguments_text(args), size)
        ]
    frames.append(chunk({}, openai_finish(reply)))
    if include_usage:
        frames.append(sse({"id": "chatcmpl-fake", "choices": [], "usage": openai_usage(reply)}))
    frames.append(sse("[DONE]"))
    return frames


def openai_error(fail: Fail) -> dict[str, Any]:
    return {"error": {"message": fail.message, "type": "invalid_request_error", "code": fail.code}}


def openai_problems(body: dict[str, Any]) -> list[str]:
    """What the real API would reject with 400 (the subset the adapters could get wrong)."""
    problems: list[str] = []
    if not body.get("model"):
        problems.append("model is required")
    for i, tool in enumerate(body.get("tools") or []):
        name = tool.get("function", {}).get("name", "")
        if tool.get("type") != "function" or not NAME.match(name):
            problems.append(f"Invalid 'tools[{i}].function.name': {name!r}")
    open_ids: set[str] = set()
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            problems.append(f"messages[{i}].role {role!r} is invalid")
        for call in message.get("tool_calls") or []:
            if not isinstance(call.get("function", {}).get("arguments"), str):
                problems.append(f"messages[{i}] tool call arguments must be a string")
            open_ids.add(call.get("id", ""))
        if role == "tool" and message.get("tool_call_id") not in open_ids:
            problems.append(f"messages[{i}] answers no preceding tool call")
    return problems


# -- Anthropic messages ------------------------------------------------------------------
def anthropic_stop(reply: Reply) -> str:
    return reply.stop_reason or ("tool_use" if reply.calls else "end_turn")


def anthropic_json(reply: Reply, model: str, call_ids: list[str]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for cid, (name, args) in zip(call_ids, reply.calls, strict=True):
        content.append({"type": "tool_use", "id": cid, "name": name, "input": args})
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": anthropic_stop(reply),
        "stop_sequence": None,
        "usage": {
            # Anthropic counts the cache reads apart from input_tokens
            "input_tokens": reply.usage[0] - reply.cached,
            "cache_read_input_tokens": reply.cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": reply.usage[1],
        },
    }


def anthropic_frames(reply: Reply, model: str, call_ids: list[str], size: int) -> list[bytes]:
    start = anthropic_json(Reply(usage=(reply.usage[0], 1), cached=reply.cached), model, [])
    start["stop_reason"] = None
    frames = [
        sse({"type": "message_start", "message": start}, "message_start"),
        sse({"type": "ping"}, "ping"),
    ]
    index = 0
    if reply.text:
        frames.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
        )
        frames += [
            sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": p},
                },
                "content_block_delta",
            )
            for p in pieces(reply.text, size)
        ]
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    for cid, (name, args) in zip(call_ids, reply.calls, strict=True):
        block = {"type": "tool_use", "id": cid, "name": name, "input": {}}
        frames.append(
            sse(
                {"type": "content_block_start", "index": index, "content_block": block},
                "content_block_start",
            )
        )
        frames += [
            sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": p},
                },
                "content_block_delta",
            )
            for p in pieces(arguments_text(args), size)
        ]
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    frames.append(
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": anthropic_stop(reply), "stop_sequence": None},
                "usage": {"output_tokens": reply.usage[1]},
            },
            "message_delta",
        )
    )
    frames.append(sse({"type": "message_stop"}, "message_stop"))
    return frames


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_error(fail: Fail) -> dict[str, Any]:
    kind = ANTHROPIC_ERROR_TYPES.get(fail.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": fail.message}}


def anthropic_problems(body: dict[str, Any]) -> list[str]:
    """What the real API would reject with 400 (the subset the adapters could get wrong)."""
    problems: list[str] = []
    if not body.get("model"):
        problems.append("model: Field required")
    if not isinstance(body.get("max_tokens"), int):
        problems.append("max_tokens: Field required")
    for i, tool in enumerate(body.get("tools") or []):
        if not NAME.match(tool.get("name", "")) or "input_schema" not in tool:
            problems.append(f"tools.{i}: invalid tool {tool.get('name')!r}")
    messages = body.get("messages") or []
    if messages and messages[0].get("role") != "user":
        problems.append("messages: the first message must use the user role")
    previous_uses: set[str] = set()
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            problems.append(f"messages.{i}.role: {role!r} (system goes in the top-level field)")
        if i and messages[i - 1].get("role") == role:
            problems.append(f"messages.{i}: roles must alternate between user and assistant")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if not blocks:
            problems.append(f"messages.{i}: content must not be empty")
        seen_other = False
        for block in blocks:
            kind = block.get("type")
            if kind == "text" and not block.get("text"):
                problems.append(f"messages.{i}: text content blocks must be non-empty")
            if kind == "tool_result":
                if role != "user" or block.get("tool_use_id") not in previous_uses:
                    problems.append(f"messages.{i}: unexpected tool_use_id in tool_result")
                if seen_other:
                    problems.append(f"messages.{i}: tool_result blocks must come first")
            else:
                seen_other = True
        previous_uses = {b.get("id", "") for b in blocks if b.get("type") == "tool_use"}
    return problems
