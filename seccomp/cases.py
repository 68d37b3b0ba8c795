"""What each escape-probe case must do under each profile and template.

One table drives three things: the fast host-side tests (the profile loaded with
libseccomp into a child process), the escape suite in real containers, and the sandbox
self-test of ``fluffy doctor``.  Every denial has a matching allowed case elsewhere in the
table, so a profile that denied everything could not pass.
"""

from __future__ import annotations

from fluffy.seccomp.rules import PROFILES

_ALL_EPERM = dict.fromkeys(PROFILES, "EPERM")

#: Cases decided by the seccomp filter alone: case -> profile -> outcome.
SECCOMP_CASES: dict[str, dict[str, str]] = {
    "thread": dict.fromkeys(PROFILES, "ok"),
    "read_file": dict.fromkeys(PROFILES, "ok"),
    "socket_unix": dict.fromkeys(PROFILES, "ok"),
    "fork": {"strict": "EPERM", "standard": "ok", "standard-net": "ok"},
    "spawn": {"strict": "EPERM", "standard": "ok", "standard-net": "ok"},
    "write_tmp": {"strict": "EPERM", "standard": "ok", "standard-net": "ok"},
    "tmpfile": {"strict": "EPERM", "standard": "ok", "standard-net": "ok"},
    "socket_inet": {"strict": "EPERM", "standard": "EPERM", "standard-net": "ok"},
    "socket_inet6": {"strict": "EPERM", "standard": "EPERM", "standard-net": "ok"},
    "clone3": dict.fromkeys(PROFILES, "ENOSYS"),
    "clone_newuser": _ALL_EPERM,
    "clone_newns": _ALL_EPERM,
    "unshare_newuser": _ALL_EPERM,
    "setns": _ALL_EPERM,
    "ptrace_traceme": _ALL_EPERM,
    "mount": _ALL_EPERM,
    "umount2": _ALL_EPERM,
    "chroot": _ALL_EPERM,
    "pivot_root": _ALL_EPERM,
    "setuid_self": _ALL_EPERM,
    "keyctl": _ALL_EPERM,
    "bpf": _ALL_EPERM,
    "perf_event_open": _ALL_EPERM,
    "kexec_load": _ALL_EPERM,
    "init_module": _ALL_EPERM,
    "io_uring_setup": _ALL_EPERM,
    "userfaultfd": _ALL_EPERM,
}

#: Cases that also depend on the container's mounts: case -> profile -> outcome.
#: (Under strict, seccomp refuses the write-intent open before the file system is asked.)
CONTAINER_CASES: dict[str, dict[str, str]] = {
    "write_project": {"strict": "EPERM", "standard": "EROFS", "standard-net": "EROFS"},
    "write_rootfs": {"strict": "EPERM", "standard": "EROFS", "standard-net": "EROFS"},
    "write_output": {"strict": "EPERM", "standard": "ok", "standard-net": "ok"},
    "exec_output": {"strict": "EPERM", "standard": "EACCES", "standard-net": "EACCES"},
    "exec_tmp": {"strict": "EPERM", "standard": "EACCES", "standard-net": "EACCES"},
    "engine_socket": dict.fromkeys(PROFILES, "ENOENT"),
}

#: Facts every L2 sandbox shows (probe case "facts").
FACTS: dict[str, object] = {
    "uid": 10001,
    "gid": 10001,
    "no_new_privs": "1",
    "seccomp": "2",
    "cap_eff": "0000000000000000",
    "interfaces": ["lo"],
    "routes": [],
}

#: Quick self-test for `fluffy doctor`: a syscall the kernel would allow, denied by the
#: profile (so EPERM proves the filter), and one the profile must allow.
SELF_TEST = ("ptrace_traceme", "setuid_self", "thread")


def expected(cases: dict[str, dict[str, str]], profile: str) -> dict[str, str]:
    return {case: outcomes[profile] for case, outcomes in cases.items()}
