"""Provider-neutral messages, tool calls and stream events (the design's Provider Adapter).

The kernel and the ai-provider sandbox exchange these as msgspec structs over IPC; each
adapter converts them to and from its provider's wire format.  Both sides import them from
here, the wire layer below both (the L1 kernel never imports L2 code: docs/architecture.md,
"Layers"); L2 images carry ``fluffy/ipc`` whole (``images/spec.py``, ``SANDBOX_PARTS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, Protocol

import msgspec

Role = Literal["system", "user", "assistant", "tool"]


#: User-role messages the kernel writes itself (a review's outcome, a window's opening)
#: start so: not the user's words (the scripted provider does not restart on them).
KERNEL_NOTE = "[fluffy]"


def kernel_note(text: str) -> str:
    return f"{KERNEL_NOTE} {text}"


class ToolDefinition(msgspec.Struct, frozen=True):
    """A tool as the model sees it: the full JSON Schema goes through function calling."""

    name: str
    description: str
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolCall(msgspec.Struct, frozen=True):
    """NormalizedToolCall: one call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    # the arguments as the model sent them when they were not a JSON object
    invalid_arguments: str | None = None


class Message(msgspec.Struct, frozen=True):
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    tool_call_id: str = ""  # role "tool": the call this answers
    name: str = ""  # role "tool": the tool's name


class ToolResult(msgspec.Struct, frozen=True):
    """What the kernel answered to a call (already sanitised)."""

    call_id: str
    ok: bool
    content: str


class Usage(msgspec.Struct, frozen=True):
    """What the provider said one request cost, in tokens.

    ``input_tokens`` is the whole prompt, cached parts included; ``cached_tokens`` the
    part read from the provider's prompt cache (billed cheaper).  ``reported`` is False
    when the provider said nothing (some local servers): the zeros then mean "unknown".
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reported: bool = False


class AIResponse(msgspec.Struct, frozen=True):
    text: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    stop_reason: str = "stop"  # stop | tool_calls | length | error
    usage: Usage = msgspec.field(default_factory=Usage)
    model: str = ""


# -- stream events (the design's StreamEvent; tag = "type") ------------------------------
class TextDelta(msgspec.Struct, frozen=True, tag="text_delta", tag_field="type"):
    content: str


class ToolCallStart(msgspec.Struct, frozen=True, tag="tool_call_start", tag_field="type"):
    call_id: str
    tool_name: str


class ToolCallDelta(msgspec.Struct, frozen=True, tag="tool_call_delta", tag_field="type"):
    call_id: str
    arguments_delta: str


class ToolCallEnd(msgspec.Struct, frozen=True, tag="tool_call_end", tag_field="type"):
    call_id: str


class ToolExecuting(msgspec.Struct, frozen=True, tag="tool_executing", tag_field="type"):
    """Kernel-emitted: a tool call started."""

    call_id: str
    tool_name: str
    description: str


class ToolResultEvent(msgspec.Struct, frozen=True, tag="tool_result", tag_field="type"):
    """Kernel-emitted: a tool call finished (end-to-end time, IPC and policy included)."""

    call_id: str
    summary: str
    duration_ms: float
    ok: bool = True


class Done(msgspec.Struct, frozen=True, tag="done", tag_field="type"):
    """The end of one model response; carries the whole response."""

    response: AIResponse | None = None


StreamEvent = (
    TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | ToolExecuting | ToolResultEvent | Done
)


#: What went wrong, as the kernel's retry policy sees it (ProviderError.kind).
ErrorKind = Literal[
    "rate_limit",  # 429: wait (Retry-After) and retry
    "overloaded",  # 529 / overloaded_error: the provider is busy
    "server",  # 408, 409, 5xx: the provider's side
    "network",  # timeouts, refused or reset connections, streams cut short
    "context_length",  # the prompt does not fit the model's window: compact, not retry
    "auth",  # 401 / 403: the key
    "request",  # any other 4xx: the request itself
    "malformed",  # an answer that is not the provider's format
    "other",
]


class ProviderError(Exception):
    """A provider request failed; ``retryable`` for rate limits, 5xx and dropped streams.

    ``retry_after_s`` is the wait the provider asked for (``retry-after-ms`` or
    ``Retry-After``), None when it named none; the kernel decides whether to wait.
    """

    def __init__(
        self,
        what: str,
        *,
        why: str = "",
        fix: str = "",
        retryable: bool = False,
        kind: ErrorKind = "other",
        retry_after_s: float | None = None,
    ):
        super().__init__(what)
        self.what, self.why, self.fix, self.retryable = what, why, fix, retryable
        self.kind: ErrorKind = kind
        self.retry_after_s = retry_after_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
            "retryable": self.retryable,
            "kind": self.kind,
            "retry_after_s": self.retry_after_s,
        }


class AIProviderAdapter(Protocol):
    """The design's AIProviderAdapter (synchronous: it runs in the sandbox's own thread)."""

    name: str

    def format_tools(self, tools: list[ToolDefinition]) -> list[dict[str, Any]]: ...

    def chat(self, messages: list[Message], tools: list[ToolDefinition]) -> AIResponse: ...

    def chat_stream(
        self, messages: list[Message], tools: list[ToolDefinition]
    ) -> Iterator[StreamEvent]:
        """Yields events; the last one is :class:`Done` with the whole response."""
        ...

    def parse_tool_calls(self, response: AIResponse) -> list[ToolCall]: ...

    def format_tool_result(self, call: ToolCall, result: ToolResult) -> dict[str, Any]: ...


def encode(value: Any) -> bytes:
    return msgspec.json.encode(value)


def decode_messages(data: Any) -> list[Message]:
    return msgspec.convert(data, list[Message])


def decode_tools(data: Any) -> list[ToolDefinition]:
    return msgspec.convert(data, list[ToolDefinition])


ProviderName = Literal["scripted", "openai", "anthropic"]


class ScriptedCall(msgspec.Struct, frozen=True):
    tool: str
    args: dict[str, Any] = msgspec.field(default_factory=dict)


class ScriptedTurn(msgspec.Struct, frozen=True):
    """One scripted model response: text, then tool calls (none: the task is done)."""

    say: str = ""
    calls: list[ScriptedCall] = msgspec.field(default_factory=list)


class ProviderConfig(msgspec.Struct, frozen=True):
    """What the kernel hands the ai-provider sandbox for one request (never persisted).

    ``api_key`` reaches only the sandbox: the kernel keeps it in memory and every audit
    summary redacts it.
    """

    name: ProviderName = "scripted"
    model: str = ""
    base_url: str = ""  # default: the provider's public endpoint
    api_key: str = ""
    max_tokens: int = 4096
    temperature: float | None = None
    timeout_s: float = 120.0
    #: the model's context window in tokens (0: the kernel's default)
    context_window: int = 0
    #: retries of a failed request (the kernel's retry policy, ADR-044)
    max_retries: int = 4
    #: the most the retries of one request may wait in all (seconds)
    retry_max_wait_s: float = 60.0
    turns: list[ScriptedTurn] = msgspec.field(default_factory=list)  # scripted only

    def __repr__(self) -> str:  # never show the key
        return (
            f"ProviderConfig(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"
        )
