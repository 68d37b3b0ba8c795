"""`fluffy init` and `fluffy env`: a user's project as fluffy sees it, on the first try.

* ``fluffy init`` writes the defaults fluffy applies to a project without ``.fluffy/``
  as commented files to edit: ``.fluffy/policy.yaml`` (fitted to the detected layout)
  and ``.fluffy/config.yaml``.  Existing files are kept unless ``--force``.
* ``fluffy env build|status|clear`` shows, prepares or removes the project's test
  environment (its dependencies installed offline into an image); ``fluffy "task"``
  and the prompt build it when it is missing, with progress.
* :func:`first_run_block` is the short block a session on a project without
  ``.fluffy/`` starts with: what fluffy applied, and how to change it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.markup import escape

from fluffy.cli.render import print_json, status_word, stdout
from fluffy.errors import ConfigError, FluffyError
from fluffy.junit import JS_RUNNERS
from fluffy.paths import project_folder

CONFIG_TEMPLATE = """\
# fluffy's settings for this project (written by `fluffy init`).
# Priority: command line > environment (FLUFFY_*) > this file > ~/.fluffy/config.yaml.
# API keys never go here: set OPENAI_API_KEY or ANTHROPIC_API_KEY in the environment.
# Security settings are not here: they are in policy.yaml, next to this file.

# provider: openai            # scripted | openai | anthropic
# model: gpt-4o-mini
# base_url: http://127.0.0.1:11434/v1   # an OpenAI-compatible server (allow it in policy.yaml)
# mode: strict                # the mode to ask for; the policy decides

# test.run uses pytest in the project's environment.  Another test runner: its command
# (run in the test sandbox, the project read-only at /workspace, no network) and where
# it writes its JUnit XML ({junit}); {paths} are the paths the model asks for.
# tests:
#   command: ["npx", "vitest", "run", "--reporter=junit", "--outputFile={junit}", "{paths}"]
#   env: {}
"""
_JS_TESTS = """
# test.run uses {how} with fluffy's JUnit reporter, in the project's environment (Node
# and the lock file's packages laid out offline in /node_modules).  Another runner: its
# command (run in the test sandbox, the project read-only at /workspace, no network)
# writing JUnit XML to {{junit}}; {{paths}} are the paths the model asks for.
# tests:
#   command: {example}
#   env: {{}}
"""
_JS_NO_ROUTE = """
# test.run cannot run {runner}'s tests until a command is named here: fluffy has no
# JUnit route of its own for {runner}.  Uncomment and adapt: the command runs in the test
# sandbox (the project read-only at /workspace, the packages in /node_modules, no
# network) and writes JUnit XML to {{junit}}; {{paths}} are the paths the model asks for.
# tests:
#   command: {example}
#   env: {{}}
"""


def config_template(layout: Any) -> str:
    """``.fluffy/config.yaml`` as ``fluffy init`` writes it for ``layout`` (a project's
    :class:`~fluffy.kernel.project.layout.Layout`): its test runner named."""
    from fluffy.host.project import command_example

    if getattr(layout, "language", "python") != "javascript":
        return CONFIG_TEMPLATE
    head = CONFIG_TEMPLATE.split("\n# test.run ", 1)[0]
    node = getattr(layout, "node", None)
    runner = getattr(node, "runner", None)
    how = JS_RUNNERS.get(runner)
    if how is None:
        return head + _JS_NO_ROUTE.format(runner=runner, example=command_example(runner))
    return head + _JS_TESTS.format(how=how, example=command_example("mocha") + "  # mocha's")


def _project(args: argparse.Namespace) -> Path:
    project = Path(getattr(args, "project", None) or ".").resolve()
    if not project.is_dir():
        raise ConfigError(
            f"the project folder {project} does not exist",
            fix="Pass an existing folder with --project, or run fluffy inside the project.",
            why="fluffy works on an existing project folder",
        )
    return project


def init_project(project: Path, *, force: bool = False) -> dict[str, str]:
    """Write ``.fluffy/policy.yaml`` and ``.fluffy/config.yaml``; file -> what happened."""
    from fluffy.host.policy import parse_policy
    from fluffy.host.project import detect_layout, render_policy

    folder = project_folder(project)
    folder.mkdir(exist_ok=True)
    today = datetime.date.today().isoformat()
    layout = detect_layout(project)
    policy = render_policy(layout, header=f"# Written by `fluffy init` on {today}.\n")
    parse_policy(policy, "<fluffy init>")  # what is written always loads
    done: dict[str, str] = {}
    for name, text in (("policy.yaml", policy), ("config.yaml", config_template(layout))):
        path = folder / name
        if path.exists() and not force:
            done[name] = "kept (exists; --force replaces it)"
            continue
        tmp = path.with_name(f".{name}.tmp")
        tmp.unlink(missing_ok=True)  # a link the repository put there: never written through
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        tmp.replace(path)
        done[name] = "written"
    return done


def cmd_init(args: argparse.Namespace) -> int:
    from fluffy.host.project import detect_layout

    project = _project(args)
    done = init_project(project, force=args.force)
    layout = detect_layout(project).to_dict()  # what the written policy was made from
    if args.json:
        print_json({"project": str(project), "files": done, "layout": layout})
        return 0
    for name, what in done.items():
        stdout.print(f"{status_word('ok')} .fluffy/{name}: {what}")
    for line in found_lines(layout):
        stdout.print(escape(line))
    stdout.print(
        "Edit them to change what fluffy allows; while a kernel runs, change the policy with "
        "`fluffy config policy edit` (reviewed, audited)."
    )
    return 0


# -- environments -----------------------------------------------------------------------
def _state(project: Path) -> Path:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home

    return paths(fluffy_home(), str(project))["state"]


def _owner(project: Path) -> tuple[int, int] | None:
    from fluffy.bootstrap.l1 import kernel_user

    uid, gid = (int(x) for x in kernel_user(str(project)).split(":"))
    return (uid, gid) if os.geteuid() == 0 else None


def ensure_env(
    project: Path,
    console: Console,
    *,
    force: bool = False,
    verbose: bool = False,
    state: Path | None = None,
) -> tuple[Any, bool]:
    """The project's environment, built with progress when missing: (record, built)."""
    from fluffy.host.engine import connect
    from fluffy.images.environment import ensure_environment
    from fluffy.images.templates import template_images

    state = state or _state(project)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    started = time.monotonic()
    with connect() as engine:
        base = template_images(engine)["code-executor"]
        status = console.status("test environment: checking") if console.is_terminal else None
        say: Callable[[str], None]
        if status is not None:
            status.start()
            say = lambda text: status.update(f"test environment: {escape(text)}")  # noqa: E731
        else:
            say = lambda text: console.print(f"  [dim]·[/] test environment: {escape(text)}")  # noqa: E731
        on_line = (
            (lambda line: console.print(f"    [dim]{escape(line)}[/]"))
            if verbose
            else (lambda _line: None)
        )
        try:
            record, built = ensure_environment(
                engine, project, state, base, force=force, say=say, on_line=on_line,
                owner=_owner(project),
            )  # fmt: skip
        finally:
            if status is not None:
                status.stop()
    if built and record is not None:
        console.print(
            f"{status_word('ok')} test environment built in {time.monotonic() - started:.1f} s: "
            f"{len(record.packages)} packages ({escape(', '.join(record.sources) or 'none')})"
        )
        _say_sources(record, console)
    return record, built


