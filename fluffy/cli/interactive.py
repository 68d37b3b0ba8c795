"""`fluffy` with no task: bring the project's kernel up if needed, connect, and talk.

If no kernel runs for the project, its bootstrap is started for as long as you stay, and
leaving stops the kernel cleanly; a kernel started earlier with `fluffy start` is joined
and left running.  The session is the latest one (created if there is none), or the one
`fluffy session resume ID` names.

With a terminal, a prompt (prompt_toolkit: history, completion of slash commands) shows
the session's mode and state (``[strict] [idle] > ``).  Plain text is a task for the AI
(``session.message``, then the turn's events as they come); slash commands change the
mode, show the budget, decide reviews, pin context.  A review that needs a person waits
at the prompt for /approve or /reject.  Ctrl-C during a turn cancels it; Ctrl-D leaves.
Without a terminal, `fluffy` shows the status line and leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy._version import __version__
from fluffy.cli import slash
from fluffy.cli.connect import Confirm, ask
from fluffy.cli.endpoint import allowlist_hint
from fluffy.cli.events import Asked, Ended, read
from fluffy.cli.exemption import granted_text, request_text
from fluffy.cli.project import env_for_task, first_run_block, init_project, show_project
from fluffy.cli.render import status_word, stdout, use_theme
from fluffy.cli.session_view import Renderer, SessionRenderer, error_fields, status_line
from fluffy.cli.turns import OnReview, cursor, follow
from fluffy.errors import ConfigError, FluffyError, ModeDenied
from fluffy.settings import Price

COMMANDS = slash.COMMANDS


@dataclass
class Reply:
    text: str
    quit: bool = False
    event: Ended | None = None  # where a task, or the turn after a decision, stopped
    session_id: str | None = None  # the prompt goes on in this session from now (/new)


def _leave_waiting(event: Asked) -> str | None:
    return None  # at the prompt, reviews are decided with /approve or /reject


@dataclass
class Context:
    """What a line needs besides the kernel: output, the provider, questions to the person."""

    renderer: Renderer = field(default_factory=lambda: SessionRenderer(stdout))
    options: dict[str, Any] | None = None  # session.message's provider, max_rounds (None: none)
    confirm: Confirm = ask
    on_review: OnReview = _leave_waiting
    after: int | None = None  # where this prompt's event stream stands
    #: The id of the AI's exemption request this prompt showed last (what /approve grants).
    exemption_shown: str | None = None
    #: (review id, tool) of a tool call held for review that this prompt showed (ADR-046).
    tool_shown: tuple[str, str] | None = None
    #: Before each task: the project's test environment, rebuilt if its files changed.
    prepare: Callable[[], None] | None = None
    #: The models' prices (settings ``prices``): /usage shows the cost with them.
    prices: Mapping[str, Price] = field(default_factory=dict)
    #: The mode a new session starts in (settings ``mode``; /new).
    mode: str | None = None


def _new_session(client: Any, ctx: Context) -> Reply:
    """/new: a fresh session (a new conversation); the previous one stays as it is."""
    from fluffy.cli.connect import apply_mode

    session = client.call("session.create")
    session = apply_mode(client, session, ctx.mode, yes=False, confirm=ctx.confirm)
    ctx.after, ctx.exemption_shown, ctx.tool_shown = None, None, None
    return Reply(
        f"new session {session['session_id']} ({session['mode']} mode): the AI starts "
        "without the previous conversation (`fluffy session resume ID` goes back to one)",
        session_id=str(session["session_id"]),
    )


def continuing(client: Any, session: dict[str, Any]) -> str | None:
    """The line that says the prompt continues an earlier conversation (None: there
    is none to continue)."""
    listed = client.call("session.list", {"limit": 1}).get("sessions") or []
    latest = listed[0] if listed else {}
    if latest.get("session_id") != session.get("session_id") or not latest.get("turns"):
        return None
    title = str(latest.get("title") or "").strip()
    turns = int(latest["turns"])
    about = f' ("{title}", {turns} task{"s" if turns != 1 else ""})' if title else ""
    return (
        f"continuing session {session['session_id']}{about}: the AI remembers that "
        "conversation; /new starts a fresh one"
    )


def describe(status: dict[str, Any], session: dict[str, Any] | None) -> str:
    where = f"{status.get('runtime')}, container {str(status.get('container_id'))[:12]}"
    line = f"kernel {status.get('health')} ({where})"
    if session:
        line += (
            f"; session {session['session_id']}: mode {session['mode']}, state {session['state']}"
        )
        if session.get("quarantined"):
            line += " (quarantined: read-only)"
    return line


MODE_FIX = "Switch to a mode policy.yaml allows (`fluffy config policy edit` changes it)."


def error_text(exc: FluffyError, fix: str = "") -> str:
    """The error display standard, as plain lines (``fix`` when the error has none)."""
    parts = error_fields(exc)
    lines = [f"ERROR: {parts.what}"]
    if parts.why:
        lines.append(f"Reason: {parts.why}")
    if parts.fix or fix:
        lines.append(f"Fix: {parts.fix or fix}")
    return "\n".join(lines)


def handle(
    line: str,
    client: Any,
    session_id: str,
    status: dict[str, Any],
    ctx: Context | None = None,
) -> Reply:
    """One line typed at the prompt (kept free of the terminal so it can be tested)."""
    ctx = ctx if ctx is not None else Context()
    text = line.strip()
    if not text:
        return Reply("")
    try:
        if text.startswith("/"):
            return _command(text, client, session_id, status, ctx)
        return _task(text, client, session_id, ctx)
    except FluffyError as exc:
        return Reply(error_text(exc))


def _command(
    text: str, client: Any, session_id: str, status: dict[str, Any], ctx: Context
) -> Reply:
    name, _, rest = text.partition(" ")
    rest = rest.strip()
    if name in ("/quit", "/exit"):
        return Reply("bye", quit=True)
    if name == "/new":
        return _new_session(client, ctx)
    if name == "/status":
        session = client.call("session.get", {"session_id": session_id})
        return Reply(describe(status, session) + "\n" + slash.instructions_text(client, session_id))
    if name in ("/approve", "/reject"):
        return _decide(name[1:], rest, client, session_id, ctx)
    if name == "/add-tests":
        return _decide("add_tests", rest, client, session_id, ctx)
    if name in ("/strict", "/explore", "/debug"):
        if name == "/debug" and not ctx.confirm("Debug mode needs your approval: allow?"):
            return Reply("debug mode not approved; the mode is unchanged")
        try:
            session = client.call(
                "session.set_mode",
                {"session_id": session_id, "mode": name[1:], "approved": True},
            )
        except ModeDenied as exc:
            return Reply(error_text(exc, MODE_FIX))
        return Reply(f"mode {session['mode']}, state {session['state']}")
    answer = slash.simple(name, rest, client, session_id, ctx.prices)
    if answer is None:
        return Reply(f"unknown command {name}; /help lists them")
    return Reply(answer)


def _task(text: str, client: Any, session_id: str, ctx: Context) -> Reply:
    if ctx.options is None:
        return Reply(
            "No AI provider is set up for this prompt; nothing was sent. "
            "Configure one (--provider, FLUFFY_PROVIDER or .fluffy/config.yaml)."
        )
    if ctx.prepare is not None:
        ctx.prepare()
    after = ctx.after if ctx.after is not None else cursor(client, session_id)
    started = client.call(
        "session.message",
        {**ctx.options, "session_id": session_id, "text": text, "auto_approve": False},
    )
    end = follow(
        client, session_id, after, ctx.renderer, on_review=ctx.on_review, turn_id=started["turn_id"]
    )
    _note_shown(ctx, end)
    ctx.after = end.next
    return Reply("", event=end)


def _decide(decision: str, reason: str, client: Any, session_id: str, ctx: Context) -> Reply:
    if ctx.tool_shown is None and decision in ("approve", "reject"):
        held = (client.call("tool.pending", {"session_id": session_id}) or {}).get("pending")
        if held:  # shown before this prompt joined (session resume): show it, then ask
            ctx.renderer.render(read({"type": "tool_review", "kernel_decides": False, **held}))
            ctx.tool_shown = (str(held.get("review_id")), str(held.get("tool")))
            return Reply(f"{held.get('tool')} waits for your answer (shown above): "
                         "/approve, /approve all or /reject [why]")  # fmt: skip
    if ctx.tool_shown is not None and decision in ("approve", "reject"):
        return _decide_call(decision, reason, client, session_id, ctx)
    session = client.call("session.get", {"session_id": session_id}) or {}
    pending = session.get("exemption_pending")
    if pending and decision in ("approve", "reject"):
        return _decide_exemption(decision == "approve", reason, client, session_id, ctx, pending)
    review = client.call("review.show", {"session_id": session_id})
    if not review:
        return Reply("nothing waits for your review")
    after = ctx.after if ctx.after is not None else cursor(client, session_id)
    params: dict[str, Any] = {"session_id": session_id, "plan_id": review["plan_id"]}
    if decision == "reject" and reason:
        params["reason"] = reason
    client.call(f"review.{decision}", params)
    # the turn goes on: show the rest of it (merge, commit, the AI's answer)
    end = follow(
        client, session_id, after, ctx.renderer, on_review=ctx.on_review, review_decided=True
    )
    _note_shown(ctx, end)
    ctx.after = end.next
    if decision == "add_tests":
        return Reply(f"asked for tests before merging plan {review['plan_id']}", event=end)
    word = "approved" if decision == "approve" else "rejected"
    return Reply(f"{word} plan {review['plan_id']}", event=end)


def _decide_call(decision: str, reason: str, client: Any, session_id: str, ctx: Context) -> Reply:
    """/approve (once), /approve all (for the session) or /reject [why] on a held call."""
    assert ctx.tool_shown is not None
    review_id, tool = ctx.tool_shown
    said = "allow" if decision == "approve" else "deny"
    if decision == "approve" and reason.lower() in ("all", "session", "always"):
        said = "allow_session"
    after = ctx.after if ctx.after is not None else cursor(client, session_id)
    params: dict[str, Any] = {"session_id": session_id, "review_id": review_id, "decision": said}
    if said == "deny" and reason:
        params["reason"] = reason
    client.call("tool.decide", params)
    ctx.tool_shown = None
    end = follow(
        client, session_id, after, ctx.renderer, on_review=ctx.on_review, review_decided=True
    )
    _note_shown(ctx, end)
    ctx.after = end.next
    word = {"allow": "allowed", "allow_session": "allowed for this session", "deny": "refused"}
    return Reply(f"{word[said]} {tool}", event=end)


def _decide_exemption(
    grant: bool,
    reason: str,
    client: Any,
    session_id: str,
    ctx: Context,
    pending: dict[str, Any],
) -> Reply:
    """/approve or /reject on the TDD exemption the AI asked for, by its id.

    /approve grants only the request this prompt showed; when another one waits, it is
    shown and a second /approve grants that one.
    """
    request_id = str(pending.get("request_id") or "")
    shown = request_text(pending)
    if grant and ctx.exemption_shown != request_id:
        ctx.exemption_shown = request_id
        return Reply(
            f"The AI asks for a TDD exemption: {shown}\n"
            "this is not the request shown before: /approve again grants it, /reject refuses it"
        )
    after = ctx.after if ctx.after is not None else cursor(client, session_id)
    params: dict[str, Any] = {"session_id": session_id, "grant": grant, "request_id": request_id}
    if reason:
        params["reason"] = reason
    session = client.call("workflow.decide_exemption", params)
    ctx.exemption_shown = None
    end = follow(
        client, session_id, after, ctx.renderer, on_review=ctx.on_review, review_decided=True
    )
    _note_shown(ctx, end)
    ctx.after = end.next
    if grant:
        return Reply(granted_text(session), event=end)
    return Reply(f"exemption refused: {shown}; state {session.get('state')}", event=end)


def _note_shown(ctx: Context, end: Ended) -> None:
    """A turn left waiting on the AI's exemption request, or on a tool call policy holds:
    what this prompt showed (what /approve answers)."""
    ctx.tool_shown = None
    if end.exemption and end.request_id:
        ctx.exemption_shown = end.request_id
    if end.status == "waiting_review" and end.tool_review:
        ctx.tool_shown = (end.tool_review, end.tool or "the call")


def run(
    project: str,
    *,
    interactive: bool | None = None,
    cli: dict[str, Any] | None = None,
    script: str | None = None,
    session_id: str | None = None,
    yes: bool = False,
) -> int:
    import sys

    from fluffy.cli.connect import (
        apply_mode,
        approve_mode,
        attached,
        get_session,
        git_identity,
        message_options,
        script_turns,
        settings_for,
    )

    interactive = sys.stdin.isatty() if interactive is None else interactive
    cli = cli or {}
    settings = settings_for(Path(project), cli)
    shown = use_theme(settings.theme)
    if not interactive:
        approve_mode(cli.get("mode"), yes=yes, confirm=None)  # before starting anything
    if interactive:
        env_for_task(Path(project), stdout)  # the project's dependencies, if missing
    with attached(project, say=lambda text: stdout.print(escape(text)), yes=yes) as kernel:
        client = kernel.client
        info = show_project(client, Path(project), stdout)
        if interactive and first_run_block(info) and not info.get("initialised"):
            _offer_init(Path(project))
        if session_id is not None:
            session, mode = get_session(client, session_id), cli.get("mode")
        else:
            session = client.call("session.get")
            mode = cli.get("mode") if session else settings.mode
            session = session or client.call("session.create")
        confirm = ask if interactive else None
        session = apply_mode(client, session, mode, yes=yes, confirm=confirm)
        stdout.print(f"{status_word('ok')} {escape(describe(kernel.status, session))}")
        if session_id is None and (note := continuing(client, session)) is not None:
            stdout.print(escape(note))
        if kernel.owned:
            stdout.print("  (started for this session: leaving stops it)")
        if interactive:
            turns = script_turns(script) if script else None
            try:
                options: dict[str, Any] | None = message_options(settings, turns)
                if (author := git_identity(Path(project))) is not None:
                    options["author"] = author  # type: ignore[index]
            except ConfigError as exc:  # the prompt still decides what waits, lists, ...
                options = None
                stdout.print(f"[yellow]WARN:[/] {escape(exc.what)}: tasks are not sent from "
                             f"this prompt; /approve, /reject and the other commands work. "
                             f"{escape(exc.fix)}")  # fmt: skip
            ctx = Context(
                renderer=SessionRenderer(stdout, prices=settings.prices, palette=shown),
                options=options,
                prepare=lambda: env_for_task(Path(project), stdout),
                prices=settings.prices,
                mode=settings.mode,
            )
            hint = allowlist_hint(Path(project), ctx.options or {})
            if hint is not None:
                stdout.print(f"[yellow]WARN:[/] {escape(hint)}")
            stdout.rule(f"fluffy v{__version__} -- {session['mode']} mode -- {session['state']}")
            _loop(client, session["session_id"], kernel.status, ctx)
    return 0


def _offer_init(project: Path, confirm: Confirm = ask) -> None:
    """The first interactive run on a project without .fluffy/ offers `fluffy init`."""
    if not confirm("Write these defaults to .fluffy/ so you can edit them?"):
        stdout.print("[dim]not written; `fluffy init` does it any time[/]")
        return
    for name, what in init_project(project).items():
        stdout.print(f"{status_word('ok')} .fluffy/{name}: {what}")


def make_prompt(history: Any = None, **io: Any) -> Any:
    """The prompt: history, slash-command completion, and multi-line tasks.

    Enter sends; Esc Enter (what most terminals send for Alt+Enter) inserts a newline;
    a paste (bracketed paste) is inserted whole, newlines included, as one task.
    ``io``: prompt_toolkit's ``input``/``output`` (tests).
    """
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.key_binding import KeyBindings

    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    return PromptSession(
        history=history,
        completer=WordCompleter(list(COMMANDS), sentence=True),
        key_bindings=keys,
        prompt_continuation=lambda width, line, wrapped: "." * (width - 1) + " ",
        **io,
    )


def _loop(client: Any, session_id: str, status: dict[str, Any], ctx: Context) -> None:
    from prompt_toolkit.history import FileHistory

    from fluffy.paths import fluffy_home

    fluffy_home().mkdir(parents=True, exist_ok=True)
    prompt = make_prompt(FileHistory(str(fluffy_home() / "history")))
    stdout.print("type a task, /help for the commands, Ctrl-D or /quit to leave")
    stdout.print(f"[dim]{escape(slash.HELP_KEYS)}[/]")
    while True:
        session = client.call("session.get", {"session_id": session_id}) or {}
        try:
            line = prompt.prompt(status_line(session.get("mode"), session.get("state")))
        except KeyboardInterrupt:
            continue  # clears the line, as in a shell
        except EOFError:
            return
        reply = handle(line, client, session_id, status, ctx)
        if reply.text:
            stdout.print(escape(reply.text))
        if reply.session_id is not None:
            session_id = reply.session_id
        if reply.quit:
            return
