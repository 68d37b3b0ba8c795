"""L1's own seccomp profile (``kernel``, ADR-053): golden JSON, its shape, the bootstrap's
copy, and the filter loaded for real into a process on this host (root here, so every
refusal below is the filter's, not a missing privilege's)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fluffy.bootstrap import l1
from fluffy.bootstrap.engine import Engine
from fluffy.gate import rules as gate_rules
from fluffy.seccomp.compile import oci_json, to_oci
from fluffy.seccomp.generate import GENERATED, generated_path
from fluffy.seccomp.kernel_profile import (
    GUARDED,
    KERNEL_PROFILE,
    NO_OWNER,
    REMOVED,
    SPECIAL_BITS,
)

#: Never allowed to the kernel either (test_seccomp's list, less setpriv's drop).
DANGEROUS = {
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
    "chroot", "unshare", "setns", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    "open_by_handle_at", "name_to_handle_at", "personality", "reboot", "setxattr",
    "lsetxattr", "fsetxattr", "pidfd_getfd",
}  # fmt: skip


def _allowed(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in profile["syscalls"] if e["action"] == "SCMP_ACT_ALLOW"]


def test_the_checked_in_kernel_profile_is_the_generated_one() -> None:
    assert generated_path(KERNEL_PROFILE) == GENERATED / "l1" / "kernel.json"
    assert generated_path(KERNEL_PROFILE).read_text() == oci_json(KERNEL_PROFILE), (
        "seccomp/generated is stale: run `python -m fluffy.seccomp.generate`"
    )
    assert l1.PROFILE.resolve() == generated_path(KERNEL_PROFILE).resolve()


def test_the_engine_gate_never_takes_the_kernel_profile_for_a_sandbox() -> None:
    trusted = gate_rules.load_profiles(GENERATED)
    assert generated_path(KERNEL_PROFILE) not in trusted.values()
    for owner in (None, (0, 0), (1000, 1000)):
        text = json.dumps(to_oci(KERNEL_PROFILE, owner))
        assert json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")) not in trusted


def test_modes_owners_kinds_and_links_are_checked_or_denied() -> None:
    profile = to_oci(KERNEL_PROFILE)
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    names = {n for e in _allowed(profile) for n in e["names"]}
    assert not names & DANGEROUS and not names & REMOVED
    for entry in _allowed(profile):
        if set(entry["names"]) & GUARDED:
            assert entry.get("args"), entry  # never unconditionally
    modes = [e for e in _allowed(profile) if {"chmod", "fchmodat", "mkdir"} & set(e["names"])]
    assert modes and all(
        e["args"] == [{"index": e["args"][0]["index"], "op": "SCMP_CMP_MASKED_EQ",
                       "value": SPECIAL_BITS, "valueTwo": 0}]
        for e in modes
    )  # fmt: skip
    (chown,) = [e for e in _allowed(profile) if "fchown" in e["names"]]
    assert [a["valueTwo"] for a in chown["args"]] == list(NO_OWNER)
    (openat2,) = [e for e in profile["syscalls"] if e["names"] == ["openat2"]]
    assert openat2["action"] == "SCMP_ACT_ERRNO" and openat2["errnoRet"] == 38


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_the_bootstrap_gives_l1_the_profile_with_the_projects_owner(
    tmp_path: Path, kind: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    if os.geteuid() == 0:
        os.chown(project, 0, 1234)  # a root-owned project whose group is a user's
    owner = (project.stat().st_uid, project.stat().st_gid)
    (tmp_path / "home" / "projects" / "abc").mkdir(parents=True)
    run = tmp_path / "home" / "projects" / "abc" / "run"
    sock = tmp_path / "engine.sock"
    sock.write_text("")
    body = l1.spec("img", str(project), "abc", str(run), str(run.parent / "state"),
                   Engine(kind, str(sock)))  # fmt: skip
    options = body["HostConfig"]["SecurityOpt"]
    assert options[0] == "no-new-privileges:true" and len(options) == 2
    given = options[1].removeprefix("seccomp=")
    if kind == "podman":  # its compatible API reads a file: one L1 cannot reach
        assert given == str(run.parent.with_suffix(".seccomp.json"))
        given = Path(given).read_text()
    assert json.loads(given) == to_oci(KERNEL_PROFILE, owner)


#: Run in a child: load the kernel profile (fchown only to this process's own ids), then
#: try each case in FOLDER; print {case: "ok" | errno name}.
TRIAL = r"""
import ctypes, errno, json, os, socket, sqlite3, stat, subprocess, sys, threading
from fluffy.seccomp.compile import build_filter
folder = sys.argv[1]
me = (os.geteuid(), os.getegid())
build_filter("kernel", owner=me).load()
libc = ctypes.CDLL(None, use_errno=True)
NR = {"openat2": 437, "io_uring_setup": 425, "ptrace": 101, "unshare": 272}
def raw(name, *args):
    ctypes.set_errno(0)
    if libc.syscall(NR[name], *args) == -1:
        raise OSError(ctypes.get_errno(), name)
def at(name):
    return os.path.join(folder, name)
