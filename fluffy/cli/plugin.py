"""`fluffy plugin install|list|info|remove|enable|disable`: third-party plugins.

The plugin store and its install registry live in fluffy's home (``$FLUFFY_HOME/plugins``);
a kernel activates the installed, enabled plugins when it starts.  Installing is a
reviewed action (design: require_review): the plugin's name, version, tools,
capabilities and the policy pre-check's warnings are shown and the user confirms on a
terminal, or with ``--yes`` up front; with neither, nothing is installed (exit 1).

When a kernel runs for the project (``--project``, default ``.``), the review goes
through it (``plugin.install``, kernel/syscalls/plugins.py; ADR-040): the CLI reads the
folder once and sends the bytes, the kernel checks them and pre-checks them against its
current policy, and records the user's answer in the project's audit log (an approval
before anything is installed, a refusal too); then the CLI installs exactly the bytes
the kernel reviewed.  Without a kernel the review happens on this terminal alone,
pre-checked against the project's ``.fluffy/policy.yaml`` (or the default-deny policy),
and the output says that no audit entry was written.  ``remove``, ``enable`` and
``disable`` change the store only, and take effect when a kernel next starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.markup import escape

from fluffy.cli.render import print_error, print_json, stdout
from fluffy.errors import FluffyError

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 1, 3
T = TypeVar("T")


def _evaluate(project: Path) -> Any:
    from fluffy.host.policy import PolicyEngine, PolicyFile, default_builtins, load_policy

    path = project / ".fluffy" / "policy.yaml"
    policy = load_policy(path) if path.is_file() else PolicyFile()
    root = project.resolve()
    return PolicyEngine(policy, builtins=default_builtins(root), root=root).evaluate


async def _with_registry(args: argparse.Namespace, work: Callable[[Any, Any], Awaitable[T]]) -> T:
    from fluffy.host.plugins import PluginStore
    from fluffy.host.tools import open_home

    store = PluginStore.default()
    registry = await open_home(store, _evaluate(Path(getattr(args, "project", None) or ".")))
    try:
        return await work(registry, store)
    finally:
        await registry.close()


def _show_plan(summary: dict[str, Any]) -> None:
    stdout.print(
        f"[bold]{escape(summary['name'])}[/] {escape(summary['version'])} "
        f"by {escape(summary['author'])}: {escape(summary['description'])}"
    )
    stdout.print(f"  from         {escape(summary['source'])}")
    stdout.print(
        f"  files        {summary['files']} ({summary['total_bytes']} bytes), "
        f"sandbox {summary['sandbox_template']}, tags {', '.join(summary['tags'])}"
    )
    for tool in summary["tools"]:
        mode = "read-only" if tool["read_only"] else "runs commands (debug mode only)"
        stdout.print(
            f"  tool         {escape(tool['name'])} ({mode}): {escape(tool['description'])}"
        )
    capabilities = ", ".join(summary["required_capabilities"]) or "none"
    stdout.print(f"  capabilities {escape(capabilities)}")
    for warning in summary["warnings"]:
        stdout.print(f"  [yellow]warning[/]      {escape(warning)}")


def _confirmed(
    args: argparse.Namespace,
    name: str,
    question: str = "Install {name}? It runs in its own sandbox, tagged third_party.",
    undone: str = "installed",
) -> bool:
    from fluffy.errors import PluginNotConfirmed

    if args.yes:
        return True
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise PluginNotConfirmed(
            f"{name} was not {undone}: there is no terminal to confirm on and --yes was not given"
        )
    answer = input(f"{question.format(name=name)} [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _project(args: argparse.Namespace) -> str:
    return str(Path(getattr(args, "project", None) or ".").resolve())


def _kernel_socket(project: str) -> Path | None:
    """The running kernel's socket for ``project`` (None: no kernel runs for it)."""
    from fluffy.cli.lifecycle import _status
    from fluffy.errors import KernelNotRunning
    from fluffy.paths import project_socket

    status = _status(project)
    if status is None:
        return None
    if status.get("health") != "healthy":  # never fall back to the host while one runs
        raise KernelNotRunning(
            f"the kernel for {project} is running but not healthy ({status.get('health')})",
            why="while a kernel runs for the project, plugins are installed through its review",
            fix="Wait until `fluffy status` says healthy, or stop it (`fluffy stop`).",
        )
    return project_socket(project)


def _install_on_host(args: argparse.Namespace, project: str) -> int:
    from fluffy.host.plugins import install, plan

    async def run(registry: Any, store: Any) -> int:
        approved = await plan(registry, Path(args.path))
        summary = approved.to_dict()
        if not args.json:
            _show_plan(summary)
        if not _confirmed(args, f"{approved.manifest.name} {approved.manifest.version}"):
            stdout.print("not installed")
            return EXIT_REFUSED
        info = await install(registry, store, approved)
        if args.json:
            print_json({"ok": True, "installed": info.to_dict(), "plan": summary, "audited": False})
        else:
            stdout.print(
                f"installed {info.name} {info.version} into {escape(info.folder)}; "
                "a kernel loads it when it starts"
            )
            stdout.print(
                f"not audited: no kernel runs for {escape(project)}, so this review was "
                "on this terminal only (start one first to have installs recorded)"
            )
        return EXIT_OK

    return asyncio.run(_with_registry(args, run))


