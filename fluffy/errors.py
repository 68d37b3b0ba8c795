"""fluffy's one error tree.

Every failure that crosses a module boundary is a :class:`FluffyError`.  Each class
carries a stable, dotted ``code`` (used on the wire and in ``--json`` output, never
renamed) and three human parts: *what* happened, *why*, and *how to fix it*.  Only
the CLI edge renders them (see :mod:`fluffy.cli.render`); everything below raises.

Foreign exceptions (docker SDK, requests, OSError, subprocess) are mapped to this
tree at exactly one boundary per foreign library, e.g.
:func:`fluffy.kernel.containers.errors.map_engine_error`.

::

    FluffyError                       fluffy.error
    ├── ConfigError                   config.invalid
    ├── EngineError                   engine.error
    │   ├── EngineUnavailable         engine.unavailable
    │   ├── EngineOperationFailed     engine.operation_failed
    │   ├── EngineTimeout             engine.timeout
    │   └── EngineNotFound            engine.not_found
    │       └── ImageNotFound         engine.image_not_found
    ├── ImageError                    image.error
    │   ├── BaseImageUnavailable      image.base_unavailable
    │   ├── WheelhouseError           image.wheelhouse_failed
    │   ├── ImageBuildFailed          image.build_failed
    │   └── EnvironmentFailed         env.build_failed
    │       └── PackageUnavailable    env.package_unavailable
    ├── PolicyError                   policy.invalid
    ├── IpcError                      ipc.error
    │   ├── FrameEmpty                ipc.frame_empty
    │   ├── FrameTooLarge             ipc.frame_too_large
    │   ├── FrameTruncated            ipc.frame_truncated
    │   ├── InvalidPayload            ipc.invalid_payload
    │   ├── HandshakeRequired         ipc.handshake_required
    │   ├── VersionUnsupported        ipc.version_unsupported
    │   ├── UnknownMethod             ipc.unknown_method
    │   ├── DuplicateId               ipc.duplicate_id
    │   ├── ReadTimeout               ipc.read_timeout
    │   ├── TooManyConnections        ipc.too_many_connections
    │   ├── PeerRejected              ipc.peer_rejected
    │   ├── ConnectionClosed          ipc.connection_closed
    │   └── InternalError             ipc.internal
    ├── SandboxError                  sandbox.error
    │   ├── SandboxRunFailed          sandbox.run_failed
    │   ├── SandboxConfigError        sandbox.config_invalid
    │   └── SandboxStateError         sandbox.invalid_transition
    ├── AuditError                    audit.error
    │   ├── AuditUnavailable          audit.unavailable
    │   └── AuditQueryError           audit.query_invalid
    ├── KernelError                   kernel.error
    │   ├── KernelNotRunning          kernel.not_running
    │   ├── KernelStartFailed         kernel.start_failed
    │   └── KernelOverloaded          kernel.overloaded
    ├── WorkflowError                 workflow.error
    │   ├── TransitionDenied          workflow.transition_denied
    │   ├── ExemptionDenied           workflow.exemption_denied
    │   │   ├── ExemptionPending      workflow.exemption_pending
    │   │   └── ExemptionMismatch     workflow.exemption_mismatch
    │   ├── ModeDenied                workflow.mode_denied
    │   ├── SessionNotFound           workflow.session_not_found
    │   ├── EvidenceError             workflow.evidence_invalid
    │   ├── CoverageFormatError       workflow.coverage_invalid
    │   ├── TurnRunning               ai.turn_running
    │   └── Quarantined               ai.quarantined
    ├── AiError                       ai.error
    │   └── ProviderFailed            ai.provider_failed
    │       ├── ProviderBusy          ai.provider_busy
    │       └── ContextTooLong        ai.context_too_long
    ├── ToolError                     tool.error
    │   ├── ToolUnavailable           tool.unavailable
    │   ├── ToolNotFound              tool.not_found
    │   ├── ToolInputInvalid          tool.input_invalid
    │   ├── ToolFailed                tool.failed
    │   ├── ToolRefused               tool.refused
    │   ├── ToolTransient             tool.transient
    │   │   └── SandboxExited         tool.sandbox_exited
    │   ├── ToolTimeout               tool.timeout
    │   └── CircuitOpen               tool.circuit_open
    ├── PluginError                   plugin.error
    │   ├── PluginManifestInvalid     plugin.manifest_invalid
    │   ├── PluginManifestYaml        plugin.manifest_yaml
    │   ├── PluginRejected            plugin.rejected
    │   ├── PluginInstallRefused      plugin.install_refused
    │   ├── PluginNotFound            plugin.not_found
    │   ├── PluginStateError          plugin.invalid_transition
    │   ├── PluginTampered            plugin.tampered
    │   ├── PluginIncompatible        plugin.api_incompatible
    │   ├── PluginNotConfirmed        plugin.not_confirmed
    │   └── PluginInstallDenied       plugin.install_denied
    ├── McpError                      mcp.error
    │   ├── McpServerInvalid          mcp.server_invalid
    │   ├── McpServerNotFound         mcp.not_found
    │   └── McpServerFailed           mcp.server_failed
    ├── MergeError                    merge.error
    │   ├── PatchRejected             merge.patch_rejected
    │   ├── MergeRefused              merge.refused
    │   └── MergeConflict             merge.conflict
    └── SchedulerError                scheduler.error
        ├── DependencyFailed          scheduler.dependency_failed
        └── TaskCancelled             scheduler.task_cancelled
"""

