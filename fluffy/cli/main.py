"""`fluffy` command line: parse, dispatch, and render errors at the edge.

`fluffy "a task"` runs one task and `fluffy [--mode M]` opens the prompt: when the first
word is not a subcommand, the task parser (fluffy.cli.task) takes the arguments.
Every command returns an exit code: 0 success, 1 a check or run failed, 2 usage
errors, 3 a fluffy error (rendered as ERROR / Reason / Fix, or JSON with --json).
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy._version import __version__
from fluffy.cli.render import print_error, print_json, status_word, stderr, stdout, use_theme
from fluffy.errors import ConfigError, FluffyError
from fluffy.pathnames import not_utf8

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


def cmd_doctor(args: argparse.Namespace) -> int:
    from fluffy.doctor import run_doctor

    report = run_doctor()
    if args.json:
        print_json(report.as_dict())
    else:
        for check in report.checks:
            stdout.print(f"{status_word(check.status)} {check.name:<22} {escape(check.detail)}")
            if check.fix and check.status != "ok":
                stdout.print(f"     [bold]fix:[/] {escape(check.fix)}")
        stdout.print(
            "[green]fluffy is ready.[/]" if report.ok else "[red]fluffy is not ready (see fix).[/]"
        )
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_images_build(args: argparse.Namespace) -> int:
    from fluffy.cli.progress import ConsoleReporter
    from fluffy.host.engine import connect
    from fluffy.images.builder import build_images

    with connect() as engine:
        console = stderr if args.json else stdout
        console.print(f"engine: {engine.info.engine} {engine.info.version} at {engine.info.url}")
        results = build_images(
            engine,
            args.names or None,
            force=args.rebuild,
            reporter=ConsoleReporter(console, verbose=args.verbose),
        )
    if args.json:
        print_json({"ok": True, "images": [status.as_dict() for status in results]})
    return EXIT_OK


def cmd_images_list(args: argparse.Namespace) -> int:
    from fluffy.host.engine import connect
    from fluffy.images.builder import plan_images

    with connect() as engine:
        plan = plan_images(engine)
    if args.json:
        print_json({"images": [status.as_dict() for status in plan]})
    else:
        for status in plan:
            word = "ok" if status.state == "current" else "fail"
            stdout.print(f"{status_word(word)} {status.name:<16} {status.ref}  ({status.state})")
    return EXIT_OK if all(s.state == "current" for s in plan) else EXIT_FAILED


def cmd_images_prune(args: argparse.Namespace) -> int:
    from fluffy.host.engine import connect
    from fluffy.images.builder import prune_images

    with connect() as engine:
        removed = prune_images(engine)
    if args.json:
        print_json({"removed": removed})
    else:
        for ref in removed:
            stdout.print(f"removed {escape(ref)}")
        stdout.print(f"{len(removed)} outdated, stray or orphaned image(s) removed.")
    return EXIT_OK


def cmd_kernel_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fluffy.host.kernel import main as serve_main
    from fluffy.images.spec import IMAGES_DIR
    from fluffy.images.templates import template_images

    project = Path(args.project).resolve() if args.project else None
    # on a host with fluffy's image sources, sandboxes run only current images
    sources = (IMAGES_DIR / "python-base" / "Dockerfile").is_file()
    return serve_main(
        Path(args.socket).absolute(),
        Path(args.state_dir).absolute(),
        project,
        images=template_images if sources else None,
    )


def cmd_demo_session(args: argparse.Namespace) -> int:
    """The design's scenario as an AI session through the real kernel (L1 + sandboxes).

    Offline by default: the scripted provider replays the bundled script in the
    ai-provider sandbox.  With an API key (or a base URL) in the environment, the same
    command gives the task to that model instead.
    """
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli.connect import detected_provider, message_options, settings_for
    from fluffy.cli.lifecycle import start_kernel, stop_kernel
    from fluffy.cli.session_view import JsonRenderer, SessionRenderer
    from fluffy.cli.turns import follow
    from fluffy.demo import demo_project
    from fluffy.demo_session import DEFAULT_SCRIPT, fresh_project, load_script, play, verify_audit
    from fluffy.paths import fluffy_home

    script_path = Path(args.script) if args.script else DEFAULT_SCRIPT
    script = load_script(script_path)
    project = fresh_project(demo_project())
    settings = settings_for(project, {})
    live = not args.offline and detected_provider(settings) != "scripted"
    options = message_options(settings, None if live else script.provider_turns())
    provider = options["provider"]
    files = paths(fluffy_home(), str(project))
    if not args.json:
        where = "offline, scripted" if provider["name"] == "scripted" else provider["name"]
        stdout.print(f"[bold]fluffy demo --session[/] ({where}): {escape(script.task)}")
        stdout.print(f"  a fresh copy of the demo project: {project}")
    status = start_kernel(str(project))
    if not args.json:
        stdout.print(
            f"  kernel healthy in its L1 container ({status.get('runtime')}, "
            f"{str(status.get('container_id'))[:12]}); strict mode\n"
        )
    shown = use_theme(settings.theme)
    renderer = JsonRenderer(lambda _: None) if args.json else SessionRenderer(stdout, palette=shown)
    try:
        demo = play(files["run"] / "kernel.sock", project, script, provider, renderer, follow)
    finally:
        stop_kernel(str(project))
    demo.audit_ok = verify_audit(files["state"], files["witness"])
    if args.json:
        print_json(demo.as_dict())
        return EXIT_OK if demo.ok else EXIT_FAILED
    checked = [c for c in demo.calls if c.expect is not None]
    if checked:
        good = sum(1 for c in checked if c.problem is None)
        word = "ok" if good == len(checked) else "fail"
        stdout.print(
            f"\n  {status_word(word)} {good}/{len(checked)} tool calls did what the script "
            "expected (refusals included)"
        )
    word = "ok" if demo.audit_ok else "fail"
    stdout.print(f"  {status_word(word)} audit chain verified against the bootstrap's witness")
    for problem in demo.problems:
        stdout.print(f"  [red]{escape(problem)}[/]")
    if demo.ok:
        stdout.print(
            f"[green]Done: committed {demo.commit[:12]} in {project} ({demo.seconds:.1f} s)[/]"
        )
        return EXIT_OK
    stdout.print("[red]The session did not go as expected.[/]")
    return EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    if args.session:
        return cmd_demo_session(args)
    from fluffy.demo import run_demo
    from fluffy.host.engine import connect

    with connect() as engine:
        if not args.json:
            stdout.print(
                "[bold]fluffy demo[/]: the demo project's tests in an L2 code-executor sandbox "
                "(seccomp standard, no network, read-only root and project, no capabilities, "
                "uid 10001)"
            )
        result = run_demo(engine)
    if args.json:
        print_json(result.as_dict())
        return EXIT_OK if result.ok else EXIT_FAILED
    stdout.print(f"  image {result.image}, sandbox {result.tests.sandbox.name}")
    for line in result.tests.stdout.strip().splitlines()[-6:]:
        stdout.print(f"  | {escape(line)}")
    stdout.print("  isolation probes (each an attempt that must fail):")
    failures = result.probe_failures
    for key, value in result.probes.items():
        word = "fail" if key in failures else "ok"
        stdout.print(f"    {status_word(word)} {key:<15} {escape(str(value))}")
    if result.ok:
        stdout.print("[green]Demo passed: tests ran, every isolation probe held.[/]")
        return EXIT_OK
    stdout.print("[red]Demo failed.[/]")
    return EXIT_FAILED


def _images(sub: Any) -> None:
    images = sub.add_parser("images", help="build and inspect fluffy's container images")
    images_sub = images.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = images_sub.add_parser("build", help="build missing or outdated images")
    build.add_argument("names", nargs="*", help="images to build (default: all)")
    build.add_argument("--rebuild", action="store_true", help="rebuild even if current")
    build.add_argument("--verbose", "-v", action="store_true", help="show the build output")
    build.add_argument("--json", action="store_true", help="print the result as JSON")
    build.set_defaults(func=cmd_images_build)
    listing = images_sub.add_parser("list", help="show each image's tag and whether it is current")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_images_list)
    prune = images_sub.add_parser(
        "prune", help="remove fluffy images that are not current or stray, and the "
        "environments of project folders that no longer exist")  # fmt: skip
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(func=cmd_images_prune)


def _doctor(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="check that this machine can run fluffy")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(func=cmd_doctor)


def _kernel(sub: Any) -> None:
    kernel = sub.add_parser("kernel", help="run the kernel process (development, tests)")
    kernel_sub = kernel.add_subparsers(dest="kernel_command", metavar="ACTION", required=True)
    serve = kernel_sub.add_parser("serve", help="serve the kernel's IPC socket in the foreground")
    serve.add_argument("--socket", required=True, help="Unix socket path to listen on")
    serve.add_argument("--state-dir", required=True, help="the kernel's state folder")
    serve.add_argument("--project", help="the project directory")
    serve.set_defaults(func=cmd_kernel_serve)


def _demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="the demo project's tests in a real sandbox; --session: a scripted TDD session "
        "through the kernel (offline, no API key)",
    )
    demo.add_argument("--json", action="store_true")
    demo.add_argument(
        "--session",
        action="store_true",
        help="play a scripted session (the design's end-to-end scenario) on a fresh copy",
    )
    demo.add_argument("--script", help="the session script (default: add-error-handling)")
    demo.add_argument(
        "--offline",
        action="store_true",
        help="--session: play the script even when an API key or base URL is set",
    )
    demo.set_defaults(func=cmd_demo)


#: Each part of the command tree in help order: the commands it adds, and what adds them
#: (a function here, or the name of the fluffy.cli module whose ``add_parser`` does).  A
#: command named on the command line builds only its own part: `fluffy stop` does not
#: import what `fluffy config` needs (tests/unit/cli/test_cli_task_args.py keeps it exact).
PARTS: tuple[tuple[tuple[str, ...], Callable[[Any], None] | str], ...] = (
    (("doctor",), _doctor),
    (("images",), _images),
    (("env", "init"), "project"),
    (("policy",), "policy"),
    (("audit",), "audit"),
    (("config",), "config"),
    (("start", "stop", "status"), "lifecycle"),
    (("kernel",), _kernel),
    (("sandbox",), "sandbox"),
    (("session",), "session"),
    (("exemption",), "exemption"),
    (("plugin",), "plugin"),
    (("mcp",), "mcp"),
    (("demo",), _demo),
    (("ui",), "ui"),
    (("completion",), "completion"),
)
COMMANDS = frozenset(name for names, _ in PARTS for name in names)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command tree, or (``only``: a command's name) just that command's part."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="fluffy",
        description="fluffy: a zero-trust AI coding workstation.",
        epilog='fluffy "TASK" [--yes] [--mode M] [--provider P] ... runs one task '
        "(fluffy TASK --help lists its options); fluffy alone opens the prompt.",
    )
    parser.add_argument("--version", action="version", version=f"fluffy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for names, adds in PARTS:
        if only is not None and only not in names:
            continue
        if isinstance(adds, str):
            adds = importlib.import_module(f"fluffy.cli.{adds}").add_parser
        adds(sub)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`fluffy COMMAND ...`, or `fluffy ["TASK"] [OPTIONS]` when no subcommand is named."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in COMMANDS:
        parser = build_parser(only=words[0])
    else:
        parser = build_parser()
        from fluffy.cli import task

        if task.is_task(words, COMMANDS):
            return task.parse(words, COMMANDS)
    if words[:2] == ["mcp", "add"] and "--" in words:  # the server's own command and options
        cut = words.index("--")
        args = parser.parse_args(words[:cut])
        args.command = [*args.command, *words[cut + 1 :]]
        return args
    return parser.parse_args(words)


def _theme() -> None:
    """The ``theme`` setting for every command (a session's project may set another)."""
    import contextlib
    import os

    from fluffy.paths import project_config, user_config

    files = (user_config(), project_config(Path.cwd()))
    if not os.environ.get("FLUFFY_THEME", "").strip() and not any(f.exists() for f in files):
        use_theme("auto")  # nothing sets it: the default, without loading the settings
        return
    from fluffy.settings import load_settings

    # a broken config file is reported by the command that needs it
    with contextlib.suppress(FluffyError, OSError):
        use_theme(load_settings(Path.cwd()).theme)


def command() -> int:
    """The ``fluffy`` command: :func:`main`, then an exit that does not walk the heap.

    What a command loaded lives until the process ends, and the interpreter's exit would
    walk all of it in its last garbage collections (~70 ms after `fluffy start`, which
    the person waits for). Frozen first, those collections skip it; files and sockets
    are closed where they are used, so nothing waits for a collection to be finalised."""
    try:
        return main()
    finally:
        gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # `fluffy ... | head`: the reader has what it wanted
        return _stop_writing()


def _run(argv: Sequence[str] | None) -> int:
    args = parse(argv)
    _theme()
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:  # `fluffy`: bring the kernel up if needed and connect
        from fluffy.cli.interactive import run as interactive

        func = lambda _: interactive(str(Path.cwd().resolve()))  # noqa: E731
    try:
        code = func(args)
    except FluffyError as error:
        print_error(error, as_json=getattr(args, "json", False))
        code = EXIT_ERROR
    except UnicodeEncodeError as exc:
        near = not_utf8(exc)
        if near is None:
            raise
        print_error(_not_utf8(near), as_json=getattr(args, "json", False))
        code = EXIT_ERROR
    except KeyboardInterrupt:
        stderr.print("interrupted")
        return 130
    sys.stdout.flush()  # here, where a reader gone away is caught, not at exit
    return code


def _not_utf8(near: str) -> ConfigError:
    """The error for a path or argument with bytes that are not UTF-8 (the project's
    own folder, most likely), met ``near`` that text."""
    return ConfigError(
        f"fluffy cannot use {near}: it is not UTF-8 text",
        why="a folder or file name (the project's own path?) or an argument holds bytes "
        "that are not UTF-8, and fluffy names projects and files in JSON, container "
        "mounts and its state folder, which carry UTF-8 only",
        fix="Rename the folder or file so its name is UTF-8 (`convmv -f latin1 -t utf8 "
        "-r --notest FOLDER` renames a tree), or give the text as UTF-8.",
    )


def _stop_writing() -> int:
    """What a command does when its output's reader is gone: nothing more is written
    (the interpreter's last flush would fail again) and it ends as SIGPIPE would end it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(command())
