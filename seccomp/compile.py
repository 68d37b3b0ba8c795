"""Turn :mod:`fluffy.seccomp.rules` into the engines' OCI JSON and into a libseccomp filter.

The JSON goes to Docker/Podman (runc compiles it with libseccomp); the libseccomp filter
is built from the same rules with the ``pyseccomp`` bindings for fast host-side tests and
for the in-sandbox host to tighten itself.  Both come from one table, so a difference
between what the tests load and what the engine enforces is a bug in this file.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from fluffy.seccomp.kernel_profile import KERNEL_PROFILE, kernel_rules
from fluffy.seccomp.rules import EPERM, Rule, rules_for

#: Architectures named in the OCI profile.  Syscalls through any other ABI (e.g. the
#: 32-bit x86 ABI from a 64-bit process) hit libseccomp's bad-arch action: killed.
OCI_ARCHITECTURES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64")

_OPS = {"eq": "SCMP_CMP_EQ", "masked_eq": "SCMP_CMP_MASKED_EQ"}


def _oci_args(rule: Rule) -> list[dict[str, Any]]:
    out = []
    for arg in rule.args:
        if arg.op == "masked_eq":  # libseccomp: datum_a = mask, datum_b = value
            out.append(
                {"index": arg.index, "value": arg.mask, "valueTwo": arg.value, "op": _OPS[arg.op]}
            )
        else:
            out.append({"index": arg.index, "value": arg.value, "valueTwo": 0, "op": _OPS[arg.op]})
    return out


Owner = tuple[int, int]


def profile_rules(profile: str, owner: Owner | None = None) -> list[Rule]:
    """An L2 profile's rules, or L1's ``kernel`` profile with fchown to ``owner`` only."""
    return kernel_rules(owner) if profile == KERNEL_PROFILE else rules_for(profile)


def to_oci(profile: str, owner: Owner | None = None) -> dict[str, Any]:
    """The OCI/Docker seccomp JSON object for ``profile`` (``owner``: the kernel's only)."""
    syscalls: list[dict[str, Any]] = []
    for rule in profile_rules(profile, owner):
        entry: dict[str, Any] = {
            "names": sorted(rule.names),
            "action": "SCMP_ACT_ALLOW" if rule.errno is None else "SCMP_ACT_ERRNO",
            "comment": f"[{rule.profile}] {rule.reason}",
        }
        if rule.errno is not None:
            entry["errnoRet"] = rule.errno
        if rule.args:
            entry["args"] = _oci_args(rule)
        syscalls.append(entry)
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": list(OCI_ARCHITECTURES),
        "syscalls": syscalls,
    }


@cache
def oci_json(profile: str) -> str:
    """Canonical text of the profile (what is checked in and what the engine receives)."""
    return json.dumps(to_oci(profile), indent=2, sort_keys=True) + "\n"


#: Sonames the bindings need (stable across glibc systems).  ctypes' find_library would
#: run ldconfig in a subprocess, which a strict sandbox cannot start.
_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}


def _pyseccomp() -> Any:
    """Import pyseccomp without needing a subprocess to find libseccomp."""
    import ctypes.util
    import sys

    if "pyseccomp" in sys.modules:
        return sys.modules["pyseccomp"]
    original = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        return _SONAMES.get(name) or original(name)

    ctypes.util.find_library = find_library
    try:
        import pyseccomp
    finally:
        ctypes.util.find_library = original
    return pyseccomp


def build_filter(
    profile: str, *, extra_deny: tuple[str, ...] = (), owner: Owner | None = None
) -> Any:
    """A ``pyseccomp.SyscallFilter`` for the native architecture, not yet loaded.

    ``extra_deny`` removes syscalls the profile allows (the in-sandbox host uses it to
    drop e.g. ``execve`` after start-up); ``owner`` is the ``kernel`` profile's.
    """
    seccomp = _pyseccomp()
    ops = {"eq": seccomp.EQ, "masked_eq": seccomp.MASKED_EQ}
    flt = seccomp.SyscallFilter(seccomp.ERRNO(EPERM))
    # Apply to every thread of the process, not only the caller (threads already running
    # would otherwise keep the looser filter).
    flt.set_attr(seccomp.Attr.CTL_TSYNC, 1)
    for rule in profile_rules(profile, owner):
        action = seccomp.ALLOW if rule.errno is None else seccomp.ERRNO(rule.errno)
        args = [
            seccomp.Arg(a.index, ops[a.op], a.mask, a.value)
            if a.op == "masked_eq"
            else seccomp.Arg(a.index, ops[a.op], a.value)
            for a in rule.args
        ]
        for name in rule.names:
            if name in extra_deny:
                continue
            number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
            if number < 0:
                continue  # not a syscall on this architecture (e.g. fork on aarch64)
            flt.add_rule(action, number, *args)
    return flt