from __future__ import annotations

from typing import Any, ClassVar


class FluffyError(Exception):
    """Base of every error fluffy raises on purpose.

    ``what`` is the one-line headline; ``why`` and ``fix`` default to the class-level
    text so a raise site only says what is specific to it.
    """

    code: ClassVar[str] = "fluffy.error"
    default_why: ClassVar[str] = ""
    default_fix: ClassVar[str] = ""
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        what: str,
        *,
        why: str | None = None,
        fix: str | None = None,
        context: str | None = None,
    ) -> None:
        super().__init__(what)
        self.what = what
        self.why = why if why is not None else self.default_why
        self.fix = fix if fix is not None else self.default_fix
        self.context = context

    def with_context(self, context: str) -> FluffyError:
        """Prefix ``what`` with the caller's context ("cannot build kernel: ...")."""
        self.what = f"{context}: {self.what}"
        self.args = (self.what,)
        return self

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "code": self.code,
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
            "retryable": self.retryable,
        }
        if self.context:
            data["context"] = self.context
        return data


class ConfigError(FluffyError):
    code = "config.invalid"
    default_fix = "Correct the named setting and run the command again."


class EngineError(FluffyError):
    code = "engine.error"
    default_why = "the container engine's socket failed at the operating-system level"
    default_fix = "Check that the engine is running (`docker info` / `podman info`), then retry."


class EngineUnavailable(EngineError):
    code = "engine.unavailable"
    retryable = True
    default_why = "fluffy needs Docker or Podman: every sandbox is a container (no fallback mode)."
    default_fix = "Run `scripts/setup`, or start the engine (e.g. `sudo systemctl start docker`)."


class EngineOperationFailed(EngineError):
    code = "engine.operation_failed"


class EngineTimeout(EngineError):
    """The engine did not answer within the time fluffy allows for the call."""

    code = "engine.timeout"
    retryable = True


class EngineNotFound(EngineError):
    """The engine has no object (container, volume, image) of that name."""

    code = "engine.not_found"
    default_why = "it was removed, or never created (a crash, or another tool cleaned up)"
    default_fix = "Retry the operation; fluffy recreates what it needs."


class ImageNotFound(EngineNotFound):
    code = "engine.image_not_found"
    default_fix = "Run `fluffy images build` to build fluffy's images locally."


class ImageError(FluffyError):
    code = "image.error"


class BaseImageUnavailable(ImageError):
    code = "image.base_unavailable"


class WheelhouseError(ImageError):
    code = "image.wheelhouse_failed"
    default_why = "Python packages are downloaded on the host, then copied into the images."
    default_fix = "Check that `pip download` works on this host (index, proxy, CA), then retry."


class ImageBuildFailed(ImageError):
    code = "image.build_failed"
    default_why = "a step of the image's Dockerfile failed in the engine's build"
    default_fix = "Run `fluffy images build --verbose` to see every step's output."


class EnvironmentFailed(ImageError):
    """A project's test environment could not be built (``fluffy env build``)."""

    code = "env.build_failed"
    default_why = (
        "the project's dependencies are downloaded on this host and installed offline into "
        "an image FROM fluffy's code-executor image"
    )
    default_fix = "Run `fluffy env build --verbose` to see each step's output."


