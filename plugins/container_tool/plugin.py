"""The container tool plugin: ``container.run`` runs one command the model asked for, in
this sandbox (debug mode; design: "Same as explore, plus container.run allowed via
require_review").

The kernel has already had the person's yes (or a policy rule's) for exactly this argv,
and mounted the session's view read-only at ``/workspace`` with the project's test
environment, in a fresh code-executor sandbox: no network, the template's limits.  Here
the command runs once, without a shell (``sh -c`` is a command like any other, and the
person saw it), in its own process group: at its deadline, and when it ends, the whole
group is killed, so nothing it started outlives the call.

Its output (stdout and stderr interleaved, as on a terminal) is read as it comes and kept
bounded: the first :data:`HEAD_BYTES` and the last :data:`TAIL_BYTES`, with the count of
what was left out between them.  Control characters are made visible before the text
leaves the sandbox (:func:`fluffy.safetext.visible`), so neither the model nor the person
is shown anything the bytes are not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Any

from fluffy.errors import ToolInputInvalid
from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path
from fluffy.plugins.test_tool.plugin import run_environment
from fluffy.safetext import visible

HEAD_BYTES = 8 * 1024
TAIL_BYTES = 24 * 1024
MAX_TIMEOUT_S = 600
CHUNK = 64 * 1024

RUN = ToolDefinition(
    name="container.run",
    description="Debug mode only: run one command (an argv list, no shell; use "
    '["sh", "-c", "..."] for one) in a fresh sandbox with the project as this session '
    "sees it (read-only; /tmp is writable), the project's environment (python is its "
    "interpreter), no network and a time-out. The user reviews each command unless a "
    "policy rule allows it. Returns the exit code and the output (stdout and stderr "
    "together; long output keeps its start and end).",
    input_schema={
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string", "maxLength": 4096},
                "minItems": 1,
                "maxItems": 256,
                "description": 'The command and its arguments, e.g. ["python", "-m", "pkg"].',
            },
            "cwd": {
                "type": "string",
                "minLength": 1,
                "maxLength": 4096,
                "description": "A project folder to run in (default: the project's root).",
            },
            "timeout_s": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TIMEOUT_S,
                "default": 60,
            },
        },
        "required": ["argv"],
        "additionalProperties": False,
    },
    output_mode="full",
    read_only=True,
    truncation="tail",
    timeout_s=MAX_TIMEOUT_S + 60,
)


class _Output:
    """What a stream said, kept bounded: its head, its tail and how much was between."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > TAIL_BYTES:
            del self.tail[: len(self.tail) - TAIL_BYTES]

    def pump(self, stream: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := stream.read1(CHUNK):
                self.add(chunk)

    @property
    def left_out(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if self.left_out:
            head += f"\n[... {self.left_out} bytes of output not kept ...]\n"
        return visible(head + tail)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _folder(ctx: ToolContext, cwd: object) -> str:
    if cwd is None:
        return str(ctx.workspace)
    rel = normalise_path(str(cwd))
    folder = ctx.workspace / rel if rel else ctx.workspace
    if not folder.is_dir():
        raise ToolInputInvalid(
            f"container.run: {cwd!r} is not a folder of the project",
            fix="Give a project folder as cwd (or leave it out to run at the root).",
        )
    return str(folder)


def run_command(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``args['argv']`` with the environment the project's tests get (its interpreter
    first on PATH, a terminal's variables), added to the sandbox's scrubbed one."""
    _, env = run_environment(ctx)
    argv = [str(a) for a in args["argv"]]
    timeout_s = min(int(args.get("timeout_s", 60)), MAX_TIMEOUT_S)
    cwd = _folder(ctx, args.get("cwd"))
    started = time.monotonic()
    try:
        process = subprocess.Popen(  # the reviewed argv, no shell, in the sandbox
            argv,
            cwd=cwd,
            env={**ctx.env, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole at the end
            close_fds=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError, OSError) as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126  # as a shell says it
        said = "no such program" if code == 127 else f"cannot run it ({exc.strerror or exc})"
        return {
            "argv": argv,
            "exit_code": code,
            "timed_out": False,
            "duration_s": round(time.monotonic() - started, 3),
            "output": visible(f"fluffy: {argv[0]}: {said} in this sandbox\n"),
            "output_bytes": 0,
            "truncated": False,
        }
    output = _Output()
    reader = threading.Thread(target=output.pump, args=(process.stdout,), daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process.pid)  # what it left running in the background dies with it
        process.wait()
    reader.join(timeout=5)  # a grandchild in a session of its own may hold the pipe
    assert process.stdout is not None
    with contextlib.suppress(OSError):
        process.stdout.close()
    answer: dict[str, Any] = {
        "argv": argv,
        "exit_code": process.returncode,
        "timed_out": timed_out,
        "duration_s": round(time.monotonic() - started, 3),
        "output": output.text(),
        "output_bytes": output.total,
        "truncated": output.left_out > 0,
    }
    if process.returncode < 0:
        with contextlib.suppress(ValueError):
            answer["signal"] = signal.Signals(-process.returncode).name
    if timed_out:
        answer["note"] = (
            f"stopped after {timeout_s} s (its time-out); a larger timeout_s is allowed"
        )
    return answer


class ContainerTool(ToolPlugin):
    name = "container-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [RUN]

    def handlers(self) -> dict[str, Handler]:
        return {"container.run": run_command}


PLUGIN = ContainerTool()
