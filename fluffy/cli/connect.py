"""What `fluffy "task"`, the prompt and `fluffy session` share: the kernel, settings, mode.

* :func:`attached` joins the project's running kernel, or starts its bootstrap for as
  long as the command runs and stops it after (a kernel from `fluffy start` is left
  running).  The bootstrap gets its own process group, so Ctrl-C at the terminal
  reaches only the CLI (which cancels the turn) and not the kernel's supervisor.
* :func:`settings_for` and :func:`script_turns` are the one place each that calls the
  settings module and the scripted provider's loader.
* :func:`apply_mode` changes a session's mode; debug mode needs the person's yes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from fluffy.errors import ConfigError, ModeDenied, SessionNotFound
from fluffy.settings import DEFAULT_MODELS, PRESETS, api_key

if TYPE_CHECKING:
    from fluffy.settings import Settings

Confirm = Callable[[str], bool]
CALL_TIMEOUT_S = 120.0  # one IPC call (approving a review merges and commits)


@dataclass
class Attached:
    project: str
    status: dict[str, Any]
    client: Any  # fluffy.ipc.client.SyncClient
    owned: bool  # this command started the kernel and stops it when done


def settings_for(project: Path, cli: dict[str, Any]) -> Settings:
    """The configuration hierarchy (CLI > env > project > user > defaults)."""
    from fluffy.settings import load_settings

    return load_settings(project, cli)


def script_turns(path: str) -> list[dict[str, Any]]:
    """The scripted provider's turns, read and validated by the kernel's own loader."""
    from fluffy.host.sessions import load_turns

    return list(load_turns(Path(path)))


def detected_provider(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The provider to use: as configured, or — when nothing chose one — the one whose API
    key (or a base URL: an OpenAI-compatible server such as Ollama) is in the environment."""
    env = os.environ if env is None else env
    if settings.sources.get("provider", "default") != "default":
        return settings.provider
    if env.get("OPENAI_API_KEY") or settings.base_url:
        return "openai"
    if env.get("ANTHROPIC_API_KEY"):
        return "anthropic"
    return settings.provider


def message_options(
    settings: Settings, turns: list[dict[str, Any]] | None, *, detect: bool = True
) -> dict[str, Any]:
    """``session.message``'s provider and round limit (the key stays in the kernel's memory)."""
    name = detected_provider(settings) if detect and turns is None else settings.provider
    model = settings.model
    if name != settings.provider:
        if settings.sources.get("model", "default").startswith("default"):
            model = DEFAULT_MODELS.get(name, "")
        settings = settings.model_copy(update={"provider": name})
    if name == "scripted" and turns is None:
        raise ConfigError(
            "no AI provider is set up, and the scripted provider has no script",
            why="the offline scripted provider replays a YAML script of tool calls",
            fix="Set OPENAI_API_KEY or ANTHROPIC_API_KEY (or --base-url for a local "
            "OpenAI-compatible server such as Ollama), or pass --script FILE "
            "(see examples/sessions/).",
        )
    preset = PRESETS.get(name)
    provider: dict[str, Any] = {
        "name": preset.wire if preset is not None else name,
        "model": model,
        "base_url": settings.base_url or (preset.base_url if preset is not None else ""),
        "api_key": api_key(settings) or "",
        "context_window": settings.context_window,
        "max_retries": settings.max_retries,
        "retry_max_wait_s": settings.retry_max_wait_s,
    }
    if turns is not None:
        provider["turns"] = turns
    else:
        from fluffy.cli.endpoint import guard_project_endpoint

        guard_project_endpoint(settings, provider["api_key"], ask, provider["base_url"])
    options: dict[str, Any] = {"provider": provider, "max_rounds": settings.max_rounds}
    options["commit_trailer"] = settings.commit_trailer.replace("{model}", model or name)
    return options


def ask(question: str) -> bool:
    """A yes/no question on the terminal; no terminal (or end of input) means no."""
    if not sys.stdin.isatty():
        return False
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


#: What a held call's question takes (``fluffy "task"``): the prompt's spellings too.
CALL_REPLIES = {
    **dict.fromkeys(("y", "yes", "once", "/approve"), "approve"),
    **dict.fromkeys(("a", "all", "/approve all"), "approve_session"),
}