def _say_sources(record: Any, console: Console) -> None:
    """What a build fetched differently from what the project's files say: built from
    source (offline, in a container), refused (never fetched), and notes."""
    for made in getattr(record, "built_from_source", []):
        console.print(f"     [cyan]built from source:[/] {escape(made[:300])}")
    for refused in getattr(record, "refused", []):
        console.print(f"     [yellow]not fetched:[/] {escape(refused[:400])}")
    for warning in record.warnings:
        console.print(f"     [yellow]note:[/] {escape(warning[:300])}")


def env_for_task(project: Path, console: Console) -> None:
    """Before a task: the environment, built if missing; a failure is shown, not fatal
    (the tests then run without the project's dependencies and say so).  A project that
    declares nothing needs no engine work here; an engine that does not answer is left
    to the kernel's start to report (any other engine error, a stale image for one, is
    shown: the tests would otherwise say only that the environment is missing)."""
    from fluffy.errors import EngineTimeout, EngineUnavailable
    from fluffy.host.project import needs_environment

    if not needs_environment(project):
        return
    try:
        ensure_env(project, console)
    except (EngineUnavailable, EngineTimeout):
        return
    except FluffyError as exc:
        console.print(f"[yellow]WARNING: the test environment was not built: {escape(exc.what)}[/]")
        if exc.why:
            console.print(f"Reason: {escape(exc.why[:1200])}")
        if exc.fix:
            console.print(f"Fix: {escape(exc.fix)}")


def cmd_env_build(args: argparse.Namespace) -> int:
    project = _project(args)
    record, built = ensure_env(project, stdout, force=args.rebuild, verbose=args.verbose)
    if args.json:
        print_json(
            {
                "built": built,
                "environment": None if record is None else msgspec.structs.asdict(record),
            }
        )
    elif record is None:
        stdout.print("The project declares no dependencies: tests run in fluffy's own image.")
    elif not built:
        stdout.print(f"{status_word('ok')} test environment is current: {escape(record.image)}")
        _say_sources(record, stdout)
    return 0


