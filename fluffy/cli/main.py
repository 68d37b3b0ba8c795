"""`fluffy` command line: parse, dispatch, and render errors at the edge.

Every command returns an exit code: 0 success, 1 a check or run failed, 2 usage
errors, 3 a fluffy error (rendered as ERROR / Reason / Fix, or JSON with --json).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.markup import escape

from fluffy._version import __version__
from fluffy.cli.render import print_error, print_json, status_word, stderr, stdout
from fluffy.errors import FluffyError

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
    from fluffy.images.builder import build_images
    from fluffy.kernel.containers.engine import connect

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
    from fluffy.images.builder import plan_images
    from fluffy.kernel.containers.engine import connect

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
    from fluffy.images.builder import prune_images
    from fluffy.kernel.containers.engine import connect

    with connect() as engine:
        removed = prune_images(engine)
    if args.json:
        print_json({"removed": removed})
    else:
        for ref in removed:
            stdout.print(f"removed {escape(ref)}")
        stdout.print(f"{len(removed)} outdated image tag(s) removed.")
    return EXIT_OK


def cmd_kernel_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fluffy.kernel.serve import main as serve_main

    project = Path(args.project).resolve() if args.project else None
    return serve_main(Path(args.socket).absolute(), Path(args.state_dir).absolute(), project)


def cmd_demo_session(args: argparse.Namespace) -> int:
    """The scripted session through the real kernel (L1 + sandboxes), step by step."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli.lifecycle import start_kernel, stop_kernel
    from fluffy.demo import demo_project
    from fluffy.demo_session import (
        DEFAULT_SCRIPT,
        StepResult,
        fresh_project,
        load_script,
        play,
        verify_audit,
    )
    from fluffy.paths import fluffy_home

    script = load_script(Path(args.script) if args.script else DEFAULT_SCRIPT)
    project = fresh_project(demo_project())
    files = paths(fluffy_home(), str(project))
    if not args.json:
        stdout.print(f"[bold]fluffy demo --session[/]: {escape(script.task)}")
        stdout.print(f"  a fresh copy of the demo project: {project}")
    status = start_kernel(str(project))
    if not args.json:
        stdout.print(
            f"  kernel healthy in its L1 container ({status.get('runtime')}, "
            f"{str(status.get('container_id'))[:12]}); strict mode"
        )

    def show(result: StepResult) -> None:
        if args.json:
            return
        word = "ok" if result.problem is None else "fail"
        route = result.answer.get("route") or "-"
        stdout.print(
            f"  {status_word(word)} {result.step.tool:<14} {route:<7} "
            f"{result.seconds * 1000:7.0f} ms  [dim]{escape(result.step.say)}[/]"
        )
        error = result.answer.get("error")
        if error and result.problem is None:
            stdout.print(f"       refused as expected: {escape(str(error.get('what')))}")
        state = result.state
        if state:
            stdout.print(f"       [cyan]state: {state}[/]")
        if result.problem:
            stdout.print(f"       [red]{escape(result.problem)}[/]")

    try:
        demo = play(files["run"] / "kernel.sock", project, script, show)
    finally:
        stop_kernel(str(project))
    demo.audit_ok = verify_audit(files["state"], files["witness"])
    if args.json:
        print_json(demo.as_dict())
        return EXIT_OK if demo.ok else EXIT_FAILED
    word = "ok" if demo.audit_ok else "fail"
    stdout.print(f"  {status_word(word)} audit chain verified against the bootstrap's witness")
    if demo.ok:
        stdout.print(f"[green]Done: committed {demo.commit[:12]} in {project}[/]")
        return EXIT_OK
    stdout.print("[red]The session did not go as scripted.[/]")
    return EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    if args.session:
        return cmd_demo_session(args)
    from fluffy.demo import run_demo
    from fluffy.kernel.containers.engine import connect

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fluffy",
        description="fluffy: a zero-trust AI coding workstation.",
    )
    parser.add_argument("--version", action="version", version=f"fluffy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    doctor = sub.add_parser("doctor", help="check that this machine can run fluffy")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(func=cmd_doctor)

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

    prune = images_sub.add_parser("prune", help="remove fluffy images that are not current")
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(func=cmd_images_prune)

    from fluffy.cli.audit import add_parser as add_audit_parser
    from fluffy.cli.config import add_parser as add_config_parser
    from fluffy.cli.lifecycle import add_parser as add_lifecycle_parser
    from fluffy.cli.policy import add_parser as add_policy_parser
    from fluffy.cli.sandbox import add_parser as add_sandbox_parser

    add_policy_parser(sub)
    add_audit_parser(sub)
    add_config_parser(sub)
    add_lifecycle_parser(sub)

    kernel = sub.add_parser("kernel", help="run the kernel process (development, tests)")
    kernel_sub = kernel.add_subparsers(dest="kernel_command", metavar="ACTION", required=True)
    serve = kernel_sub.add_parser("serve", help="serve the kernel's IPC socket in the foreground")
    serve.add_argument("--socket", required=True, help="Unix socket path to listen on")
    serve.add_argument("--state-dir", required=True, help="the kernel's state folder")
    serve.add_argument("--project", help="the project directory")
    serve.set_defaults(func=cmd_kernel_serve)

    add_sandbox_parser(sub)

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
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:  # `fluffy`: bring the kernel up if needed and connect
        from fluffy.cli.interactive import run as interactive

        func = lambda _: interactive(str(Path.cwd().resolve()))  # noqa: E731
    try:
        return func(args)
    except FluffyError as error:
        print_error(error, as_json=getattr(args, "json", False))
        return EXIT_ERROR
    except KeyboardInterrupt:
        stderr.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
