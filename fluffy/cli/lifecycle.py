"""`fluffy start|stop|status`: the project's kernel, through its bootstrap supervisor.

``start`` launches ``python3 -m fluffy.bootstrap run`` detached (one per project) and
returns once the kernel answers its health check; ``stop`` asks the supervisor to stop
(SIGTERM: the kernel records ``kernel_shutdown``, flushes, and the container goes);
``status`` reads the supervisor's status file and asks the kernel itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy.bootstrap.supervisor import paths, read_json, write_json
from fluffy.cli.render import print_json, status_word, stdout
from fluffy.errors import FluffyError, KernelNotRunning, KernelStartFailed
from fluffy.paths import fluffy_home, project_socket
from fluffy.process import pid_alive

START_TIMEOUT_S = 120.0


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a supervisor that exited but was not reaped yet)."""
    return pid_alive(pid) and "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return ""


def _project(args: argparse.Namespace) -> str:
    return str(Path(args.project or ".").resolve())


def _status(project: str) -> dict[str, Any] | None:
    status = read_json(paths(fluffy_home(), project)["status"])
    if status is None or not _alive(int(status.get("pid", 0))):
        return None
    return dict(status)


def _last_error(log: Path) -> dict[str, Any] | None:
    try:
        lines = log.read_text().strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines[-20:]):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            return error
    return None


def start_kernel(project: str, *, yes: bool = False) -> dict[str, Any]:
    """`fluffy start`: the bootstrap detached (it outlives this command); ``yes``: the
    person approved what start-up would ask (``--yes``)."""
    current = _status(project)
    if current is not None and current.get("health") == "healthy":
        return current
    return launch_supervisor(project, detach=True, confirm=approver(yes))[0]


def _ask(question: str) -> bool:
    from fluffy.cli.connect import ask  # (the settings' import time: only when asked)

    return ask(question)


def approver(yes: bool) -> Callable[[str], bool]:
    """What answers start-up's questions (a network entry new in policy.yaml): the
    person at the terminal, or ``--yes``, which says what it approved."""
    if not yes:
        return _ask

    def approved(question: str) -> bool:
        stdout.print(f"{status_word('warn')} {escape(question)} yes (--yes)")
        return True

    return approved


def access_problem(project: str) -> str | None:
    """Why the kernel's user could not read the project folder (None: it can).

    The kernel is the project's owner, or for a root-owned project uid 10000 holding the
    file capabilities (bootstrap/l1.py); only another user's folder can be closed to it."""
    from fluffy.bootstrap.l1 import KERNEL_UID, kernel_user

    info = Path(project).stat()
    uid, gid = (int(x) for x in kernel_user(project).split(":"))
    shift = 6 if info.st_uid == uid else 3 if info.st_gid == gid else 0
    if (uid == KERNEL_UID and info.st_uid == 0) or (info.st_mode >> shift) & 5 == 5:
        return None
    owner = "root" if info.st_uid == 0 else f"uid {info.st_uid}"
    return f"uid {uid} cannot read {project} (mode {info.st_mode & 0o777:o}, owner {owner})"


def write_network_allowlist(
    project: str,
    path: Path,
    confirm: Callable[[str], bool] | None = None,
    prior_path: Path | None = None,
) -> list[str]:
    """The engine gate's copy of policy.yaml's ``network_whitelist`` (fluffy.gate.net),
    read here on the host as the kernel starts: L1 has no network, and the gate dials only
    what this file admits.  A policy that does not load admits nothing (the kernel then
    reports the policy's error at start-up).

    policy.yaml lives in the project, which the kernel can write: an entry not in the
    gate's previous list is let through only when ``confirm`` (the person at the
    terminal) says yes; the first list for a project is taken as written.  ``prior_path``:
    where the previous list was put aside (default: ``path`` itself).  Returns the
    entries left out; a policy.yaml that does not load raises its error (file:line:
    field, as `fluffy policy validate` says it), with no list at ``path`` (nothing
    admitted)."""
    from fluffy.host.policy import AllowList
    from fluffy.host.project import project_policy

    try:
        entries = project_policy(Path(project))[0].network_whitelist
        rules = AllowList.from_entries(entries).rules
    except FluffyError:
        path.unlink(missing_ok=True)  # the gate admits nothing (no list: nothing)
        raise
    before = prior_path or path
    prior = (read_json(before) or {}).get("rules") if before.exists() else None
    wanted = [[r.host, r.port, r.wildcard] for r in rules]
    new: list[str] = []
    if isinstance(prior, list):  # not the first list: widening needs a yes
        new = [r.entry for r, w in zip(rules, wanted, strict=True) if w not in prior]
        ask = f"policy.yaml's network_whitelist now also lets the kernel reach {', '.join(new)}"
        if new and not (confirm is not None and confirm(f"{ask}. Allow it?")):
            wanted = [w for w in wanted if w in prior]
        else:
            new = []
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json(path, {"rules": wanted})
    return new


#: kernel/tools/sandbox/sandboxes.py PINNED_IMAGES (not imported: the engine SDK's import time)
PINNED_IMAGES = "images.json"


def pin_images(state: Path) -> None:
    """Name the sandbox images for the kernel (``<state>/images.json``, which L1 reads):
    the ones this fluffy built (its image manifest, where the kernel image comes from
    too), so a kernel never picks another checkout's or version's newer build by label.
    No manifest: the file goes, and the kernel takes the newest exact content-hash tag."""
    from fluffy.paths import state_dir

    target = state / PINNED_IMAGES
    try:  # the manifest images/builder.py writes (`fluffy images build`)
        built = json.loads((state_dir() / "images.json").read_text())["images"]
        pinned = {str(name): str(entry["ref"]) for name, entry in built.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        target.unlink(missing_ok=True)
        return
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_json(target, pinned)


#: the longest path a Unix socket can be bound or reached at (sun_path, NUL-terminated)
SOCKET_PATH_MAX = 107


def socket_path_problem(p: dict[str, Path]) -> KernelStartFailed | None:
    """The error for a fluffy home so deep that the kernel's sockets cannot exist in it
    (the bootstrap would fail binding its engine gate, with only a traceback to show)."""
    sockets = (p["run"] / "kernel.sock", p["gate"] / "engine.sock", p["gate"] / "net.sock")
    longest = max(sockets, key=lambda path: len(os.fsencode(path)))
    size = len(os.fsencode(longest))
    if size <= SOCKET_PATH_MAX:
        return None
    home = p["base"].parent.parent
    room = len(os.fsencode(home)) - size + SOCKET_PATH_MAX
    return KernelStartFailed(
        "fluffy's folder is too deep for the kernel's sockets",
        why=f"{longest} is {size} bytes; a Unix socket's path can be at most "
        f"{SOCKET_PATH_MAX}, and fluffy keeps each project's sockets under {home}",
        fix=f"Set FLUFFY_HOME to a folder of at most {room} bytes "
        "(e.g. `export FLUFFY_HOME=~/.fluffy`), then run the command again.",
    )


def launch_supervisor(
    project: str, *, detach: bool, confirm: Callable[[str], bool] | None = None
) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """Start the bootstrap as L1's supervisor and wait until the kernel is healthy.

    Detached (`fluffy start`) it gets its own session; in the foreground (`fluffy`) it
    stays this process's child, and the caller stops it when the user leaves.
    """
    problem = access_problem(project)
    if problem is not None:
        raise KernelStartFailed(
            f"the kernel cannot use the project {project}",
            why=problem,
            fix=f"Let the kernel's user read it (e.g. `chmod u+rx {project}` as its owner), or "
            "run fluffy as the project's owner.",
        )
    from fluffy.host.engine import engine_access_problem

    denied = engine_access_problem()  # the bootstrap would only say "no engine answers"
    if denied is not None:
        raise denied
    p = paths(fluffy_home(), project)
    too_long = socket_path_problem(p)
    if too_long is not None:
        raise too_long
    p["base"].parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pin_images(p["state"])
    # the gate's dialler admits nothing while the new list is made (it reads the file at
    # each connection): the previous one is put aside first, and read from there
    net, approved = p["base"] / "net.json", p["base"] / "net.approved.json"
    if net.exists():
        net.replace(approved)
    with p["log"].open("ab") as log:
        proc = subprocess.Popen(
            # -P and cwd: the current folder is usually the project, whose own `fluffy/`
            # or `sitecustomize.py` must never be what this Python imports
            [
                sys.executable,
                "-P",
                "-m",
                "fluffy.bootstrap",
                "run",
                "--project",
                str(Path(project).resolve()),
            ],
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=detach,
        )
    # read while the kernel's container starts (the policy's and the project config's
    # imports and validation, ~180 ms): the kernel reads the test command's approval at
    # each test run, never at its start, so a question answered now is in time
    try:
        from fluffy.cli.testcommand import ask_at_start

        ask_at_start(Path(project), p["state"], _ask)  # the terminal's yes only, never --yes
        left_out = write_network_allowlist(project, net, confirm, prior_path=approved)
    except FluffyError as exc:  # a broken policy.yaml: said now, not as a crash loop
        proc.terminate()
        proc.wait(timeout=60)
        if approved.exists():  # the list approved before stays the one to compare with
            approved.replace(net)
        raise KernelStartFailed(
            f"the kernel was not started: {exc.what}",
            why=f"the project's policy does not load ({exc.code})",
            fix="Correct .fluffy/policy.yaml (`fluffy policy validate .fluffy/policy.yaml` "
            "checks it; `fluffy init --force` writes the defaults), then start again.",
        ) from exc
    except BaseException:  # (an interrupted question too): no kernel on a half start
        proc.terminate()
        raise
    approved.unlink(missing_ok=True)
    if left_out:
        stdout.print(
            f"{status_word('warn')} network: {escape(', '.join(left_out))} left out "
            "(new in policy.yaml since the last start, not approved); run fluffy in a "
            "terminal to approve them, or add --yes"
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            error = _last_error(p["log"]) or {}
            raise KernelStartFailed(
                error.get("what", f"the bootstrap exited with {proc.returncode}"),
                why=error.get("why") or None,
                fix=error.get("fix") or f"See {p['log']}.",
            )
        status = read_json(p["status"])
        if status and status.get("pid") == proc.pid and status.get("health") == "healthy":
            return status, proc
        time.sleep(0.002)  # a read of a small file: the person waits for every poll's rest
    proc.terminate()
    raise KernelStartFailed(
        f"the kernel was not healthy within {START_TIMEOUT_S:.0f} s",
        fix=f"See {p['log']}.",
        why="it did not answer kernel.ping on its socket in time; it may have crashed while "
        "starting",
    )


def stop_kernel(project: str, timeout: float = 60.0) -> bool:
    status = _status(project)
    if status is None:
        return False
    pid = int(status["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise KernelStartFailed(
                f"the supervisor (pid {pid}) did not stop in {timeout:.0f} s",
                why="it did not exit after SIGTERM within the wait",
            )
        time.sleep(0.002)  # a read of /proc: the person waits for every poll's rest
    return True


def kernel_status(project: str) -> dict[str, Any]:
    from fluffy.ipc.client import SyncClient

    status = _status(project)
    if status is None:
        raise KernelNotRunning(f"no kernel is running for {project}")
    sock = project_socket(project)
    report: dict[str, Any] = {
        "project": project,
        "health": status.get("health"),
        "runtime": status.get("runtime"),
        "container_id": status.get("container_id"),
        "restarts": status.get("restarts", 0),
        "uptime_s": round(time.time() - float(status.get("started_at", time.time())), 1),
        "supervisor_pid": status.get("pid"),
        "socket": str(sock),
        "state_dir": str(paths(fluffy_home(), project)["state"]),
    }
    try:
        with SyncClient(str(sock), timeout=5) as client:
            pong = client.call("kernel.ping")
            session = client.call("session.get")
        report.update(
            kernel_version=pong.get("kernel_version"),
            audit_head=pong.get("audit_head"),
            memory=pong.get("memory"),
            session=session,
            reachable=True,
        )
    except (FluffyError, OSError) as exc:
        report.update(reachable=False, error=str(exc))
    return report


def cmd_start(args: argparse.Namespace) -> int:
    status = start_kernel(_project(args), yes=args.yes)
    if args.json:
        print_json({"ok": True, **status})
    else:
        stdout.print(
            f"{status_word('ok')} kernel healthy ({status.get('runtime')}, "
            f"container {str(status.get('container_id'))[:12]})"
        )
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    stopped = stop_kernel(_project(args))
    if args.json:
        print_json({"ok": True, "stopped": stopped})
    else:
        stdout.print("kernel stopped" if stopped else "no kernel was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    report = kernel_status(_project(args))
    if args.json:
        print_json(report)
        return 0 if report.get("reachable") else 1
    word = "ok" if report.get("reachable") and report.get("health") == "healthy" else "fail"
    stdout.print(
        f"{status_word(word)} kernel {escape(str(report.get('health')))}, "
        f"{report.get('runtime')}, up {report['uptime_s']} s, "
        f"{report.get('restarts')} restart(s)"
    )
    session = report.get("session") or {}
    if session:
        stdout.print(
            f"     session {session.get('session_id')}: {session.get('mode')} / "
            f"{session.get('state')}"
        )
    return 0 if word == "ok" else 1


def add_parser(sub: Any) -> None:
    for name, func, text in (
        ("start", cmd_start, "start the project's kernel (detached) and wait until healthy"),
        ("stop", cmd_stop, "stop the project's kernel cleanly"),
        ("status", cmd_status, "kernel health, uptime, runtime, container, session"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--project", help="the project folder (default: the current one)")
        command.add_argument("--json", action="store_true")
        if name == "start":
            command.add_argument(
                "--yes", "-y", action="store_true",
                help="approve network entries new in policy.yaml without asking",
            )  # fmt: skip
        command.set_defaults(func=func)
