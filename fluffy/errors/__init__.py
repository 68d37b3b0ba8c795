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
    │   ├── KernelAlreadyRunning      kernel.already_running
    │   ├── KernelCrashLoop           kernel.crash_loop
    │   └── KernelOverloaded          kernel.overloaded
    ├── WorkflowError                 workflow.error
    │   ├── TransitionDenied          workflow.transition_denied
    │   ├── ExemptionDenied           workflow.exemption_denied
    │   │   ├── ExemptionPending      workflow.exemption_pending
    │   │   └── ExemptionMismatch     workflow.exemption_mismatch
    │   ├── ModeDenied                workflow.mode_denied
    │   ├── SessionNotFound           workflow.session_not_found
    │   ├── EvidenceError             workflow.evidence_invalid
    │   └── CoverageFormatError       workflow.coverage_invalid
    ├── AiError                       ai.error
    │   ├── TurnRunning               ai.turn_running
    │   ├── Quarantined               ai.quarantined
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

from fluffy.errors.ai import (
    AiError,
    ContextTooLong,
    ProviderBusy,
    ProviderFailed,
    Quarantined,
    TurnRunning,
)
from fluffy.errors.configuration import (
    ConfigError,
    PolicyError,
)
from fluffy.errors.containers import (
    BaseImageUnavailable,
    EngineError,
    EngineNotFound,
    EngineOperationFailed,
    EngineTimeout,
    EngineUnavailable,
    EnvironmentFailed,
    ImageBuildFailed,
    ImageError,
    ImageNotFound,
    PackageUnavailable,
    SandboxConfigError,
    SandboxError,
    SandboxRunFailed,
    SandboxStateError,
    WheelhouseError,
)
from fluffy.errors.ipc import (
    ConnectionClosed,
    DuplicateId,
    FrameEmpty,
    FrameTooLarge,
    FrameTruncated,
    HandshakeRequired,
    InternalError,
    InvalidPayload,
    IpcError,
    PeerRejected,
    ReadTimeout,
    TooManyConnections,
    UnknownMethod,
    VersionUnsupported,
)
from fluffy.errors.kernel import (
    AuditError,
    AuditQueryError,
    AuditUnavailable,
    DependencyFailed,
    KernelAlreadyRunning,
    KernelCrashLoop,
    KernelError,
    KernelNotRunning,
    KernelOverloaded,
    KernelStartFailed,
    SchedulerError,
    TaskCancelled,
)
from fluffy.errors.plugins import (
    McpError,
    McpServerFailed,
    McpServerInvalid,
    McpServerNotFound,
    PluginError,
    PluginIncompatible,
    PluginInstallDenied,
    PluginInstallRefused,
    PluginManifestInvalid,
    PluginManifestYaml,
    PluginNotConfirmed,
    PluginNotFound,
    PluginRejected,
    PluginStateError,
    PluginTampered,
)
from fluffy.errors.tools import (
    CircuitOpen,
    MergeConflict,
    MergeError,
    MergeRefused,
    PatchRejected,
    SandboxExited,
    ToolError,
    ToolFailed,
    ToolInputInvalid,
    ToolNotFound,
    ToolRefused,
    ToolTimeout,
    ToolTransient,
    ToolUnavailable,
)
from fluffy.errors.tree import FluffyError, all_error_classes
from fluffy.errors.workflow import (
    CoverageFormatError,
    EvidenceError,
    ExemptionDenied,
    ExemptionMismatch,
    ExemptionPending,
    ModeDenied,
    SessionNotFound,
    TransitionDenied,
    WorkflowError,
)

__all__ = [
    "AiError",
    "AuditError",
    "AuditQueryError",
    "AuditUnavailable",
    "BaseImageUnavailable",
    "CircuitOpen",
    "ConfigError",
    "ConnectionClosed",
    "ContextTooLong",
    "CoverageFormatError",
    "DependencyFailed",
    "DuplicateId",
    "EngineError",
    "EngineNotFound",
    "EngineOperationFailed",
    "EngineTimeout",
    "EngineUnavailable",
    "EnvironmentFailed",
    "EvidenceError",
    "ExemptionDenied",
    "ExemptionMismatch",
    "ExemptionPending",
    "FluffyError",
    "FrameEmpty",
    "FrameTooLarge",
    "FrameTruncated",
    "HandshakeRequired",
    "ImageBuildFailed",
    "ImageError",
    "ImageNotFound",
    "InternalError",
    "InvalidPayload",
    "IpcError",
    "KernelAlreadyRunning",
    "KernelCrashLoop",
    "KernelError",
    "KernelNotRunning",
    "KernelOverloaded",
    "KernelStartFailed",
    "McpError",
    "McpServerFailed",
    "McpServerInvalid",
    "McpServerNotFound",
    "MergeConflict",
    "MergeError",
    "MergeRefused",
    "ModeDenied",
    "PackageUnavailable",
    "PatchRejected",
    "PeerRejected",
    "PluginError",
    "PluginIncompatible",
    "PluginInstallDenied",
    "PluginInstallRefused",
    "PluginManifestInvalid",
    "PluginManifestYaml",
    "PluginNotConfirmed",
    "PluginNotFound",
    "PluginRejected",
    "PluginStateError",
    "PluginTampered",
    "PolicyError",
    "ProviderBusy",
    "ProviderFailed",
    "Quarantined",
    "ReadTimeout",
    "SandboxConfigError",
    "SandboxError",
    "SandboxExited",
    "SandboxRunFailed",
    "SandboxStateError",
    "SchedulerError",
    "SessionNotFound",
    "TaskCancelled",
    "TooManyConnections",
    "ToolError",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolNotFound",
    "ToolRefused",
    "ToolTimeout",
    "ToolTransient",
    "ToolUnavailable",
    "TransitionDenied",
    "TurnRunning",
    "UnknownMethod",
    "VersionUnsupported",
    "WheelhouseError",
    "WorkflowError",
    "all_error_classes",
]