def ask_call(question: str) -> str:
    """Allow a held call once, for the session, or not: ``approve``, ``approve_session``
    or ``reject`` (no terminal, end of input or anything else is no)."""
    if not sys.stdin.isatty():
        return "reject"
    try:
        reply = input(f"{question} [y]es once, [a]ll this session, [N]o: ")
    except EOFError:
        return "reject"
    return CALL_REPLIES.get(" ".join(reply.strip().lower().split()), "reject")


def approve_mode(mode: str | None, *, yes: bool, confirm: Confirm | None) -> None:
    """Debug mode needs the person's yes: ``--yes``, or the question answered with y.

    Without a terminal (``confirm`` None) and without ``--yes`` it is refused here,
    before the kernel is asked (or even started).
    """
    if mode != "debug" or yes:
        return
    if confirm is None:
        raise ModeDenied(
            "debug mode needs your approval",
            why="there is no terminal to ask on, and --yes was not given",
            fix="Run the command on a terminal and answer y, or add --yes to approve it.",
        )
    if not confirm("Debug mode needs your approval: allow?"):
        raise ModeDenied(
            "debug mode was not approved",
            why="you answered no; the session keeps its mode",
            fix="Use --mode strict or --mode explore, or approve debug mode.",
        )


def apply_mode(
    client: Any,
    session: dict[str, Any],
    mode: str | None,
    *,
    yes: bool,
    confirm: Confirm | None,
) -> dict[str, Any]:
    """Switch ``session`` to ``mode``; the kernel's policy still decides."""
    if not mode or mode == session.get("mode"):
        return session
    approve_mode(mode, yes=yes, confirm=confirm)
    result: dict[str, Any] = client.call(
        "session.set_mode",
        {"session_id": session["session_id"], "mode": mode, "approved": True},
    )
    return result


def get_session(client: Any, session_id: str) -> dict[str, Any]:
    """The named session; an error naming `fluffy session list` if there is none."""
    found: dict[str, Any] | None = client.call("session.get", {"session_id": session_id})
    if found is None:
        raise SessionNotFound(
            f"there is no session {session_id}",
            why="the kernel for this project has no session with that id",
        )
    return found


@contextmanager
def attached(project: str, *, say: Callable[[str], None], yes: bool = False) -> Iterator[Attached]:
    """A connection to the project's kernel, started (and later stopped) if needed;
    ``yes``: start-up's questions are answered yes (``--yes``)."""
    from fluffy.cli.lifecycle import _status, approver, launch_supervisor
    from fluffy.ipc.client import SyncClient
    from fluffy.paths import project_socket

    owned: subprocess.Popen[bytes] | None = None
    status = _status(project)
    if status is None or status.get("health") != "healthy":
        say(f"starting the kernel for {project} ...")
        status, owned = launch_supervisor(project, detach=True, confirm=approver(yes))
    previous = _stop_on_hangup() if owned is not None else {}
    sock = project_socket(project)
    try:
        with SyncClient(str(sock), timeout=CALL_TIMEOUT_S) as client:
            yield Attached(project, status, client, owned is not None)
    finally:
        if owned is not None:
            owned.send_signal(signal.SIGTERM)  # the supervisor stops L1 cleanly
            owned.wait(timeout=90)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop_on_hangup() -> dict[int, Any]:
    """A closed terminal or a kill still stops the kernel this command started."""

    def leave(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    return {sig: signal.signal(sig, leave) for sig in (signal.SIGHUP, signal.SIGTERM)}


def git_identity(project: Path) -> dict[str, str] | None:
    """The person's git identity for the project (its configuration, then the global
    one, as `git commit` reads them), for the AI's commits; None when git has none."""
    found: dict[str, str] = {}
    for key in ("name", "email"):
        try:
            done = subprocess.run(
                # the project may be another user's (root at a user's clone): its own
                # configuration is read as git commit would read it, as data only
                ["git", "-c", "core.fsmonitor=false", "-c", f"safe.directory={project}",
                 "-C", str(project), "config", "--get", f"user.{key}"],
                capture_output=True, text=True, timeout=10, check=False, cwd="/",
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        value = done.stdout.strip()
        if done.returncode != 0 or not value or any(c in value for c in "<>\n\r\0"):
            return None
        found[key] = value[:254]
    return found