class PackageUnavailable(EnvironmentFailed):
    """A requirement has no wheel fluffy can install offline (e.g. an sdist only)."""

    code = "env.package_unavailable"


class SandboxError(FluffyError):
    code = "sandbox.error"


class SandboxRunFailed(SandboxError):
    code = "sandbox.run_failed"


class SandboxConfigError(SandboxError):
    code = "sandbox.config_invalid"
    default_why = "the sandbox's configuration breaks one of the container manager's rules"


class SandboxStateError(SandboxError):
    code = "sandbox.invalid_transition"
    default_why = "the sandbox lifecycle does not allow that step from its current state"
    default_fix = "This is a bug in fluffy; please report it with `fluffy doctor --json`."


class PolicyError(FluffyError):
    """A policy file (or a request to the policy engine) is malformed; blocks start-up."""

    code = "policy.invalid"
    default_fix = "Correct the policy file; `fluffy policy validate FILE` checks it."


class IpcError(FluffyError):
    """The IPC protocol refused a frame or a connection (codes are on the wire)."""

    code = "ipc.error"
    default_fix = "Follow docs/ipc.md: handshake first, one JSON message per length-prefixed frame."


class FrameEmpty(IpcError):
    code = "ipc.frame_empty"
    default_why = "a frame's length prefix was 0; every frame carries one JSON message"


class FrameTooLarge(IpcError):
    code = "ipc.frame_too_large"
    default_why = "the length prefix exceeds the server's maximum frame size"
    default_fix = "Send smaller messages (large contents go through output volumes)."


class FrameTruncated(IpcError):
    code = "ipc.frame_truncated"
    default_why = "the connection ended inside a frame"


class InvalidPayload(IpcError):
    code = "ipc.invalid_payload"
    default_why = "the frame is not valid UTF-8 JSON of the expected message shape"


class HandshakeRequired(IpcError):
    code = "ipc.handshake_required"
    default_why = "the first frame of every connection must be a handshake"
    default_fix = (
        'Send {"type": "handshake", "plugin_name", "plugin_version", "syscall_api_version"} first.'
    )


class VersionUnsupported(IpcError):
    code = "ipc.version_unsupported"
    default_fix = "Use a syscall API version inside the supported range, or upgrade."


class UnknownMethod(IpcError):
    code = "ipc.unknown_method"
    default_why = "the kernel's method table is closed; nothing was run"
    default_fix = "Call one of the methods the message lists (docs/ipc.md, method table)."


class DuplicateId(IpcError):
    code = "ipc.duplicate_id"
    default_why = "a request with the same id is still in flight on this connection"
    default_fix = "Give every request a fresh id (UUIDv4)."


class ReadTimeout(IpcError):
    code = "ipc.read_timeout"
    retryable = True
    default_why = "a frame did not arrive completely within the read deadline"


class TooManyConnections(IpcError):
    code = "ipc.too_many_connections"
    retryable = True
    default_why = "the server is at its connection limit"
    default_fix = "Close idle connections, or retry later."


class PeerRejected(IpcError):
    code = "ipc.peer_rejected"
    default_why = "the peer's credentials (SO_PEERCRED) are not allowed on this socket"
    default_fix = "Connect as the user this socket serves (a sandbox's socket serves that sandbox)."


class ConnectionClosed(IpcError):
    code = "ipc.connection_closed"
    retryable = True
    default_why = "the other side closed the connection"
    default_fix = "Reconnect (and handshake again)."


class InternalError(IpcError):
    code = "ipc.internal"
    retryable = True
    default_why = "the kernel failed while handling the request; it keeps serving"
    default_fix = "Retry; if it persists, report it with the kernel's log."


class AuditError(FluffyError):
    """The audit log could not be written or read."""

    code = "audit.error"
    default_fix = "Run `fluffy audit verify` to see the log's state."


class AuditUnavailable(AuditError):
    code = "audit.unavailable"
    retryable = True
    default_why = "the audit database could not be opened or written"
    default_fix = "Check the state folder's disk space and permissions, then retry."


class AuditQueryError(AuditError):
    code = "audit.query_invalid"
    default_why = "a filter of the audit query is malformed"
    default_fix = "See `fluffy audit log --help` for the filters and their formats."


class KernelError(FluffyError):
    """The project's kernel (L1) could not be reached, started or stopped."""

    code = "kernel.error"