def _install_through_kernel(args: argparse.Namespace, project: str, sock: Path) -> int:
    """The kernel reviews the bytes read here and records the answer; they are installed."""
    from fluffy.cli.connect import CALL_TIMEOUT_S
    from fluffy.errors import PluginInstallRefused, PluginNotConfirmed
    from fluffy.host.plugins import (
        InstallPlan,
        check_sendable,
        encode_files,
        install,
        read_manifest_text,
        read_tree,
        tree_digest,
    )
    from fluffy.ipc.client import SyncClient

    source = Path(args.path).expanduser().absolute()
    files = read_tree(source)  # once: what the kernel reviews is what is installed
    check_sendable(files)
    digest = tree_digest(files)
    asked = {"source": str(source), "files": encode_files(files)}
    with SyncClient(str(sock), timeout=CALL_TIMEOUT_S) as client:
        summary: dict[str, Any] = client.call("plugin.install", asked)["plan"]
        if summary["digest"] != digest:
            raise PluginInstallRefused(
                f"the kernel reviewed other bytes than {source} holds",
                why="the plan's digest names the files the kernel read",
                fix="Install again; if it repeats, restart the kernel (`fluffy stop`).",
            )
        named = f"{summary['name']} {summary['version']}"
        if not args.json:
            _show_plan(summary)
            stdout.print(f"  reviewed by  the kernel of {escape(project)} (your answer is audited)")
        try:
            approved = _confirmed(args, named)
        except PluginNotConfirmed as error:
            _decline(client, asked, digest)
            error.why = f"{error.why}; the kernel recorded the refusal in the audit log"
            raise
        if not approved:
            _decline(client, asked, digest)
            stdout.print("not installed; the kernel recorded the refusal in the audit log")
            return EXIT_REFUSED
        client.call("plugin.install", {**asked, "approve": True, "digest": digest})
    manifest = read_manifest_text(files["manifest.yaml"].decode("utf-8"), str(source))
    reviewed = InstallPlan(source, manifest, len(files), sum(map(len, files.values())), [])

    async def run(registry: Any, store: Any) -> Any:
        return await install(registry, store, reviewed, files)

    info = asyncio.run(_with_registry(args, run))
    if args.json:
        data = {"ok": True, "installed": info.to_dict(), "plan": summary, "audited": True}
        print_json({**data, "kernel": project})
    else:
        stdout.print(
            f"installed {info.name} {info.version} into {escape(info.folder)}; the kernel "
            "recorded the approval in the audit log (`fluffy audit log --type "
            "plugin_install_approved`)"
        )
        stdout.print("the running kernel loads it when it next starts (`fluffy stop`, then start)")
    return EXIT_OK


def _decline(client: Any, asked: dict[str, Any], digest: str) -> None:
    """Tell the kernel the user said no: it records the refusal (and answers with it)."""
    from fluffy.errors import PluginNotConfirmed

    with contextlib.suppress(PluginNotConfirmed):
        client.call("plugin.install", {**asked, "approve": False, "digest": digest})


def cmd_install(args: argparse.Namespace) -> int:
    project = _project(args)
    sock = _kernel_socket(project)
    if sock is None:
        return _install_on_host(args, project)
    return _install_through_kernel(args, project, sock)


def cmd_list(args: argparse.Namespace) -> int:
    async def run(registry: Any, store: Any) -> list[dict[str, Any]]:
        return [info.to_dict() for info in registry.list(rejected=args.rejected)]

    found = asyncio.run(_with_registry(args, run))
    if args.json:
        print_json({"plugins": found, "rejected": bool(args.rejected)})
        return EXIT_OK
    for info in found:
        if args.rejected:
            stdout.print(
                f"{escape(info['name'])}  REJECTED  {escape(info['manifest_path'])}\n"
                f"    {escape(str(info['reason']))}"
            )
            continue
        why = f" ({escape(str(info['reason']))})" if info["reason"] else ""
        stdout.print(
            f"{escape(info['name'])} {escape(info['version'])}  {info['state']}{why}  "
            f"tools: {escape(', '.join(info['tools']))}"
        )
    if not found:
        stdout.print("no rejected plugins" if args.rejected else "no plugins installed")
    return EXIT_OK


def _info_of(registry: Any, name: str) -> Any:
    from fluffy.errors import PluginNotFound

    info = registry.get(name)
    if info is None:
        raise PluginNotFound(
            f"no plugin named {name!r} is installed",
            why="the plugin registry in fluffy's home has no entry with that name",
        )
    return info


def cmd_info(args: argparse.Namespace) -> int:
    async def run(registry: Any, store: Any) -> dict[str, Any]:
        data: dict[str, Any] = _info_of(registry, args.name).to_dict()
        data["integrity"] = store.verify(args.name).to_dict()
        return data

    data = asyncio.run(_with_registry(args, run))
    if args.json:
        print_json(data)
        return EXIT_OK
    for key in ("name", "version", "state", "reason", "description", "author", "folder"):
        if data.get(key):
            stdout.print(f"{key:<22} {escape(str(data[key]))}")
    stdout.print(f"{'tools':<22} {escape(', '.join(data['tools']))}")
    stdout.print(
        f"{'required_capabilities':<22} {escape(', '.join(data['required_capabilities']))}"
    )
    stdout.print(f"{'tags':<22} {escape(', '.join(data['tags']))}")
    integrity = data["integrity"]
    stdout.print(f"{'files':<22} {'intact' if integrity['ok'] else '[red]CHANGED[/]'}")
    for warning in data["warnings"]:
        stdout.print(f"[yellow]warning[/] {escape(warning)}")
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    from fluffy.errors import PluginNotConfirmed
    from fluffy.host.plugins import remove

    async def run(registry: Any, store: Any) -> None:
        _info_of(registry, args.name)  # a name that is not installed: said before asking
        question = "Remove the plugin {name}? Its tools go; its files leave the store."
        if not _confirmed(args, args.name, question, undone="removed"):
            raise PluginNotConfirmed(f"{args.name} was not removed: you answered no")
        await remove(registry, store, args.name)

    asyncio.run(_with_registry(args, run))
    if args.json:
        print_json({"ok": True, "removed": args.name})
    else:
        stdout.print(f"removed {escape(args.name)}")
    return EXIT_OK


def _switch(args: argparse.Namespace, enable: bool) -> int:
    async def run(registry: Any, store: Any) -> dict[str, Any]:
        info = _info_of(registry, args.name)
        if enable and info.state == "REGISTERED":
            return dict(info.to_dict())  # already enabled
        if enable:
            info = await registry.enable(args.name)
        else:
            info = await registry.disable(args.name, args.reason)
        return dict(info.to_dict())

    data = asyncio.run(_with_registry(args, run))
    if args.json:
        print_json(data)
    else:
        word = "enabled" if enable else "disabled"
        stdout.print(f"{word} {escape(args.name)}; a kernel applies it when it starts")
    return EXIT_OK


def cmd_enable(args: argparse.Namespace) -> int:
    return _switch(args, True)


def cmd_disable(args: argparse.Namespace) -> int:
    return _switch(args, False)


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A refused install exits 1 (nothing installed); other errors exit 3 like `fluffy`."""

    def run(args: argparse.Namespace) -> int:
        from fluffy.errors import PluginError, PluginNotConfirmed

        try:
            return func(args)
        except PluginError as error:
            print_error(error, as_json=getattr(args, "json", False))
            refused = isinstance(error, PluginNotConfirmed) or args.plugin_command == "install"
            return EXIT_REFUSED if refused else EXIT_ERROR

    return run


def add_parser(sub: Any) -> None:
    plugin = sub.add_parser("plugin", help="install and manage third-party tool plugins")
    actions = plugin.add_subparsers(dest="plugin_command", metavar="ACTION", required=True)

    def action(name: str, help: str, func: Callable[[argparse.Namespace], int]) -> Any:
        parser = actions.add_parser(name, help=help)
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument(
            "--project", help="the project whose policy pre-checks capabilities (default: .)"
        )
        parser.set_defaults(func=_guarded(func))
        return parser

    install = action("install", "install a plugin from a local folder (after review)", cmd_install)
    install.add_argument("path", help="the plugin's folder (holding manifest.yaml)")
    install.add_argument("--yes", "-y", action="store_true", help="confirm without asking")
    listing = action("list", "list installed plugins", cmd_list)
    listing.add_argument("--rejected", action="store_true", help="list rejected plugins")
    info = action("info", "show one plugin (and check its files)", cmd_info)
    info.add_argument("name")
    remove = action("remove", "uninstall a plugin (after confirming)", cmd_remove)
    remove.add_argument("name")
    remove.add_argument("--yes", "-y", action="store_true", help="confirm without asking")
    enable = action("enable", "enable a disabled plugin", cmd_enable)
    enable.add_argument("name")
    disable = action("disable", "disable a plugin (kept installed)", cmd_disable)
    disable.add_argument("name")
    disable.add_argument("--reason", default="disabled by the user", help="why (kept)")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fluffy.cli.plugin ...``: the same commands without the rest of `fluffy`."""
    parser = argparse.ArgumentParser(prog="fluffy")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except FluffyError as error:
        print_error(error, as_json=getattr(args, "json", False))
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
