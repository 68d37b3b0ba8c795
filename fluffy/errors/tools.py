"""Errors of tool calls and of merging their output into the project."""

from __future__ import annotations

from typing import Any

from fluffy.errors.tree import FluffyError


class ToolError(FluffyError):
    """A tool call could not be carried out (the AI sees it as the tool's result)."""

    code = "tool.error"


class ToolUnavailable(ToolError):
    """The design's ToolUnavailableError: the tool exists but not in this state.

    Its wire form adds the design's fields, among them ``error``: the design's tag for
    it, spelled from :attr:`code` (``tool.unavailable`` -> ``tool_unavailable``), so
    the class has one code and the tag cannot drift from it.
    """

    code = "tool.unavailable"
    default_why = "the TDD workflow allows other tools (or other paths) in this state"

    def __init__(
        self,
        what: str,
        *,
        tool_name: str,
        current_state: str,
        reason: str,
        available_tools: list[str],
        why: str | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(what, why=why or reason, fix=fix)
        self.tool_name = tool_name
        self.current_state = current_state
        self.reason = reason
        self.available_tools = available_tools

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(
            error=self.code.replace(".", "_"),
            tool_name=self.tool_name,
            current_state=self.current_state,
            reason=self.reason,
            available_tools=self.available_tools,
        )
        return data


class ToolNotFound(ToolError):
    code = "tool.not_found"
    default_why = "no built-in tool or installed plugin provides it"
    default_fix = "Call tool.list for the tools there are."


class ToolInputInvalid(ToolError):
    code = "tool.input_invalid"
    default_why = "the arguments do not match the tool's input schema"
    default_fix = "Correct the named argument and call the tool again."


class ToolFailed(ToolError):
    code = "tool.failed"
    default_why = "the tool reported an error while it ran"


class ToolRefused(ToolError):
    """The user said no to a call that waited for their answer (not a policy denial:
    it does not count towards the session's quarantine)."""

    code = "tool.refused"
    default_fix = "Do something else, or ask the user what they want."


class ToolTransient(ToolError):
    """A failure the caller may retry (reads are retried once by the router)."""

    code = "tool.transient"
    retryable = True
    default_why = "the tool's sandbox or connection failed, not the tool's own logic"


class SandboxExited(ToolTransient):
    """The call's sandbox stopped before answering (audited as the sandbox's crash)."""

    code = "tool.sandbox_exited"
    default_why = "the tool's sandbox stopped (crashed or was killed) before it answered"


class ToolTimeout(ToolError):
    code = "tool.timeout"
    retryable = True
    default_why = "the tool did not finish within its time limit"


class CircuitOpen(ToolError):
    code = "tool.circuit_open"
    retryable = True
    default_why = "the plugin failed 5 times in a row; calls are refused for 30 s"
    default_fix = "Wait for the circuit to close, and look at the plugin's last errors."


class MergeError(FluffyError):
    """A sandbox's output could not be merged into the project."""

    code = "merge.error"


class PatchRejected(MergeError):
    code = "merge.patch_rejected"
    default_why = "the patch does not apply to the current content of the file"
    default_fix = "Read the file again and write the change against its current content."


class MergeRefused(MergeError):
    code = "merge.refused"
    default_why = "the output would write outside the project, through a link, or a protected file"
    default_fix = "Write only regular files inside the project, outside protected paths."


class MergeConflict(MergeError):
    code = "merge.conflict"
    default_why = "the file changed in the project after the change was staged"
    default_fix = "Read the file again and make the change against its current content."


class MergeOverlap(MergeConflict):
    """The person changed files the session changed too, and the changes overlap: the
    merge stopped before writing anything.  ``paths`` names them."""

    code = "merge.overlap"
    default_fix = (
        "Nothing was merged and your version is kept. Read the file again and redo the "
        "change on top of it (the AI is told which file), or /reject the change."
    )

    def __init__(self, what: str, *, paths: list[str], why: str | None = None) -> None:
        super().__init__(what, why=why)
        self.paths = paths
