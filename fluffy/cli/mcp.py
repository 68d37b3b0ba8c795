"""`fluffy mcp add|list|remove`: the project's MCP servers, each in its own sandbox.

``add`` checks the name and the command, downloads the server's packages on the host
(wheels only) and builds its image offline (:mod:`fluffy.images.mcpenv`), starts the
server once in its sandbox to list its tools, shows what it would offer, and records it
in ``.fluffy/mcp/NAME.json`` when the user agrees (on a terminal, or ``--yes``).  A
step that fails stops there with the reason: nothing is recorded.  ``--allow-host``
records the hosts the server may reach through the kernel's proxy (each must also be in
policy.yaml's ``network_whitelist``: one that is not is warned about, not refused); the
probe that lists the tools runs without network all the same.  ``remove`` deletes
the record.  When a kernel runs for the project, both ask it to read the records again
(``mcp.reload``, audited), so the change applies to the next model request.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy.cli.render import print_json, stderr, stdout
from fluffy.errors import FluffyError, McpServerInvalid, McpServerNotFound

EXIT_OK, EXIT_REFUSED = 0, 1


def _project(args: argparse.Namespace) -> Path:
    project = Path(args.project or ".").expanduser().resolve()
    if not project.is_dir():
        raise McpServerInvalid(
            f"the project folder {project} does not exist",
            fix="Run it in your project, or pass --project DIR.",
        )
    return project


def _env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise McpServerInvalid(
                f"--env {pair!r} is not NAME=VALUE", fix="Write it as --env NAME=VALUE."
            )
        env[key] = value
    return env


def _command(raw: list[str]) -> list[str]:
    command = raw[1:] if raw[:1] == ["--"] else raw
    if not command:
        raise McpServerInvalid(
            "no command to start the server",
            why="the server's command comes after `--`",
            fix="e.g. `fluffy mcp add time --pip mcp-server-time -- mcp-server-time`.",
        )
    return command


def _draft(args: argparse.Namespace) -> Any:
    """The record as far as the arguments go (image and tools come later)."""
    from pydantic import ValidationError

    from fluffy.host.mcp import McpServer, check_name

    check_name(args.name)
    try:
        return McpServer(
            name=args.name,
            command=_command(args.command),
            pip=list(args.pip or []),
            path=str(Path(args.path).expanduser().resolve()) if args.path else None,
            image="fluffy/mcp-server:" + "0" * 24,
            env=_env(args.env or []),
            allowed_hosts=list(args.allow_host or []),
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise McpServerInvalid(f"cannot register {args.name}: {problems}") from None


def _unlisted_hosts(project: Path, hosts: list[str]) -> tuple[list[str], str | None]:
    """The hosts the policy's network_whitelist does not admit (the proxy will refuse
    them), and why none could be checked (a policy that does not load)."""
    from fluffy.host.policy import AllowList, Rule
    from fluffy.host.project import project_policy

    if not hosts:
        return [], None
    try:
        allow = AllowList.from_entries(project_policy(project)[0].network_whitelist)
    except FluffyError as exc:
        return list(hosts), exc.what
    return [host for host in hosts if not allow.covers(Rule.read(host))], None


def _host_warnings(project: Path, hosts: list[str]) -> list[str]:
    unlisted, problem = _unlisted_hosts(project, hosts)
    if not unlisted:
        return []
    entries = "".join(f"\n    - '{host}'" for host in unlisted)
    said = f" (the policy does not load: {problem})" if problem else ""
    return [
        f"{', '.join(unlisted)} {'is' if len(unlisted) == 1 else 'are'} not in the "
        f"network_whitelist of .fluffy/policy.yaml{said}: the kernel's proxy refuses "
        "them until the policy allows them too. To let the server reach them, add to "
        f".fluffy/policy.yaml:\n  network_whitelist:{entries}\nthen restart fluffy (the "
        "engine gate reads the list when the kernel starts)."
    ]


def _base_image(engine: Any) -> str:
    """The code-executor image a server's image is built FROM (built if missing)."""
    from fluffy.cli.progress import ConsoleReporter
    from fluffy.images.builder import build_images

    reporter = ConsoleReporter(stderr, verbose=False)
    refs = {s.name: s.ref for s in build_images(engine, ["code-executor"], reporter=reporter)}
    return refs["code-executor"]


def _probe(
    engine: Any, draft: Any, project: Path, base: str
) -> tuple[list[Any], str, dict[str, str]]:
    """Start the server once in its sandbox: its tools, name/version, tools left out."""
    from fluffy.host.engine import ContainerManager, open_runtime
    from fluffy.host.mcp import McpConnection

    manager = ContainerManager(open_runtime(engine), {"code-executor": base, "mcp-server": base})

    async def run() -> tuple[list[Any], str, dict[str, str]]:
        connection = McpConnection(manager, draft, project=project)
        try:
            await connection.start()
            return list(connection.tools), connection.server_info, dict(connection.skipped)
        finally:
            await connection.close()

    try:
        return asyncio.run(run())
    except FluffyError as exc:
        raise McpServerInvalid(
            f"the server {draft.name} did not start in its sandbox: {exc.what}",
            why=exc.why,
            fix="Check the command (it runs with the packages' venv first on PATH, the "
            "project read-only at /workspace, and no network: the probe that lists its "
            "tools runs without the proxy, even with --allow-host). Nothing was recorded.",
        ) from exc
    finally:
        manager.close()


def _confirmed(args: argparse.Namespace, name: str) -> bool:
    if args.yes:
        return True
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise McpServerInvalid(
            f"{name} was not added: there is no terminal to confirm on and --yes was not given",
            why="adding a server is the user's decision",
            fix="Run it on a terminal and answer yes, or pass --yes.",
        )
    answer = input(f"Add the MCP server {name}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _show(server: Any, built: bool) -> None:
    stdout.print(f"[bold]{escape(server.name)}[/]  {escape(server.server_info)}")
    stdout.print(f"  command  {escape(' '.join(server.command))}")
    if server.pip:
        stdout.print(
            f"  packages {escape(', '.join(server.pip))} "
            f"({len(server.packages)} with what they need)"
        )
    if server.path:
        stdout.print(f"  folder   {escape(server.path)} (copied into the image)")
    stdout.print(f"  image    {escape(server.image)}{' (built now)' if built else ''}")
    network = (
        f"network only to {', '.join(server.allowed_hosts)} (through the kernel's proxy)"
        if server.allowed_hosts
        else "no network"
    )
    stdout.print(f"  sandbox  {escape(network)}, project read-only, 512 MiB, started on first use")
    for tool in server.tools:
        first = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
        stdout.print(f"  tool     mcp.{escape(server.name)}.{escape(tool.name)}: {escape(first)}")
    stdout.print(
        f"  policy   each call asks you first, unless a rule allows mcp.{escape(server.name)}.*"
    )


def _ask_kernel(project: Path, method: str) -> dict[str, Any] | None:
    """``method``'s answer from the project's running kernel (None: no kernel runs)."""
    from fluffy.cli.connect import CALL_TIMEOUT_S
    from fluffy.cli.plugin import _kernel_socket
    from fluffy.ipc.client import SyncClient

    sock = _kernel_socket(str(project))
    if sock is None:
        return None
    with SyncClient(str(sock), timeout=CALL_TIMEOUT_S) as client:
        answer: dict[str, Any] = client.call(method, {})
    return answer


def _reload(project: Path) -> dict[str, Any] | None:
    """Ask a running kernel to read the records again (None: no kernel runs)."""
    return _ask_kernel(project, "mcp.reload")


def cmd_add(args: argparse.Namespace) -> int:
    from fluffy.host.engine import connect
    from fluffy.host.mcp import load_records, save_record
    from fluffy.images.mcpenv import ensure_server_image

    project = _project(args)
    draft = _draft(args)
    existing, _ = load_records(project)
    if draft.name in existing and not args.replace:
        raise McpServerInvalid(
            f"the project has an MCP server named {draft.name} already",
            fix=f"Pass --replace to register it anew, or `fluffy mcp remove {draft.name}`.",
        )
    say = stderr.print if args.json else stdout.print
    for key in draft.env:
        if any(word in key.upper() for word in ("KEY", "TOKEN", "SECRET", "PASSWORD")):
            stderr.print(
                f"[yellow]warning:[/] {escape(key)} looks like a secret: --env values are "
                "kept in .fluffy/mcp/ in the project, where the model and other servers "
                "can read them; prefer a server that needs no secret here"
            )
    warnings = _host_warnings(project, draft.allowed_hosts)
    for warning in warnings:
        stderr.print(f"[yellow]warning:[/] {escape(warning)}")
    started = time.monotonic()
    with connect() as engine:
        base = _base_image(engine)
        built = ensure_server_image(
            engine,
            base,
            pip=draft.pip,
            path=Path(draft.path) if draft.path else None,
            say=lambda text: say(f"· {escape(text)}"),
        )
        draft = draft.model_copy(update={"image": built.image, "packages": built.packages})
        quiet = " (without network: the proxy serves its calls)" if draft.allowed_hosts else ""
        say(f"· starting {escape(draft.name)} in its sandbox to list its tools{quiet}")
        tools, info, skipped = _probe(engine, draft, project, base)
    server = draft.model_validate(
        {**draft.model_dump(), "tools": [t.model_dump() for t in tools], "server_info": info,
         "added_at": time.time()}
    )  # fmt: skip
    if not args.json:
        _show(server, built.built)
        for name, why in sorted(skipped.items()):
            stdout.print(f"  [yellow]left out[/] {escape(name)}: {escape(why)}")
    if not _confirmed(args, server.name):
        stdout.print("not added: nothing was recorded")
        return EXIT_REFUSED
    path = save_record(project, server)
    reloaded = _reload(project)
    if args.json:
        print_json(
            {
                "ok": True,
                "server": server.model_dump(mode="json"),
                "tools_left_out": skipped,
                "record": str(path),
                "kernel_reloaded": reloaded is not None,
                "warnings": warnings,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
        return EXIT_OK
    stdout.print(f"added {escape(server.name)} ({len(server.tools)} tools) to {escape(str(path))}")
    stdout.print(
        "the running kernel offers its tools from the next request"
        if reloaded is not None
        else "a kernel offers its tools when it starts"
    )
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from fluffy.host.mcp import load_records

    project = _project(args)
    servers, problems = load_records(project)
    listed = _ask_kernel(project, "mcp.list")
    live = {row["name"]: row for row in (listed or {}).get("servers", [])}
    if args.json:
        rows = [
            {**server.model_dump(mode="json"), "kernel": live.get(name)}
            for name, server in sorted(servers.items())
        ]
        print_json({"servers": rows, "problems": problems})
        return EXIT_OK
    for name, server in sorted(servers.items()):
        state = live.get(name)
        running = (
            "running" if state and state.get("running") else "stopped" if state else "no kernel"
        )
        tools = ", ".join(t.name for t in server.tools)
        stdout.print(
            f"{escape(name)}  {running}  {escape(' '.join(server.command))}  tools: {escape(tools)}"
        )
    for file, problem in sorted(problems.items()):
        stdout.print(f"[red]{escape(file)}[/]  not loaded: {escape(problem)}")
    if not servers and not problems:
        stdout.print("no MCP servers (add one: fluffy mcp add NAME --pip PKG -- CMD)")
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    from fluffy.host.mcp import remove_record

    project = _project(args)
    if not remove_record(project, args.name):
        raise McpServerNotFound(
            f"the project has no MCP server named {args.name}",
            why="there is no .fluffy/mcp/ record with that name",
        )
    reloaded = _reload(project)
    if args.json:
        print_json({"ok": True, "removed": args.name, "kernel_reloaded": reloaded is not None})
    else:
        stdout.print(
            f"removed {escape(args.name)}"
            + ("; the running kernel stopped it" if reloaded is not None else "")
        )
    return EXIT_OK


def add_parser(sub: Any) -> None:
    mcp = sub.add_parser("mcp", help="the project's MCP servers, each in its own sandbox")
    actions = mcp.add_subparsers(dest="mcp_command", metavar="ACTION", required=True)
    add = actions.add_parser(
        "add",
        help="register a stdio MCP server: fluffy mcp add NAME [--pip PKG] [--path DIR] "
        "[--allow-host HOST[:PORT]] -- CMD",
    )
    add.add_argument("name", help="its name: tools are offered as mcp.NAME.TOOL")
    add.add_argument("--pip", action="append", metavar="PKG", help="a package to install")
    add.add_argument("--path", help="a folder with the server's code (copied into its image)")
    add.add_argument("--env", action="append", metavar="NAME=VALUE", help="a variable")
    add.add_argument(
        "--allow-host",
        action="append",
        metavar="HOST[:PORT]",
        help="a host it may reach through the kernel's proxy (port 443 unless given; "
        "network_whitelist syntax, and policy.yaml's network_whitelist must allow it too)",
    )
    add.add_argument("--replace", action="store_true", help="register an existing name anew")
    add.add_argument("--yes", "-y", action="store_true", help="add without asking")
    add.add_argument("--project", help="the project folder (default: .)")
    add.add_argument("--json", action="store_true")
    add.add_argument("command", nargs="*", help="-- CMD [ARGS ...] (after --)")
    add.set_defaults(func=cmd_add)
    listing = actions.add_parser("list", help="the registered servers and whether they run")
    listing.add_argument("--project", help="the project folder (default: .)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    remove = actions.add_parser("remove", help="unregister a server")
    remove.add_argument("name")
    remove.add_argument("--project", help="the project folder (default: .)")
    remove.add_argument("--json", action="store_true")
    remove.set_defaults(func=cmd_remove)
