"""`fluffy` with no arguments: bring the project's kernel up if needed, connect, and talk.

If no kernel runs for the current project, the bootstrap starts in the *foreground*, as
this process's child: it supervises L1 for as long as you stay, and leaving stops the
kernel cleanly.  A kernel started earlier with `fluffy start` is joined and left running.
The session shown is the latest one (created if there is none).

With a terminal, a prompt (prompt_toolkit: history, completion of slash commands) takes
/status, /strict, /explore, /debug, /help and /quit.  Tasks for the AI arrive with the
provider module ([8/9]); until then `fluffy demo --session` plays a scripted one.
Without a terminal, `fluffy` shows the status line and leaves.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from rich.markup import escape

from fluffy.cli.render import status_word, stdout
from fluffy.errors import FluffyError

COMMANDS = {
    "/status": "kernel health, runtime, container, session, mode and state",
    "/strict": "switch the session to strict mode (TDD enforced)",
    "/explore": "switch to explore mode (tests optional; tech-debt budget applies)",
    "/debug": "switch to debug mode (you approve it by typing it)",
    "/help": "this list",
    "/quit": "leave (a kernel this fluffy started is stopped)",
}


@dataclass
class Reply:
    text: str
    quit: bool = False


def describe(status: dict[str, Any], session: dict[str, Any] | None) -> str:
    where = f"{status.get('runtime')}, container {str(status.get('container_id'))[:12]}"
    line = f"kernel {status.get('health')} ({where})"
    if session:
        line += (
            f"; session {session['session_id']}: mode {session['mode']}, state {session['state']}"
        )
    return line


def handle(line: str, client: Any, session_id: str, status: dict[str, Any]) -> Reply:
    """One line typed at the prompt (kept free of the terminal so it can be tested)."""
    text = line.strip()
    if not text:
        return Reply("")
    if text in ("/quit", "/exit"):
        return Reply("bye", quit=True)
    if text == "/help":
        return Reply("\n".join(f"{name:<9} {what}" for name, what in COMMANDS.items()))
    if text == "/status":
        session = client.call("session.get", {"session_id": session_id})
        return Reply(describe(status, session))
    if text in ("/strict", "/explore", "/debug"):
        mode = text[1:]
        try:
            session = client.call(
                "session.set_mode",
                {"session_id": session_id, "mode": mode, "approved": True},
            )
        except FluffyError as exc:
            return Reply(f"{exc.what} ({exc.why}) Fix: {exc.fix}")
        return Reply(f"mode {session['mode']}, state {session['state']}")
    if text.startswith("/"):
        return Reply(f"unknown command {text.split()[0]}; /help lists them")
    return Reply(
        "No AI provider is connected yet (it comes with the provider module, issue [8/9]); "
        "nothing was sent. `fluffy demo --session` plays a scripted task through this kernel."
    )


def run(project: str, *, interactive: bool | None = None) -> int:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli.lifecycle import _status, launch_supervisor
    from fluffy.ipc.client import SyncClient
    from fluffy.paths import fluffy_home

    interactive = sys.stdin.isatty() if interactive is None else interactive
    owned: subprocess.Popen[bytes] | None = None
    status = _status(project)
    if status is None or status.get("health") != "healthy":
        stdout.print(f"starting the kernel for {escape(project)} ...")
        status, owned = launch_supervisor(project, detach=False)
    sock = paths(fluffy_home(), project)["run"] / "kernel.sock"
    try:
        with SyncClient(str(sock), timeout=30) as client:
            session = client.call("session.get") or client.call("session.create")
            stdout.print(f"{status_word('ok')} {escape(describe(status, session))}")
            if owned is not None:
                stdout.print("  (started for this session: leaving stops it)")
            if interactive:
                _loop(client, session["session_id"], status)
    finally:
        if owned is not None:
            owned.send_signal(signal.SIGTERM)  # the supervisor stops L1 cleanly
            owned.wait(timeout=90)
    return 0


def _loop(client: Any, session_id: str, status: dict[str, Any]) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import FileHistory

    from fluffy.paths import fluffy_home

    prompt: PromptSession[str] = PromptSession(
        history=FileHistory(str(fluffy_home() / "history")),
        completer=WordCompleter(list(COMMANDS), sentence=True),
    )
    stdout.print("type /help for the commands, /quit to leave")
    while True:
        try:
            line = prompt.prompt("fluffy> ")
        except (EOFError, KeyboardInterrupt):
            return
        reply = handle(line, client, session_id, status)
        if reply.text:
            stdout.print(escape(reply.text))
        if reply.quit:
            return
