"""`fluffy init`: a user's project as fluffy sees it, on the first try.

* ``fluffy init`` writes the defaults fluffy applies to a project without ``.fluffy/``
  as commented files to edit: ``.fluffy/policy.yaml`` (fitted to the detected layout)
  and ``.fluffy/config.yaml``.  Existing files are kept unless ``--force``.
* :func:`first_run_block` is the short block a session on a project without
  ``.fluffy/`` starts with: what fluffy applied, and how to change it.
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from fluffy.cli.render import print_json, status_word, stdout
from fluffy.errors import ConfigError

CONFIG_TEMPLATE = """\
# fluffy's settings for this project (written by `fluffy init`).
# Priority: command line > environment (FLUFFY_*) > this file > ~/.fluffy/config.yaml.
# API keys never go here: set OPENAI_API_KEY or ANTHROPIC_API_KEY in the environment.
# Security settings are not here: they are in policy.yaml, next to this file.

# provider: openai            # scripted | openai | anthropic
# model: gpt-4o-mini
# base_url: http://127.0.0.1:11434/v1   # an OpenAI-compatible server (allow it in policy.yaml)
# mode: strict                # the mode to ask for; the policy decides
"""


def _project(args: argparse.Namespace) -> Path:
    project = Path(getattr(args, "project", None) or ".").resolve()
    if not project.is_dir():
        raise ConfigError(
            f"the project folder {project} does not exist",
            fix="Pass an existing folder with --project, or run fluffy inside the project.",
        )
    return project


def init_project(project: Path, *, force: bool = False) -> dict[str, str]:
    """Write ``.fluffy/policy.yaml`` and ``.fluffy/config.yaml``; file -> what happened."""
    from fluffy.kernel.policy.model import parse_policy
    from fluffy.kernel.project.defaults import render_policy
    from fluffy.kernel.project.layout import detect_layout

    folder = project / ".fluffy"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ConfigError(
            f"{folder} exists and is not a folder",
            fix="Move it away, then run `fluffy init` again.",
        )
    folder.mkdir(exist_ok=True)
    today = datetime.date.today().isoformat()
    policy = render_policy(
        detect_layout(project), header=f"# Written by `fluffy init` on {today}.\n"
    )
    parse_policy(policy, "<fluffy init>")  # what is written always loads
    done: dict[str, str] = {}
    for name, text in (("policy.yaml", policy), ("config.yaml", CONFIG_TEMPLATE)):
        path = folder / name
        if path.exists() and not force:
            done[name] = "kept (exists; --force replaces it)"
            continue
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        done[name] = "written"
    return done


def cmd_init(args: argparse.Namespace) -> int:
    project = _project(args)
    done = init_project(project, force=args.force)
    if args.json:
        print_json({"project": str(project), "files": done})
        return 0
    for name, what in done.items():
        stdout.print(f"{status_word('ok')} .fluffy/{name}: {what}")
    stdout.print(
        "Edit them to change what fluffy allows; while a kernel runs, change the policy with "
        "`fluffy config policy edit` (reviewed, audited)."
    )
    return 0


def first_run_block(info: dict[str, Any]) -> list[str]:
    """What fluffy applied to a project without ``.fluffy/`` (empty once it has one)."""
    policy = info.get("policy") or {}
    layout = info.get("layout") or {}
    if not policy.get("default"):
        return []
    tests = ", ".join(layout.get("test_globs", [])[:1]) or "tests/**"
    code = ", ".join(layout.get("source_globs", [])[:3]) or "src/**"
    env = info.get("environment") or {}
    if not env:
        env_line = "pytest in fluffy's own image (no dependencies declared)"
    elif env.get("image"):
        env_line = f"pytest with the project's {env.get('packages')} packages installed offline"
    else:
        env_line = "the project's environment is not built (`fluffy env build`)"
    return [
        "No .fluffy/ here: fluffy applies its defaults (`fluffy init` writes them out to edit).",
        f"  layout  {layout.get('summary', 'unknown')}",
        f"  policy  strict TDD: tests first in {tests}, then code in {code}; dependency, CI, "
        "hook and secret files wait for your review",
        f"  tests   {env_line}",
    ]


def add_parser(sub: Any) -> None:
    init = sub.add_parser("init", help="write fluffy's defaults for this project to .fluffy/")
    init.add_argument("--project", help="the project folder (default: the current one)")
    init.add_argument("--force", action="store_true", help="replace existing files")
    init.add_argument("--json", action="store_true")
    init.set_defaults(func=cmd_init)


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
