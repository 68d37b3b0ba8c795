"""The L1 kernel's own seccomp profile (``kernel``): reviewed data, one reason per rule.

L1 ran under the engine's default profile, which lets a process holding L1's file
capabilities make a setuid-root shell in the project it mounts (ADR-053).  This profile
is the L2 ``standard-net`` profile with every call that makes or changes a file's kind,
mode or owner taken out and put back only with its arguments checked:

* no mode with ``S_ISUID``, ``S_ISGID`` or ``S_ISVTX``: ``chmod`` ``fchmod`` ``fchmodat``
  ``fchmodat2``, ``mkdir`` ``mkdirat``, ``creat``, and ``open``/``openat`` when they
  create (``O_CREAT`` or ``O_TMPFILE``; an open that creates nothing has no mode);
* ``fchown`` only to the project's owner, exactly (:func:`owner_rule`; the checked-in
  profile names the no-op owner ``-1:-1`` and the bootstrap writes the project's);
* never ``mknod``/``mknodat`` (devices, FIFOs, a setuid file by another door),
  ``symlink``/``symlinkat`` (a link in the project leading out of it), the path forms of
  chown (``chown``, ``lchown``, ``fchownat``: the kernel changes owners only on files it
  holds open) and ``memfd_create``;
* ``openat2`` fails with ENOSYS: its flags and mode are in memory seccomp cannot read,
  and callers fall back to ``openat``, which is checked.

It adds what only L1 does: ``setpriv``'s drop to the kernel's user at start
(``setresuid``, ``setresgid``, ``setgroups``, ``capset``; afterwards no ``CAP_SETUID``,
``CAP_SETGID`` or ``CAP_SETPCAP`` is left in the bounding set, so they can only shuffle
the kernel's own ids), and states its own reasons for ``socket`` (Unix, IPv4, IPv6: the
families ``standard-net`` has, no other).  Everything else (threads, processes without
namespaces, sqlite's file calls) is ``standard-net``'s; ptrace, mount, unshare, bpf,
io_uring, keyctl and the rest stay denied (EPERM, the default).
"""

from __future__ import annotations

from fluffy.seccomp.rules import (
    AF_INET,
    AF_INET6,
    AF_UNIX,
    ENOSYS,
    O_CREAT,
    O_TMPFILE,
    Arg,
    Rule,
    rules_for,
)

KERNEL_PROFILE = "kernel"
S_ISUID, S_ISGID, S_ISVTX = 0o4000, 0o2000, 0o1000
SPECIAL_BITS = S_ISUID | S_ISGID | S_ISVTX
CREATES = O_CREAT | O_TMPFILE  # the open flags that make the kernel read the mode
ID_MASK = 0xFFFFFFFF  # uid_t / gid_t: the low 32 bits of the register are the argument
NO_OWNER = (ID_MASK, ID_MASK)  # fchown(fd, -1, -1) changes nothing


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Names the L1 profile allows only with checked arguments (never as inherited).
GUARDED = _names("open openat creat chmod fchmod fchmodat fchmodat2 mkdir mkdirat fchown socket")
#: Names ``standard-net`` allows that the kernel never needs and must not have.
REMOVED = _names("mknod mknodat symlink symlinkat chown lchown fchownat memfd_create")


def _plain_mode(names: str, index: int, reason: str) -> Rule:
    return Rule(KERNEL_PROFILE, tuple(names.split()), reason,
                args=(Arg(index, "masked_eq", 0, SPECIAL_BITS),))  # fmt: skip


OWN_RULES: tuple[Rule, ...] = (
    Rule(
        KERNEL_PROFILE,
        ("openat",),
        "opens that create nothing (no O_CREAT, no O_TMPFILE): the mode is not used",
        args=(Arg(2, "masked_eq", 0, CREATES),),
    ),
    _plain_mode("openat", 3, "creating opens with a plain mode: no setuid, setgid or sticky bit"),
    Rule(
        KERNEL_PROFILE,
        ("open",),
        "legacy opens that create nothing (flags are the second argument)",
        args=(Arg(1, "masked_eq", 0, CREATES),),
    ),
    _plain_mode("open", 2, "legacy creating opens with a plain mode"),
    _plain_mode("creat", 1, "legacy create with a plain mode"),
    _plain_mode(
        "chmod fchmod",
        1,
        "modes up to 0777 only: a merge gives a file its old mode or its folder's default; "
        "without CAP_FOWNER only files the kernel owns can be changed at all",
    ),
    _plain_mode("fchmodat fchmodat2", 2, "the same for the *at forms"),
    _plain_mode("mkdir", 1, "folders with a plain mode (the merge makes missing folders)"),
    _plain_mode("mkdirat", 2, "the same for mkdirat"),
    Rule(
        KERNEL_PROFILE,
        ("setresuid", "setresgid", "setgroups", "capset"),
        "setpriv's drop to the kernel's user before python starts; afterwards the bounding "
        "set holds no CAP_SETUID/SETGID/SETPCAP, so they cannot raise anything",
    ),
    *(
        Rule(KERNEL_PROFILE, ("socket",), reason, args=(Arg(0, "eq", family),))
        for family, reason in (
            (AF_UNIX, "Unix sockets: the CLI's and the sandboxes' sockets, the engine gate"),
            (
                AF_INET,
                "IPv4 sockets: L1 has no route (network none); the proxy's upstream "
                "sockets come from the gate's dialler",
            ),
            (AF_INET6, "IPv6 sockets, as IPv4"),
        )
    ),
    Rule(
        KERNEL_PROFILE,
        ("openat2",),
        "its flags and mode are in memory seccomp cannot read: ENOSYS makes callers use "
        "openat, which is checked",
        errno=ENOSYS,
    ),
)


def owner_rule(uid: int, gid: int) -> Rule:
    """``fchown`` to exactly ``uid:gid`` (the project's owner), the only chown L1 has."""
    return Rule(
        KERNEL_PROFILE,
        ("fchown",),
        "a merge gives the files it makes the project's owner (its folder's or the file's "
        "it replaces), on the descriptor it holds; no other owner",
        args=(
            Arg(1, "masked_eq", uid & ID_MASK, ID_MASK),
            Arg(2, "masked_eq", gid & ID_MASK, ID_MASK),
        ),
    )


def _inherited() -> list[Rule]:
    """``standard-net``'s rules without the guarded and removed names."""
    kept = []
    for rule in rules_for("standard-net"):
        names = tuple(n for n in rule.names if n not in GUARDED and n not in REMOVED)
        if names:
            reason = f"(as in {rule.profile}) {rule.reason}"
            kept.append(Rule(KERNEL_PROFILE, names, reason, rule.args, rule.errno))
    return kept


def kernel_rules(owner: tuple[int, int] | None = None) -> list[Rule]:
    """The ``kernel`` profile; ``owner`` (uid, gid) is the only one fchown may give
    (None: the checked-in profile's no-op owner)."""
    return [*_inherited(), *OWN_RULES, owner_rule(*(owner or NO_OWNER))]