def cmd_env_status(args: argparse.Namespace) -> int:
    from fluffy.host.engine import connect
    from fluffy.host.project import choose
    from fluffy.images.templates import template_images

    project = _project(args)
    with connect() as engine:
        base = template_images(engine)["code-executor"]
    choice = choose(project, _state(project), base)
    data = choice.to_dict()
    if args.json:
        print_json(data)
        return 0 if choice.current else 1
    if not data["needed"]:
        stdout.print("The project declares no dependencies: tests run in fluffy's own image.")
        return 0
    word = "ok" if choice.current else "warn"
    where = data["image"] or "none built"
    stdout.print(f"{status_word(word)} test environment {escape(where)}")
    if choice.record is not None:
        stdout.print(
            f"     {data['packages']} packages from {escape(', '.join(data['sources']) or '-')}; "
            f"project installed: {'yes' if data['project_installed'] else 'no (import roots)'}"
        )
    if choice.record is not None:
        _say_sources(choice.record, stdout)
    if choice.note:
        stdout.print(f"     {escape(choice.note)}")
    return 0 if choice.current else 1


def cmd_env_clear(args: argparse.Namespace) -> int:
    from fluffy.host.engine import connect
    from fluffy.images.environment import clear_environments

    project = _project(args)
    with connect() as engine:
        removed = clear_environments(engine, _state(project))
    if args.json:
        print_json({"removed": removed})
    else:
        stdout.print(f"removed {len(removed)} environment(s)")
    return 0


def first_run_block(info: dict[str, Any]) -> list[str]:
    """What fluffy applied to a project without ``.fluffy/`` (empty once it has one)."""
    policy = info.get("policy") or {}
    layout = info.get("layout") or {}
    if not policy.get("default"):
        return []
    env = info.get("environment") or {}
    node = layout.get("node") or {}
    if layout.get("language") == "javascript":
        how = JS_RUNNERS.get(node.get("runner"))
        packages = (
            "and the lock file's packages laid out offline"
            if node.get("lock")
            else "only: the project has no lock file, so no packages are installed (if it "
            "needs some: `npm install --package-lock-only`)"
        )
        env_line = (
            f"{how} with Node {packages}"
            + ("" if env.get("image") else " (built before the task; `fluffy env build`)")
            if how
            else f"{node.get('runner')} has no JUnit route in fluffy: name a command in "
            ".fluffy/config.yaml (tests:) that writes JUnit XML to {junit}"
        )
    elif not env:
        env_line = "pytest in fluffy's own image (no dependencies declared)"
    elif env.get("image"):
        env_line = f"pytest with the project's {env.get('packages')} packages installed offline"
    else:
        env_line = "the project's environment is not built (`fluffy env build`)"
    return [
        "No .fluffy/ here: fluffy applies its defaults (`fluffy init` writes them out to edit).",
        *found_lines(layout)[:2],
        f"  tests   {env_line}",
    ]


def found_lines(layout: dict[str, Any]) -> list[str]:
    """What fluffy found in a project and what its default policy makes of it."""
    tests = ", ".join(layout.get("test_globs", [])[:1]) or "tests/**"
    if layout.get("language") == "javascript":
        tests += ", *.test.*, *.spec.*, __tests__/"
    code = ", ".join(layout.get("source_globs", [])[:3]) or "src/**"
    return [
        f"  layout  {layout.get('summary', 'unknown')}",
        f"  policy  strict TDD: tests first in {tests}, then code in {code}; dependency, CI, "
        "hook and secret files wait for your review",
        *(f"  note    {note}" for note in layout.get("notes", [])),
    ]


def add_parser(sub: Any) -> None:
    init = sub.add_parser("init", help="write fluffy's defaults for this project to .fluffy/")
    init.add_argument("--project", help="the project folder (default: the current one)")
    init.add_argument("--force", action="store_true", help="replace existing files")
    init.add_argument("--json", action="store_true")
    init.set_defaults(func=cmd_init)
    env = sub.add_parser("env", help="the project's test environment (its dependencies)")
    env_sub = env.add_subparsers(dest="env_command", metavar="ACTION", required=True)
    build = env_sub.add_parser("build", help="build it if missing or outdated")
    build.add_argument("--rebuild", action="store_true", help="build even if current")
    build.add_argument("--verbose", "-v", action="store_true", help="show the build output")
    status = env_sub.add_parser("status", help="is it current for the dependency files?")
    clear = env_sub.add_parser("clear", help="remove its images and records")
    for parser, func in ((build, cmd_env_build), (status, cmd_env_status), (clear, cmd_env_clear)):
        parser.add_argument("--project", help="the project folder (default: the current one)")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(func=func)


def _intro_marker(project: Path) -> Path:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home

    return paths(fluffy_home(), str(project))["base"].with_suffix(".intro")


def show_project(client: Any, project: Path, console: Console) -> dict[str, Any]:
    """Ask the kernel what it applies; the first session on a project without
    ``.fluffy/`` gets :func:`first_run_block`, later ones a single line."""
    from fluffy.errors import UnknownMethod

    try:
        info: dict[str, Any] = client.call("project.info")
    except UnknownMethod:  # a kernel of an earlier fluffy, still running
        return {}
    block = first_run_block(info)
    if not block:
        return info
    marker = _intro_marker(project)
    if marker.exists():
        console.print("[dim]fluffy's default policy applies (`fluffy init` writes it out)[/]")
        return info
    for line in block:
        console.print(escape(line))
    try:
        marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    except OSError:
        pass
    return info