def made(name, mode=0o644):
    fd = os.open(at(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    return fd
def thread():
    t = threading.Thread(target=lambda: None); t.start(); t.join()
def merge_like():
    fd = made(".x.tmp", 0o600)
    os.write(fd, b"data"); os.fchmod(fd, 0o755); os.fchown(fd, *me); os.fsync(fd); os.close(fd)
    os.rename(at(".x.tmp"), at("x"))
def sqlite():
    db = sqlite3.connect(at("t.db")); db.execute("pragma journal_mode=wal")
    db.execute("create table t(x)"); db.commit(); db.close()
cases = {
    "thread": thread,
    "subprocess": lambda: subprocess.run(["/bin/true"], check=True),
    "sqlite": sqlite,
    "socket_unix": lambda: socket.socket(socket.AF_UNIX).close(),
    "socket_inet": lambda: socket.socket(socket.AF_INET).close(),
    "socket_netlink": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close(),
    "setresuid_own": lambda: os.setresuid(me[0], me[0], me[0]),
    "merge_like": merge_like,
    "mkdir_plain": lambda: os.mkdir(at("d"), 0o755),
    "chmod_4755": lambda: os.chmod(at("x"), 0o4755),
    "fchmod_2755": lambda: os.fchmod(made("g"), 0o2755),
    "fchmodat_2755": lambda: os.chmod("x", 0o2755, dir_fd=os.open(folder, os.O_RDONLY)),
    "chmod_sticky_dir": lambda: os.chmod(at("d"), 0o1777),
    "mkdir_sticky": lambda: os.mkdir(at("s"), 0o1777),
    "open_creat_4755": lambda: made("suid", 0o4755),
    "open_tmpfile_4755": lambda: os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o4755),
    "mknod_reg_4755": lambda: os.mknod(at("m"), stat.S_IFREG | 0o4755),
    "mknod_chr": lambda: os.mknod(at("null"), stat.S_IFCHR | 0o666, os.makedev(1, 3)),
    "mkfifo": lambda: os.mkfifo(at("fifo")),
    "symlink_out": lambda: os.symlink("/etc/shadow", at("shadow")),
    "fchown_other_uid": lambda: os.fchown(made("o"), 1234, me[1]),
    "fchown_other_gid": lambda: os.fchown(made("p"), me[0], 1234),
    "chown_path": lambda: os.chown(at("x"), *me),
    "lchown_path": lambda: os.lchown(at("x"), *me),
    "openat2": lambda: raw("openat2", -100, b"/", 0, 24),
    "io_uring_setup": lambda: raw("io_uring_setup", 1, 0),
    "ptrace": lambda: raw("ptrace", 0, 0, 0, 0),
    "unshare_user": lambda: raw("unshare", 0x10000000),
}
out = {}
for name, attempt in cases.items():
    try:
        attempt(); out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""

EXPECTED = {
    **dict.fromkeys(["thread", "subprocess", "sqlite", "socket_unix", "socket_inet",
                     "setresuid_own", "merge_like", "mkdir_plain"], "ok"),
    **dict.fromkeys(["socket_netlink", "chmod_4755", "fchmod_2755", "fchmodat_2755",
                     "chmod_sticky_dir", "mkdir_sticky", "open_creat_4755", "open_tmpfile_4755",
                     "mknod_reg_4755", "mknod_chr", "mkfifo", "symlink_out", "fchown_other_uid",
                     "fchown_other_gid", "chown_path", "lchown_path", "io_uring_setup", "ptrace",
                     "unshare_user"], "EPERM"),
    "openat2": "ENOSYS",
}  # fmt: skip


def test_the_kernel_profile_refuses_privileged_files_and_lets_a_merge_work(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-c", TRIAL, str(folder)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXPECTED
    made = folder / "x"
    assert made.read_bytes() == b"data" and made.stat().st_mode == 0o100755
    for path in folder.rglob("*"):  # nothing privileged, no device, no link was left
        info = path.lstat()
        assert not info.st_mode & SPECIAL_BITS, path
        assert stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode), path


def test_without_the_filter_the_same_process_could_do_it(tmp_path: Path) -> None:
    """Positive control: any owner may set its own file's setuid bit and make links."""
    target = tmp_path / "sh"
    target.write_bytes(b"#!/bin/sh\n")
    target.chmod(0o4755)
    assert target.stat().st_mode & 0o4000
    os.symlink("/etc/shadow", tmp_path / "shadow")
    assert (tmp_path / "shadow").is_symlink()


def test_doctor_knows_l1s_profile_from_a_default_or_another_owners(tmp_path: Path) -> None:
    from fluffy.doctor_kernel import _own_profile

    project = tmp_path / "project"
    project.mkdir()
    owner = (project.stat().st_uid, project.stat().st_gid)
    mine = json.dumps(to_oci(KERNEL_PROFILE, owner))
    saved = tmp_path / "l1.seccomp.json"
    saved.write_text(mine)
    assert _own_profile(["no-new-privileges", f"seccomp={mine}"], project)  # Docker
    assert _own_profile(["no-new-privileges", f"seccomp={saved}"], project)  # Podman
    other = json.dumps(to_oci(KERNEL_PROFILE, (owner[0] + 1, owner[1])))
    for options in ([], ["no-new-privileges"], ["seccomp=unconfined"], [f"seccomp={other}"],
                    [f"seccomp={oci_json('standard')}"], [f"seccomp={tmp_path / 'gone'}"],
                    [f"seccomp={mine}", f"seccomp={mine}"]):  # fmt: skip
        assert not _own_profile(options, project), options