class KernelNotRunning(KernelError):
    code = "kernel.not_running"
    default_why = "no bootstrap supervisor is running for this project"
    default_fix = "Start it with `fluffy start` in the project folder."


class KernelStartFailed(KernelError):
    code = "kernel.start_failed"
    default_fix = "Run `fluffy doctor`; the bootstrap's log is under ~/.fluffy/projects/."


class KernelOverloaded(KernelError):
    code = "kernel.overloaded"
    retryable = True
    default_why = "the kernel is above 80 % of its memory limit and takes no new work"
    default_fix = "Retry in a moment; finish or cancel running work to free memory."


class WorkflowError(FluffyError):
    """The TDD state machine refused something."""

    code = "workflow.error"


class TransitionDenied(WorkflowError):
    code = "workflow.transition_denied"
    default_why = "the workflow's guard for this transition does not hold"


class ExemptionDenied(WorkflowError):
    code = "workflow.exemption_denied"
    default_why = "the paths do not all match the category's tdd_exemptions globs in policy.yaml"
    default_fix = "Follow the normal TDD flow, or ask for the category whose globs match."


class ExemptionPending(ExemptionDenied):
    code = "workflow.exemption_pending"
    default_why = (
        "one exemption request waits at a time, so the user decides on the request they "
        "were shown and no later request can take its place"
    )
    default_fix = "Wait for the user's answer to the request that waits, then ask again."


class ExemptionMismatch(ExemptionDenied):
    code = "workflow.exemption_mismatch"
    default_why = "a decision names the request it answers, and another request waits"
    default_fix = "Look at the request that waits and decide on it by its id."


class ModeDenied(WorkflowError):
    code = "workflow.mode_denied"
    default_why = "the policy engine did not allow the mode change"


class SessionNotFound(WorkflowError):
    code = "workflow.session_not_found"
    default_fix = "List sessions with `fluffy session list`."


class EvidenceError(WorkflowError):
    code = "workflow.evidence_invalid"
    default_why = "a test run's report could not be read"
    default_fix = "Run the tests again through test.run."


class CoverageFormatError(WorkflowError):
    code = "workflow.coverage_invalid"
    default_why = "the coverage report is not coverage.py JSON, Cobertura XML or lcov"
    default_fix = "Produce coverage with `pytest --cov --cov-report=json` (or xml / lcov)."


class TurnRunning(WorkflowError):
    code = "ai.turn_running"
    default_why = "a session works on one task at a time"
    default_fix = "Wait for it to finish (or cancel it with Ctrl-C / session.cancel)."


class Quarantined(WorkflowError):
    code = "ai.quarantined"
    default_why = "too many of the session's tool calls were refused"
    default_fix = "Look at what was refused (fluffy audit log), then lift it with /unquarantine."


class AiError(FluffyError):
    code = "ai.error"
    default_why = "the AI session could not go on"


class ProviderFailed(AiError):
    code = "ai.provider_failed"
    default_why = "the AI provider's request failed"
    default_fix = "Check the provider settings (fluffy config show) and try again."


