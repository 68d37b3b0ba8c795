"""Running programs from a tool: argument lists only, a scrubbed environment, a deadline.

:func:`run_command` never uses a shell: a command is a list of arguments, and a string
is refused with a :class:`TypeError` that says so.  Each command runs in its own process
group; on timeout the whole group is killed (children included).  The environment a
tool sees is the host's, scrubbed to :data:`ENV_ALLOW` (:func:`scrubbed`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from fluffy.errors import ToolFailed

#: The only variables the plugin host (and so every tool and command) keeps.
ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "HOME",
    "TMPDIR",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PYTHONHASHSEED",
    "TZ",
)
DEFAULT_HOME = "/tmp"  # noqa: S108 - the sandbox's only writable scratch space


def scrubbed(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` cut down to :data:`ENV_ALLOW`, with ``HOME`` defaulting to /tmp."""
    kept = {name: environ[name] for name in ENV_ALLOW if name in environ}
    kept.setdefault("HOME", DEFAULT_HOME)
    return kept


def scrub_environment() -> None:
    """Cut this process's own environment down to :data:`ENV_ALLOW` (in place)."""
    kept = scrubbed(os.environ)
    os.environ.clear()
    os.environ.update(kept)


class RunResult(msgspec.Struct, frozen=True):
    """What a command did.  ``exit_code`` is negative when a signal ended it.

    A frozen msgspec Struct (since 2026-11-30; a dataclass before): copy or convert it
    with ``msgspec.structs.replace`` / ``asdict``, not ``dataclasses``' or ``vars()``."""

    command: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def check_command(command: object) -> list[str]:
    """``command`` as a list of strings, or TypeError (a string is never accepted)."""
    if isinstance(command, str | bytes):
        raise TypeError(
            f"run() takes a list of arguments, not a string ({command!r}): tools never use a "
            "shell. Write ['git', 'status'] rather than 'git status'."
        )
    if not isinstance(command, Sequence) or not command:
        raise TypeError("run() takes a non-empty list of arguments, e.g. ['git', 'status']")
    args: list[str] = []
    for arg in command:
        if isinstance(arg, os.PathLike):
            arg = os.fspath(arg)
        if not isinstance(arg, str):
            raise TypeError(f"run() arguments must be strings, got {type(arg).__name__}")
        args.append(arg)
    return args


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def run_command(
    command: Sequence[str],
    *,
    cwd: str | Path | None,
    timeout_s: float,
    env: Mapping[str, str],
    input: str | bytes | None = None,
) -> RunResult:
    """Run ``command`` (no shell) and wait at most ``timeout_s`` seconds for it."""
    args = check_command(command)
    data = input.encode("utf-8") if isinstance(input, str) else input
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            args,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills all of it
            close_fds=True,
        )
    except FileNotFoundError:
        raise ToolFailed(
            f"cannot run {args[0]!r}: no such program in this sandbox",
            why="the program is not installed in the sandbox image, or not on PATH",
            fix="Use a program the code-executor image has (python3, git, pytest).",
        ) from None
    timed_out = False
    try:
        out, err = process.communicate(data, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        try:
            out, err = process.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a grandchild in its own session holds a pipe
            process.kill()
            out, err = b"", b""
    finally:
        _kill_group(process)  # leftovers of a finished command die with it
        if process.poll() is None:
            process.kill()
            process.wait()
    return RunResult(
        command=tuple(args),
        exit_code=process.returncode,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )
