"""`fluffy config`: settings files (init / set / get / show) and `config policy edit`.

Settings follow the configuration hierarchy of :mod:`fluffy.settings`; `set` validates
the value through the same model before it writes, keeps the file's other keys and
replaces the file atomically.  API keys are refused: they live in the environment.

`config policy edit` changes the project's policy through the running kernel.
The policy file is never edited in place: the new text goes to the kernel as
``policy.update``, which validates it, tries it on the last decisions the audit log
recorded and answers with the changes ([BREAKING] = allowed before, denied now).  Only
after the user confirms (or ``--yes``) is it applied, atomically, and audited.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape

from fluffy.cli.render import print_json, stdout
from fluffy.errors import ConfigError
from fluffy.paths import (
    CONFIG_NAME,
    kernel_socket,
    project_config,
    project_folder,
    project_socket,
    user_config,
)
from fluffy.settings import (
    DEFAULT_MODELS,
    FIELDS,
    HELP,
    PRICES_EXAMPLE,
    Settings,
    api_key_source,
    load_settings,
    read_file,
    validate_layer,
)

HEADER = """\
# fluffy configuration ({level} level{scope}).
# Priority: command line > environment (FLUFFY_*) > project .fluffy/config.yaml
#           > user config ($FLUFFY_HOME/config.yaml) > defaults; see `fluffy config show`.
# API keys never go here: set OPENAI_API_KEY or ANTHROPIC_API_KEY in the environment.
# `mode` is a request: the kernel's policy decides (debug mode needs your approval).
"""


def _target(args: argparse.Namespace) -> Path:
    if not args.project:
        return user_config()
    path = project_folder(Path.cwd()) / CONFIG_NAME
    if path.is_symlink():
        raise ConfigError(
            f"{path} is a link; nothing was written",
            why="a repository can ship it pointing at a file of yours elsewhere, and the "
            "project's settings would be written there",
            fix="Look at what it points to; remove the link, then run the command again.",
        )
    return path


def _header(project: bool) -> str:
    if project:
        return HEADER.format(level="project", scope=": overrides the user config here")
    return HEADER.format(level="user", scope=": every project")


def _template(project: bool) -> str:
    defaults = Settings()
    lines = [_header(project)]
    for name in FIELDS:
        value = getattr(defaults, name) if name != "model" else DEFAULT_MODELS["openai"]
        if name == "prices":
            value = {model: dict(price) for model, price in PRICES_EXAMPLE.items()}
        shown = yaml.safe_dump({name: value}, default_flow_style=False).strip()
        commented = "\n".join(f"# {line}" for line in shown.splitlines())
        lines.append(f"# {HELP[name]}\n{commented}\n")
    return "\n".join(lines)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cmd_init(args: argparse.Namespace) -> int:
    path = _target(args)
    if path.exists() and not args.force:
        raise ConfigError(
            f"{path} already exists; nothing was changed",
            fix="Pass --force to replace it with the commented template.",
            why="`fluffy config init` never overwrites a settings file without being asked",
        )
    _write_atomically(path, _template(args.project))
    stdout.print(f"wrote {escape(str(path))}")
    return 0


def _known(key: str) -> str:
    name = key.replace("-", "_")
    if name in ("api_key", "apikey") or name.endswith("_api_key"):
        raise ConfigError(
            f"{name} is not a setting: API keys are never written to config files",
            why="fluffy reads API keys from the environment only",
            fix=(
                "Set OPENAI_API_KEY or ANTHROPIC_API_KEY (or FLUFFY_API_KEY) in your shell, "
                "e.g. `export OPENAI_API_KEY=...` in your shell profile."
            ),
        )
    if name not in FIELDS:
        raise ConfigError(
            f"unknown setting {key!r}",
            fix=f"Use one of: {', '.join(FIELDS)}.",
            why="only the settings fluffy knows can be read or written",
        )
    return name


def cmd_set(args: argparse.Namespace) -> int:
    key = _known(args.key)
    path = _target(args)
    raw: Any = args.value
    if key == "prices":  # a mapping: given as YAML / JSON on the command line
        try:
            raw = yaml.safe_load(args.value)
        except yaml.YAMLError:
            raw = args.value
    value = validate_layer(
        {key: raw},
        f"fluffy config set {key}",
        fix=f"Give {key} a valid value"
        + (" such as '{gpt-4o: {input: 2.5, output: 10}}'." if key == "prices" else "."),
    )[key]
    data = {**read_file(path), key: value}
    validate_layer(data, str(path))
    text = _header(args.project) + "\n" + yaml.safe_dump(data, sort_keys=False)
    _write_atomically(path, text)
    stdout.print(f"{key} = {escape(str(value))} in {escape(str(path))}")
    if key == "mode":
        stdout.print("[dim]the mode is a request: the kernel's policy applies it[/]")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    key = _known(args.key)
    settings = load_settings(Path.cwd(), {})
    value = getattr(settings, key)
    if args.json:
        print_json({"key": key, "value": value, "source": settings.sources[key]})
    else:
        print(value)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    project = Path.cwd()
    settings = load_settings(project, {})
    key_var = api_key_source(settings)
    files = {"user": str(user_config()), "project": str(project_config(project))}
    if args.json:
        print_json(
            {
                "settings": settings.model_dump(),
                "sources": settings.sources,
                "files": files,
                "api_key_env": key_var,
            }
        )
        return 0
    shown = settings.model_dump(exclude_none=True)  # prices as plain mappings
    for name in FIELDS:
        value = escape(str(shown.get(name)))
        stdout.print(f"{name:<18} {value:<24} [dim]{escape(settings.sources[name])}[/]")
    if settings.provider == "scripted":
        key_text = "not needed (scripted provider)"
    else:
        key_text = f"set ({key_var})" if key_var else "[red]not set[/]"
    stdout.print(f"{'api key':<18} {key_text}")
    for level, path in files.items():
        state = "" if Path(path).exists() else " (none)"
        stdout.print(f"[dim]{level} config: {escape(path)}{state}[/]")
    return 0


def _edit(text: str) -> str:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="policy-", delete=False) as tmp:
        tmp.write(text)
        name = tmp.name
    try:
        result = subprocess.run([*shlex.split(editor), name], check=False)
        if result.returncode != 0:
            raise ConfigError(
                f"the editor {editor!r} exited with {result.returncode}; nothing was changed",
                fix="Set VISUAL or EDITOR to an editor that exits 0 when you save.",
                why="a non-zero exit means the edit was abandoned or failed, so it is not applied",
            )
        return Path(name).read_text(encoding="utf-8")
    finally:
        Path(name).unlink(missing_ok=True)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _project_socket(project: str | None) -> Path:
    """The project's kernel (started by `fluffy start` or a task), else the development
    kernel's socket in fluffy's home (`fluffy kernel serve`)."""
    folder = Path(project or ".").resolve()
    sock = project_socket(folder)
    if sock.exists() or project is not None:
        return sock
    return kernel_socket()


def _kernel_socket(args: argparse.Namespace) -> Path:
    socket_path = Path(args.socket) if args.socket else _project_socket(args.project)
    if not socket_path.exists():
        raise ConfigError(
            f"no kernel is listening at {socket_path}",
            why="policy changes go through the running kernel (validated, tried, audited)",
            fix="Start the project's kernel (`fluffy start`, in the project or with "
            "--project), or pass its socket with --socket.",
        )
    return socket_path


def _review(client: Any, change: dict[str, Any], args: argparse.Namespace) -> Any:
    """Ask the kernel to try ``change``, show what would change, apply it if approved.
    Returns the kernel's answer, or None when nothing was applied."""
    plan: dict[str, Any] = client.call("policy.update", change)
    if not args.json:
        stdout.print(
            f"Tried on the last {plan['trial_size']} audited decisions: "
            f"{len(plan['changes'])} would change, {plan['breaking']} breaking."
        )
        stdout.print(
            f"Of the model's last {plan['ai_trial_size']} tool-call decisions, "
            f"{plan['ai_changes']} would change."
        )
        for line in plan["changes"]:
            style = "bold red" if line.startswith("[BREAKING]") else "yellow"
            stdout.print(f"  [{style}]{escape(line)}[/]")
    phrase = args.phrase
    if plan["needs_phrase"] and phrase is None and sys.stdin.isatty():
        phrase = input(f'Type "{plan["phrase"]}" to accept: ')
    if not (args.yes or _confirm("Apply this change?")):
        if args.json:
            print_json(plan)  # the trial's findings, applied: false
        else:
            stdout.print("Nothing applied (confirm interactively or pass --yes).")
        return None
    return client.call("policy.update", {**change, "approve": True, "phrase": phrase})


def cmd_policy_edit(args: argparse.Namespace) -> int:
    from fluffy.ipc.client import SyncClient

    with SyncClient(str(_kernel_socket(args)), timeout=60) as client:
        current = client.call("policy.get")
        new = Path(args.file).read_text(encoding="utf-8") if args.file else _edit(current["text"])
        if new == current["text"]:
            stdout.print("The policy is unchanged; nothing to do.")
            return 0
        result = _review(client, {"text": new}, args)
    if result is None:
        return 1
    if args.json:
        print_json(result)
    else:
        stdout.print(f"[green]Policy applied[/] to {escape(str(current['path']))}.")
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    """`fluffy config rules list|set|remove`: the project's extension rules, changed
    through the kernel like the policy (loaded in a sandbox, tried, reviewed, audited)."""
    from fluffy.ipc.client import SyncClient

    with SyncClient(str(_kernel_socket(args)), timeout=120) as client:
        current: dict[str, str] = client.call("policy.get").get("rules") or {}
        if args.rules_action == "list":
            if args.json:
                print_json({"rules": sorted(current)})
                return 0
            for name in sorted(current):
                lines = current[name].count("\n") + 1
                stdout.print(f"{escape(name)}  ({lines} lines)")
            if not current:
                stdout.print("No extension rules (.fluffy/rules/*.py).")
            return 0
        name = args.name if args.name.endswith(".py") else f"{args.name}.py"
        if args.rules_action == "remove":
            text = None
        else:
            source = Path(args.file) if args.file else None
            text = source.read_text(encoding="utf-8") if source else _edit(current.get(name, ""))
            if text == current.get(name):
                stdout.print(f"{escape(name)} is unchanged; nothing to do.")
                return 0
        result = _review(client, {"rules": {name: text}}, args)
    if result is None:
        return 1
    if args.json:
        print_json(result)
    else:
        done = "removed" if text is None else "applied"
        stdout.print(f"[green]Rule {escape(name)} {done}[/]; the policy sandbox runs the new set.")
    return 0


def add_parser(sub: Any) -> None:
    config = sub.add_parser("config", help="change fluffy's configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="WHAT", required=True)
    init = config_sub.add_parser("init", help="write a commented config.yaml (user level)")
    init.add_argument("--project", action="store_true", help="the project's .fluffy/config.yaml")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.set_defaults(func=cmd_init)
    setter = config_sub.add_parser("set", help="set one setting in a config file")
    setter.add_argument("key", metavar="KEY", help=f"one of: {', '.join(FIELDS)}")
    setter.add_argument("value", metavar="VALUE")
    setter.add_argument("--project", action="store_true", help="in the project's config")
    setter.set_defaults(func=cmd_set)
    getter = config_sub.add_parser("get", help="print one effective setting")
    getter.add_argument("key", metavar="KEY")
    getter.add_argument("--json", action="store_true")
    getter.set_defaults(func=cmd_get)
    show = config_sub.add_parser("show", help="every effective setting and where it comes from")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    policy = config_sub.add_parser("policy", help="the project's policy")
    policy_sub = policy.add_subparsers(dest="policy_action", metavar="ACTION", required=True)
    edit = policy_sub.add_parser("edit", help="edit the policy through the kernel (reviewed)")
    edit.add_argument("--project", help="the project whose kernel applies it (default: here)")
    edit.add_argument("--socket", help="the running kernel's socket (instead of --project)")
    edit.add_argument("--file", help="take the new policy from this file instead of an editor")
    edit.add_argument("--yes", action="store_true", help="apply without asking")
    edit.add_argument("--phrase", help="the confirmation phrase for more than 5 breaking changes")
    edit.add_argument("--json", action="store_true")
    edit.set_defaults(func=cmd_policy_edit)
    from fluffy.cli.testcommand import add_parser as add_tests

    add_tests(config_sub)
    rules = config_sub.add_parser(
        "rules", help="the project's extension rules, .fluffy/rules/*.py (reviewed)"
    )
    rules_sub = rules.add_subparsers(dest="rules_action", metavar="ACTION", required=True)
    for action, text in (
        ("list", "list the rules the kernel runs"),
        ("set", "add or replace a rule (from --file, or in an editor)"),
        ("remove", "remove a rule"),
    ):
        command = rules_sub.add_parser(action, help=text)
        if action != "list":
            command.add_argument("name", metavar="NAME", help="the rule file, e.g. no-secrets.py")
            command.add_argument("--yes", action="store_true", help="apply without asking")
            command.add_argument("--phrase", help="the phrase for more than 5 breaking changes")
        if action == "set":
            command.add_argument("--file", help="the rule's new text")
        command.add_argument("--project", help="the project whose kernel applies it")
        command.add_argument("--socket", help="the running kernel's socket")
        command.add_argument("--json", action="store_true")
        command.set_defaults(func=cmd_rules)