class ProviderBusy(ProviderFailed):
    """A failure a later attempt may fix: rate limit, overload, 5xx, a dropped connection.

    ``kind`` is the sandbox's classification; ``retry_after_s`` the wait the provider
    asked for (None: it named none).  The kernel's retry policy reads both (ADR-044).
    """

    code = "ai.provider_busy"
    retryable = True

    def __init__(
        self,
        what: str,
        *,
        why: str | None = None,
        fix: str | None = None,
        kind: str = "server",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(what, why=why, fix=fix)
        self.kind = kind
        self.retry_after_s = retry_after_s


class ContextTooLong(ProviderFailed):
    """The provider refused the prompt: it does not fit the model's context window."""

    code = "ai.context_too_long"
    default_why = "the provider refused the prompt as longer than the model's context window"
    default_fix = (
        "Start a new session, or set context_window to the model's real window "
        "(`fluffy config set context_window N`)."
    )


class ToolError(FluffyError):
    """A tool call could not be carried out (the AI sees it as the tool's result)."""

    code = "tool.error"


class ToolUnavailable(ToolError):
    """The design's ToolUnavailableError: the tool exists but not in this state."""

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
            error="tool_unavailable",
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


class SchedulerError(FluffyError):
    code = "scheduler.error"


class DependencyFailed(SchedulerError):
    code = "scheduler.dependency_failed"
    default_why = "a task it depends on failed; dependent tasks are never retried automatically"


class TaskCancelled(SchedulerError):
    code = "scheduler.task_cancelled"
    default_why = "the task was cancelled before it finished"


def all_error_classes() -> list[type[FluffyError]]:
    """Every class of the tree, base first (used by tests and docs)."""
    seen: list[type[FluffyError]] = []
    stack: list[type[FluffyError]] = [FluffyError]
    while stack:
        cls = stack.pop(0)
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen


class PluginError(FluffyError):
    code = "plugin.error"


class PluginManifestInvalid(PluginError):
    """The manifest does not match the schema; ``what`` names every field and reason."""

    code = "plugin.manifest_invalid"
    default_why = "a plugin's manifest.yaml is checked field by field before anything is installed"
    default_fix = (
        "Correct the named field(s) in the plugin's manifest.yaml "
        "(examples/plugins/lint-tool/manifest.yaml is a complete example)."
    )


class PluginManifestYaml(PluginError):
    code = "plugin.manifest_yaml"
    default_why = "manifest.yaml must be one YAML mapping (safe YAML: no tags, no aliases)"
    default_fix = "Fix the YAML syntax at the line shown."


class PluginRejected(PluginError):
    """Registration refused it (REJECTED): duplicate names, API version, reserved tags..."""

    code = "plugin.rejected"
    default_fix = (
        "Change the plugin as the reason says; `fluffy plugin list --rejected` keeps the reason."
    )


class PluginInstallRefused(PluginError):
    """The plugin folder holds something the store does not copy (links, devices, huge files)."""

    code = "plugin.install_refused"
    default_why = "the store copies plain files only, within size limits, and hashes each one"
    default_fix = "Remove the named entry from the plugin folder and install again."


class PluginNotFound(PluginError):
    code = "plugin.not_found"
    default_fix = "`fluffy plugin list` shows the installed plugins."


class PluginStateError(PluginError):
    code = "plugin.invalid_transition"
    default_why = (
        "plugins move DISCOVERED -> REGISTERED | REJECTED, REGISTERED -> LOADED -> ACTIVE -> "
        "UNLOADED, and to DISABLED (by the user, policy or a runtime error)"
    )


class PluginTampered(PluginError):
    code = "plugin.tampered"
    default_why = "a plugin's files must match the SHA-256 hashes recorded when it was installed"
    default_fix = (
        "Reinstall the plugin from its source: `fluffy plugin remove NAME`, then "
        "`fluffy plugin install PATH`."
    )


class PluginIncompatible(PluginError):
    code = "plugin.api_incompatible"
    default_fix = "Install a version of the plugin written for this kernel's syscall API."


class PluginNotConfirmed(PluginError):
    code = "plugin.not_confirmed"
    default_why = "installing a third-party plugin needs the user's review (require_review)"
    default_fix = "Run it on a terminal and answer yes, or pass --yes to confirm up front."


class PluginInstallDenied(PluginError):
    """The kernel refused to install: the caller is not the user's CLI, or policy denies it."""

    code = "plugin.install_denied"
    default_why = (
        "a running kernel installs plugins only for the user's CLI (its own socket), "
        "after review, and only where the policy does not deny plugin.install"
    )
    default_fix = "Install from the CLI on the host: `fluffy plugin install PATH`."


class McpError(FluffyError):
    code = "mcp.error"


class McpServerInvalid(McpError):
    """A server's registration (name, command, packages, folder or record) is refused."""

    code = "mcp.server_invalid"
    default_why = (
        "an MCP server is registered with a name, a command and where its code comes from "
        "(--pip packages or a --path folder); each is checked before anything is recorded"
    )
    default_fix = "Correct the named part and run `fluffy mcp add` again."


class McpServerNotFound(McpError):
    code = "mcp.not_found"
    default_fix = "`fluffy mcp list` shows the project's MCP servers."


class McpServerFailed(McpError):
    """The server's sandbox did not start, or the server exited or broke the protocol."""

    code = "mcp.server_failed"
    retryable = True
    default_why = "an MCP server runs in its own sandbox; the kernel restarts it on the next call"
    default_fix = (
        "Retry; if it keeps failing, check the server with `fluffy mcp list` and its "
        "command (`fluffy mcp add NAME ... -- CMD`)."
    )
