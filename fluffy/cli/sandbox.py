"""`fluffy sandbox ...`: a human diagnostic tool (the AI never gets it)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from rich.markup import escape

from fluffy.cli.render import print_json, stderr, stdout
from fluffy.errors import SandboxRunFailed

if TYPE_CHECKING:
    from fluffy.host.engine import Engine
    from fluffy.host.project import EnvRecord

#: Exit codes for sandboxes that did not end by themselves (as coreutils' timeout does).
EXIT_TIMEOUT, EXIT_OOM = 124, 137


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    from fluffy.host.engine import FailureReason, connect, template_config
    from fluffy.images.templates import open_manager

    command = [part for part in args.cmd if part != "--"] if args.cmd else []
    if not command:
        raise SandboxRunFailed(
            "no command given",
            why="`fluffy sandbox run` runs one command in a fresh sandbox",
            fix="Put the command after `--`: fluffy sandbox run --template code-executor -- "
            "python3 -m pytest -q",
        )
    project = Path(args.project).resolve()
    user, scratch = _user_for(project)
    overrides: dict[str, object] = {"project_dir": project}
    if args.timeout is not None:
        overrides["max_duration"] = f"{args.timeout}s"

    def echo(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        with connect() as engine:
            record = None if args.no_env else _environment(engine, project, args.template)
            if record is not None:
                overrides["image"] = record.image
                overrides["environment"] = {"PATH": ENV_PATH, "VIRTUAL_ENV": ENV_ROOT}
                if record.generated and scratch is None:  # files its install makes
                    scratch = Path(tempfile.mkdtemp(prefix="fluffy-sandbox-run-"))
            if scratch is not None:  # a readable copy (with the generated files)
                from fluffy.host.engine import sandbox_identity
                from fluffy.host.tools import TestViews

                # the person's own command: their files as on the host (ADR-097)
                views = TestViews(scratch, project, sandbox_identity()[0], persons=True)
                generated = _state(project) / "envs" / record.key / "generated" if record else None
                overrides["project_dir"] = views.sync(
                    "run", {}, None, generated=generated,
                    generated_files=record.generated if record else (),
                ).folder  # fmt: skip
            config = template_config(args.template, **overrides)
            manager = open_manager(engine, user=user)
            try:
                outcome = manager.run(config, command, on_output=echo)
            finally:
                manager.close()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    sandbox = outcome.sandbox
    if outcome.failure is FailureReason.TIMEOUT:
        stderr.print(
            f"[red]ERROR:[/] sandbox {sandbox.name} ran past {config.max_duration} and was "
            "killed\n[bold]Fix:[/] pass a longer --timeout, or make the command faster."
        )
        return EXIT_TIMEOUT
    if outcome.failure is FailureReason.OOM:
        stderr.print(
            f"[red]ERROR:[/] sandbox {sandbox.name} ran out of memory ({config.memory_limit}) "
            "and was killed\n[bold]Fix:[/] use a template with more memory, or use less."
        )
        return EXIT_OOM
    return outcome.exit_code if outcome.exit_code is not None else 1


#: How a sandbox finds the project's environment (images/environment.py puts it there).
ENV_ROOT = "/opt/fluffy/env"
ENV_PATH = (
    f"{ENV_ROOT}/bin:/opt/fluffy/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
    "/sbin:/bin"
)


def _state(project: Path) -> Path:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home

    return paths(fluffy_home(), str(project))["state"]


def _environment(engine: Engine, project: Path, template: str) -> EnvRecord | None:
    """The project's test environment for a test-like template (as test.run uses it),
    None when the project has none or the template runs no project code."""
    from fluffy.host.project import choose
    from fluffy.images.templates import template_images

    if template not in ("code-executor", "integration-test"):
        return None
    choice = choose(project, _state(project), template_images(engine)["code-executor"])
    if choice.record is None:
        if choice.key is not None:
            stderr.print(f"[yellow]note:[/] {escape(choice.note)}")
        return None
    stderr.print(
        f"[dim]the project's test environment {escape(choice.record.image)} (as test.run; "
        "--no-env for fluffy's own image)[/]"
    )
    if choice.note:
        stderr.print(f"[yellow]note:[/] {escape(choice.note)}")
    return choice.record


def _user_for(project: Path) -> tuple[str | None, Path | None]:
    """The sandbox user for ``project``, and a scratch folder when it needs a copy.

    As the project's owner when that is not root (it reads what the owner can); a
    root-owned project closed to others is copied for the sandbox user (who is never
    root).  Not root ourselves: our own uid (the manager's default)."""
    if os.geteuid() != 0:
        return None, None
    info = project.stat()
    if info.st_uid != 0:
        return f"{info.st_uid}:{info.st_gid}", None
    if info.st_mode & 0o005 == 0o005:
        return None, None
    return None, Path(tempfile.mkdtemp(prefix="fluffy-sandbox-run-"))


def cmd_sandbox_gc(args: argparse.Namespace) -> int:
    from fluffy.host.engine import ContainerManager, connect, open_runtime

    with connect() as engine:
        manager = ContainerManager(open_runtime(engine), {})
        try:
            report = manager.collect_garbage()
        finally:
            manager.close()
    if args.json:
        print_json(msgspec.structs.asdict(report))
    else:
        stdout.print(
            f"removed {len(report.containers)} container(s), {len(report.volumes)} volume(s), "
            f"{len(report.output_dirs)} output folder(s) left by ended sessions"
        )
        for error in report.errors:
            stdout.print(f"  [yellow]could not remove[/] {escape(error)}")
    return 0 if not report.errors else 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fluffy.host.engine import TEMPLATES

    sandbox = sub.add_parser("sandbox", help="run a command in a sandbox; clean up orphans")
    actions = sandbox.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    run = actions.add_parser(
        "run",
        help="run one command in a fresh sandbox (streams output, returns its exit code)",
        usage="fluffy sandbox run --template T [--project DIR] [--timeout S] -- CMD ...",
    )
    run.add_argument("--template", required=True, choices=sorted(TEMPLATES))
    run.add_argument("--project", default=".", help="mounted read-only at /workspace (default: .)")
    run.add_argument("--timeout", type=int, help="seconds before the sandbox is killed")
    run.add_argument(
        "--no-env",
        action="store_true",
        help="fluffy's own image, without the project's test environment",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    run.set_defaults(func=cmd_sandbox_run)
    gc = actions.add_parser(
        "gc",
        help="remove containers and folders of ended sessions (this fluffy home's; a kernel "
        "removes its own project's at start)",
    )
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=cmd_sandbox_gc)
