"""The escape probe: runs inside a sandbox and tries what the sandbox must not allow.

``python3 -m fluffy.sandboxes.probe [CASE ...]`` prints one JSON object
``{case: outcome}``; an outcome is ``"ok"`` (the attempt succeeded) or the errno name it
failed with (``"EPERM"``), or a fact (a list, a number) for the ``facts`` cases.  It never
sends network traffic: network isolation is shown by the interfaces and routes that
exist.  Standard library only (it runs in every L2 image).

Expected outcomes per template are in :mod:`fluffy.seccomp.cases`.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long

#: Syscall numbers (x86_64, aarch64) for raw attempts that libc has no wrapper for, or
#: whose wrapper would hide the errno.
_NR: dict[str, tuple[int, int]] = {
    "ptrace": (101, 117),
    "mount": (165, 40),
    "umount2": (166, 39),
    "chroot": (161, 51),
    "pivot_root": (155, 41),
    "setuid": (105, 146),
    "unshare": (272, 97),
    "setns": (308, 268),
    "clone": (56, 220),
    "clone3": (435, 435),
    "keyctl": (250, 219),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "kexec_load": (246, 104),
    "init_module": (175, 105),
    "io_uring_setup": (425, 425),
    "userfaultfd": (323, 282),
}
_ARCH = 0 if platform.machine() in ("x86_64", "AMD64") else 1

SIGCHLD = 17
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
PTRACE_TRACEME = 0
KEYCTL_GET_KEYRING_ID = 0
KEY_SPEC_SESSION_KEYRING = -3


def _syscall(name: str, *args: int) -> int:
    """Raw syscall; returns the result, or raises OSError with the errno."""
    ctypes.set_errno(0)
    result = int(_LIBC.syscall(_NR[name][_ARCH], *[ctypes.c_long(a) for a in args]))
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def _clone_child(flags: int) -> None:
    """clone() like fork with ``flags``; the child exits at once."""
    pid = _syscall("clone", flags | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _spawn() -> None:
    import subprocess

    subprocess.run(["true"], check=True)


def _thread() -> None:
    box: list[int] = []
    worker = threading.Thread(target=lambda: box.append(1))
    worker.start()
    worker.join()
    if box != [1]:
        raise OSError(errno.EIO, "thread did not run")


def _socket(family: int) -> Callable[[], None]:
    def attempt() -> None:
        socket.socket(family, socket.SOCK_STREAM).close()

    return attempt


def _write(path: str) -> Callable[[], None]:
    def attempt() -> None:
        target = Path(path)
        with target.open("w") as handle:
            handle.write("probe")
        target.unlink()

    return attempt


def _exec_written(path: str) -> None:
    """Write a script at ``path`` and run it (a noexec mount refuses: EACCES)."""
    import subprocess

    target = Path(path)
    target.write_text("#!/bin/sh\nexit 0\n")
    try:
        target.chmod(0o755)
        subprocess.run([str(target)], check=True)
    finally:
        target.unlink()


def _read(path: str) -> Callable[[], None]:
    def attempt() -> None:
        Path(path).read_bytes()

    return attempt


def _tmpfile() -> None:
    """An unnamed file (O_TMPFILE needs no O_CREAT): must not slip past strict."""
    fd = os.open(os.environ.get("FLUFFY_PROBE_TMP", "/tmp"), os.O_WRONLY | os.O_TMPFILE, 0o600)
    os.close(fd)


def _engine_socket() -> None:
    """Look for any container-engine socket; connecting to one would be an escape."""
    for candidate in (
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/run/podman/podman.sock",
        "/run/containerd/containerd.sock",
        "/var/run/containerd.sock",
    ):
        if os.path.exists(candidate):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(candidate)
            return
    for root, dirs, files in os.walk("/", onerror=lambda _e: None):
        dirs[:] = [d for d in dirs if not (root == "/" and d in ("proc", "sys", "dev"))]
        for name in files:
            path = os.path.join(root, name)
            try:
                is_socket = stat.S_ISSOCK(os.lstat(path).st_mode)
            except OSError:
                continue
            if is_socket and ("docker" in name or "podman" in name or "containerd" in name):
                raise RuntimeError(f"engine socket visible at {path}")
    raise OSError(errno.ENOENT, "no engine socket")


ATTEMPTS: dict[str, Callable[[], object]] = {
    "thread": _thread,
    "fork": _fork,
    "spawn": _spawn,
    "clone_newuser": lambda: _clone_child(CLONE_NEWUSER),
    "clone_newns": lambda: _clone_child(CLONE_NEWNS),
    "clone3": lambda: _syscall("clone3", 0, 0),
    "unshare_newuser": lambda: _syscall("unshare", CLONE_NEWUSER),
    "setns": lambda: _syscall("setns", 0, 0),
    "socket_unix": _socket(socket.AF_UNIX),
    "socket_inet": _socket(socket.AF_INET),
    "socket_inet6": _socket(socket.AF_INET6),
    "ptrace_traceme": lambda: _syscall("ptrace", PTRACE_TRACEME, 0, 0, 0),
    "mount": lambda: _syscall("mount", 0, 0, 0, 0, 0),
    "umount2": lambda: _syscall("umount2", 0, 0),
    "chroot": lambda: _syscall("chroot", 0),
    "pivot_root": lambda: _syscall("pivot_root", 0, 0),
    "setuid_self": lambda: _syscall("setuid", os.getuid()),
    "keyctl": lambda: _syscall("keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0),
    "bpf": lambda: _syscall("bpf", 0, 0, 0),
    "perf_event_open": lambda: _syscall("perf_event_open", 0, 0, -1, -1, 0),
    "kexec_load": lambda: _syscall("kexec_load", 0, 0, 0, 0),
    "init_module": lambda: _syscall("init_module", 0, 0, 0),
    "io_uring_setup": lambda: _syscall("io_uring_setup", 1, 0),
    "userfaultfd": lambda: _syscall("userfaultfd", 0),
    "read_file": _read("/etc/os-release"),
    "tmpfile": _tmpfile,
    "write_tmp": _write(os.environ.get("FLUFFY_PROBE_TMP", "/tmp") + "/fluffy-probe"),
    "write_project": _write("/workspace/fluffy-probe"),
    "write_rootfs": _write("/etc/fluffy-probe"),
    "write_output": _write("/output/fluffy-probe"),
    "exec_output": lambda: _exec_written("/output/fluffy-probe.sh"),
    "exec_tmp": lambda: _exec_written("/tmp/fluffy-probe.sh"),
    "engine_socket": _engine_socket,
}


def _facts() -> dict[str, object]:
    status = dict(
        line.split(":", 1)
        for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    routes = Path("/proc/net/route").read_text().splitlines()[1:]
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "no_new_privs": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(),
        "cap_eff": status["CapEff"].strip(),
        "interfaces": sorted(os.listdir("/sys/class/net")),
        "routes": routes,
    }


def attempt(name: str) -> str:
    try:
        ATTEMPTS[name]()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, f"E{exc.errno}")
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return "ok"


def run(names: list[str]) -> dict[str, object]:
    result: dict[str, object] = {}
    for name in names or list(ATTEMPTS):
        if name == "facts":
            result.update(_facts())
        else:
            result[name] = attempt(name)
    return result


def main(argv: list[str] | None = None) -> int:
    names = sys.argv[1:] if argv is None else argv
    unknown = [n for n in names if n not in ATTEMPTS and n != "facts"]
    if unknown:
        print(json.dumps({"error": f"unknown cases: {unknown}"}))
        return 2
    print(json.dumps(run(names)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
