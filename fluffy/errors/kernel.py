"""Errors of the kernel's own services: reaching it, the audit log, the scheduler."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


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


class KernelAlreadyRunning(KernelError):
    """A second bootstrap was started for a project whose kernel is supervised already."""

    code = "kernel.already_running"
    default_why = "one bootstrap supervises a project's kernel (it holds the project's lock file)"
    default_fix = "Use `fluffy status`, or `fluffy stop` first."


class KernelCrashLoop(KernelError):
    """The bootstrap gave up: the kernel failed more often than its restart budget allows."""

    code = "kernel.crash_loop"
    default_why = "the bootstrap restarts a failed kernel 3 times within 5 minutes, then stops"
    default_fix = "Read the kernel's output in the bootstrap's log and fix its cause."


class DuplicateSyscall(KernelStartFailed):
    """Two declarations of one IPC method name: a bug in the kernel, found at start-up."""

    code = "kernel.duplicate_syscall"
    default_why = "one declaration would shadow the other, so the kernel refuses to start"
    default_fix = "Keep one declaration of the method (a bug in fluffy: please report it)."


class KernelOverloaded(KernelError):
    code = "kernel.overloaded"
    retryable = True
    default_why = "the kernel is above 80 % of its memory limit and takes no new work"
    default_fix = "Retry in a moment; finish or cancel running work to free memory."


class SchedulerError(FluffyError):
    code = "scheduler.error"


class DependencyFailed(SchedulerError):
    code = "scheduler.dependency_failed"
    default_why = "a task it depends on failed; dependent tasks are never retried automatically"


class TaskCancelled(SchedulerError):
    code = "scheduler.task_cancelled"
    default_why = "the task was cancelled before it finished"
