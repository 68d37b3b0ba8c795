"""The profiles: golden JSON, structure, and the filter loaded for real on this host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluffy.seccomp.cases import SECCOMP_CASES, expected
from fluffy.seccomp.compile import oci_json, to_oci
from fluffy.seccomp.generate import generated_path
from fluffy.seccomp.rules import (
    CLONE_NAMESPACES,
    CLONE_THREAD,
    ENOSYS,
    PROFILES,
    RULES,
    rules_for,
)

DANGEROUS = {
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "setuid",
    "setgid",
    "setreuid",
    "setresuid",
    "setgroups",
    "capset",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "io_uring_setup",
    "userfaultfd",
    "open_by_handle_at",
    "personality",
    "reboot",
}


@pytest.mark.parametrize("profile", PROFILES)
def test_checked_in_profile_equals_the_generated_one(profile: str) -> None:
    assert generated_path(profile).read_text() == oci_json(profile), (
        "seccomp/generated is stale: run `python -m fluffy.seccomp.generate`"
    )


@pytest.mark.parametrize("profile", PROFILES)
def test_default_is_eperm_and_dangerous_syscalls_are_never_allowed(profile: str) -> None:
    data = to_oci(profile)
    assert (data["defaultAction"], data["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    allowed = {
        n
        for entry in data["syscalls"]
        if entry["action"] == "SCMP_ACT_ALLOW"
        for n in entry["names"]
    }
    assert not allowed & DANGEROUS


def test_every_rule_has_a_reason_and_profiles_only_grow() -> None:
    assert all(rule.reason.strip() for rule in RULES)
    sizes = [len(rules_for(p)) for p in PROFILES]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3


def test_clone_is_filtered_on_its_flags() -> None:
    strict = [e for e in to_oci("strict")["syscalls"] if "clone" in e["names"]]
    assert strict == [
        {
            "action": "SCMP_ACT_ALLOW",
            "names": ["clone"],
            "comment": strict[0]["comment"],
            "args": [
                {
                    "index": 0,
                    "op": "SCMP_CMP_MASKED_EQ",
                    "value": CLONE_THREAD | CLONE_NAMESPACES,
                    "valueTwo": CLONE_THREAD,
                }
            ],
        }
    ]
    clone3 = [e for e in to_oci("strict")["syscalls"] if "clone3" in e["names"]]
    assert clone3[0]["action"] == "SCMP_ACT_ERRNO" and clone3[0]["errnoRet"] == ENOSYS


def test_only_standard_net_may_create_inet_sockets() -> None:
    for profile in PROFILES:
        families = sorted(
            arg["value"]
            for entry in to_oci(profile)["syscalls"]
            if entry["names"] == ["socket"]
            for arg in entry["args"]
        )
        assert families == ([1, 2, 10] if profile == "standard-net" else [1])


def _trial(profile: str, cases: list[str], tmp_path: Path) -> dict[str, object]:
    env = {**os.environ, "FLUFFY_PROBE_TMP": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "fluffy.sandboxes.seccomp_trial", profile, *cases],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("profile", PROFILES)
def test_filter_loaded_on_this_host_gives_the_expected_errno(profile: str, tmp_path: Path) -> None:
    """The same cases the escape suite runs in containers, against libseccomp's build."""
    want = expected(SECCOMP_CASES, profile)
    assert _trial(profile, list(want), tmp_path) == want


def test_without_a_filter_the_probe_would_succeed(tmp_path: Path) -> None:
    """Positive control: the allowed cases and the distinguishing ones run unfiltered."""
    from fluffy.sandboxes import probe

    os.environ["FLUFFY_PROBE_TMP"] = str(tmp_path)
    try:
        got = probe.run(["thread", "fork", "socket_inet", "setuid_self", "clone3"])
    finally:
        del os.environ["FLUFFY_PROBE_TMP"]
    assert got["thread"] == got["fork"] == got["socket_inet"] == got["setuid_self"] == "ok"
    assert got["clone3"] != "ENOSYS" or sys.platform != "linux"


TSYNC_SCRIPT = r"""
import ctypes, errno, threading
from fluffy.seccomp.compile import build_filter
libc = ctypes.CDLL(None, use_errno=True)
result = []
started, go = threading.Event(), threading.Event()
def worker():
    started.set(); go.wait(5)
    ctypes.set_errno(0)
    rc = libc.syscall(110 if __import__("platform").machine() == "x86_64" else 173)  # getppid
    result.append("EPERM" if rc == -1 and ctypes.get_errno() == errno.EPERM else "allowed")
t = threading.Thread(target=worker); t.start(); started.wait(5)
build_filter("standard", extra_deny=("getppid",)).load()
go.set(); t.join(5)
print(result[0])
"""


def test_a_tighter_filter_covers_threads_that_already_run() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", TSYNC_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "EPERM"


def test_strict_refuses_unnamed_tmpfiles_in_the_oci_profile_too() -> None:
    from fluffy.seccomp.rules import O_TMPFILE

    strict = to_oci("strict")["syscalls"]
    masks = [a["value"] for e in strict if e["names"] == ["openat"] for a in e["args"]]
    assert masks and all(mask & O_TMPFILE for mask in masks)
