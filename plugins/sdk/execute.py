"""One job of the kernel's ``tool.next``, run to the parameters of its ``tool.result``.

A job is ``{"call_id", "tool", "args", "session_mode", "sandbox_id"}`` and, for some
tools, the kernel's ``settings`` for the call (never the model's: e.g. test.run's
interpreter and test command).  The reply is
``{"call_id", "ok": true, "result": {...}}`` or ``{"call_id", "ok": false, "error":
{"code", "message", "retryable"}}``, where ``message`` reads "what (why) Fix: ...".
Errors map so: a fluffy error keeps its code; a ValueError (a refused path, text that
is not UTF-8) is ``tool.input_invalid``; anything else is ``tool.failed`` with the
exception's text, its traceback going to stderr only.  A tool that may change files gets
``"changes"`` (from the context) added to its result; every reply carries
``duration_ms``.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import msgspec

from fluffy.errors import FluffyError, ToolFailed, ToolInputInvalid, ToolNotFound
from fluffy.ipc.protocol import error_body
from fluffy.plugins.sdk.context import SESSION_MODES, ToolContext, check_call_id
from fluffy.plugins.sdk.definition import BoundTool
from fluffy.plugins.sdk.view import ProjectView

#: A result must fit one IPC frame (4 MiB) with room to spare.
MAX_RESULT_BYTES = 3 * 1024 * 1024


class Roots(msgspec.Struct, frozen=True):
    """Where the sandbox mounts the project, the staged changes and the output area
    (a frozen msgspec Struct since 2026-11-30: ``msgspec.structs.replace`` changes one)."""

    workspace: Path = Path("/workspace")
    staged: Path = Path("/staged")
    output: Path = Path("/output")


GENERIC_FIX = "Check the arguments against the tool's description, then call it again."


def failure(call_id: str, error: FluffyError) -> dict[str, Any]:
    """The ``tool.result`` of a failed call; the message always ends with a Fix."""
    if not error.fix:
        error.fix = GENERIC_FIX
    body = error_body(error)
    return {
        "call_id": call_id,
        "ok": False,
        "error": {"code": body.code, "message": body.message, "retryable": body.retryable},
    }


def as_tool_error(exc: BaseException, tool: str) -> FluffyError:
    if isinstance(exc, FluffyError):
        return exc
    if isinstance(exc, ValueError):
        return ToolInputInvalid(str(exc) or type(exc).__name__)
    return ToolFailed(
        f"{tool or 'the tool'} failed: {type(exc).__name__}: {exc}",
        fix="Check the arguments; if they are right, the plugin has a bug (its log has the "
        "traceback).",
    )


def _prepare(
    tools: Mapping[str, BoundTool],
    plugin_name: str,
    job: Any,
    roots: Roots,
    env: Mapping[str, str] | None,
) -> tuple[ToolContext, BoundTool, dict[str, Any]]:
    if not isinstance(job, dict):
        raise ToolInputInvalid(f"a job must be an object, got {type(job).__name__}")
    call_id = check_call_id(job.get("call_id"))
    name = job.get("tool")
    bound = tools.get(name) if isinstance(name, str) else None
    if bound is None:
        raise ToolNotFound(
            f"{name!r} is not a tool of plugin {plugin_name}",
            fix=f"This plugin's tools: {', '.join(sorted(tools))}.",
        )
    mode = job.get("session_mode", "strict")
    if mode not in SESSION_MODES:
        raise ToolInputInvalid(f"session_mode {mode!r} is not one of {', '.join(SESSION_MODES)}")
    sandbox_id = job.get("sandbox_id", "")
    if not isinstance(sandbox_id, str):
        raise ToolInputInvalid("sandbox_id must be a string")
    args = bound.definition.validate({} if job.get("args") is None else job["args"])
    settings = job.get("settings") or {}
    if not isinstance(settings, dict):
        raise ToolInputInvalid("settings must be an object")
    definition = bound.definition
    context = ToolContext(
        call_id=call_id,
        view=ProjectView(roots.workspace, roots.staged),
        output=roots.output,
        sandbox_id=sandbox_id,
        plugin_name=plugin_name,
        session_mode=mode,
        env=env,
        tool_name=definition.name,
        timeout_s=definition.timeout_s,
        read_only=definition.read_only,
        settings=settings,
    )
    return context, bound, args


def execute_job(
    tools: Mapping[str, BoundTool],
    plugin_name: str,
    job: Any,
    roots: Roots,
    *,
    env: Mapping[str, str] | None = None,
    log: TextIO | None = None,
) -> dict[str, Any]:
    """Run ``job`` with the matching tool; the ``tool.result`` parameters (never raises).

    The reply also carries ``duration_ms``, the time the job took in the host.
    """
    started = time.perf_counter()
    reply = _execute(tools, plugin_name, job, roots, env, log)
    reply["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return reply


def _execute(
    tools: Mapping[str, BoundTool],
    plugin_name: str,
    job: Any,
    roots: Roots,
    env: Mapping[str, str] | None,
    log: TextIO | None,
) -> dict[str, Any]:
    raw_id = job.get("call_id") if isinstance(job, dict) else None
    call_id = raw_id if isinstance(raw_id, str) else ""
    name = job.get("tool") if isinstance(job, dict) else None
    tool = name if isinstance(name, str) else ""
    try:
        context, bound, args = _prepare(tools, plugin_name, job, roots, env)
    except (FluffyError, ValueError, OSError) as exc:
        return failure(call_id, as_tool_error(exc, tool))
    try:
        result = bound.handler(context, args)
        return {"call_id": call_id, "ok": True, "result": _finish(context, bound, result)}
    except (Exception, SystemExit) as exc:  # a handler's failure is the tool's result
        if not isinstance(exc, FluffyError):
            traceback.print_exc(file=log or sys.stderr)
        return failure(call_id, as_tool_error(exc, tool))


def _finish(context: ToolContext, bound: BoundTool, result: Any) -> dict[str, Any]:
    name = bound.definition.name
    if result is None:
        result = {}
    if not isinstance(result, Mapping):
        raise ToolFailed(
            f"{name} returned a {type(result).__name__}, not a dict (plugin bug)",
            fix="Return a dict (or None) from the handler.",
        )
    data = dict(result)
    if "changes" in data:
        raise ToolFailed(
            f"{name} set 'changes' in its result (plugin bug)",
            fix="Emit changes with ctx.emit_patch/emit_full/emit_delete; the host lists them.",
        )
    changes = context.changes
    if changes or not bound.definition.read_only:
        data["changes"] = changes
    try:
        size = len(msgspec.json.encode(data))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise ToolFailed(
            f"{name} returned a result that is not JSON: {exc}",
            fix="Return only dicts, lists, strings, numbers, booleans and None.",
        ) from None
    if size > MAX_RESULT_BYTES:
        raise ToolFailed(
            f"{name} returned {size} bytes, more than the {MAX_RESULT_BYTES} a result may have",
            fix="Write large output with ctx.write_file and return its name.",
        )
    return data
