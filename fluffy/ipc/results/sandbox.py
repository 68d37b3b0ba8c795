"""Results of the sandboxes' own sockets: the jobs the kernel hands a plugin, the
ai-provider and the policy sandbox."""

from __future__ import annotations

from typing import Any

from fluffy.ipc.ai_types import Message, ProviderConfig, ToolDefinition
from fluffy.ipc.results import Part, Result
from fluffy.ipc.results.workflow import Mode


class Capability(Part):
    """A call's capability token: its syscall on exactly its paths, one use per path."""

    #: the token's id, shown back with each use in the call's result
    token: str
    #: the one syscall it covers (a write: ``fs.write``)
    syscall: str
    #: the exact paths it covers, sorted
    paths: list[str]
    #: how many uses it allows (one per path, at least one)
    max_ops: int


class ToolJob(Result):
    """The call a plugin's sandbox is handed (tool.next); null: no more, the host exits."""

    call_id: str
    tool: str
    #: the model's arguments, as the tool's own JSON Schema describes them
    args: dict[str, Any]
    session_mode: Mode
    sandbox_id: str
    #: the kernel's settings for the call (never the model's: e.g. test.run's interpreter
    #: and test command), their keys the tool's own; absent when there are none
    settings: dict[str, Any] = {}
    #: absent when the call gets no token (it writes nothing)
    capability: Capability | None = None


class ModelJob(Result):
    """One model request of the turn (ai.next); null: the turn is over, the host exits.

    Its messages, provider and tools are the AI wire's own types (fluffy/ipc/ai_types.py),
    which the ai-provider sandbox decodes them as.
    """

    #: names the request in its ai.event and ai.result
    job_id: str
    #: the conversation so far
    messages: list[Message]
    #: the kernel always sends it; the host reads an absent one as the default provider
    provider: ProviderConfig | None = None
    #: the kernel always sends them; the host reads absent ones as none
    tools: list[ToolDefinition] = []


class PolicyJob(Result):
    """One request for the extension rules to vote on (policy.next)."""

    #: names the request in its policy.verdict
    job: str
    #: the rules' input document: the request's syscall, path, caller ``{name, tags}``,
    #: state, mode, size, sandbox and command (the warm-up: syscall and caller only);
    #: open, as the rule files read it
    request: dict[str, Any]
