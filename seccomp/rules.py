"""The seccomp profiles' source of truth: reviewed data, one reason per group or exception.

Three profiles, each a superset of the one before (design: Container Manager, Seccomp
profiles):

* ``strict`` — computation and IPC: Python runs, threads work, read-only opens, Unix
  sockets; no new processes, no network sockets, no file changes.  (policy-sandbox,
  ai-provider)
* ``standard`` — adds process creation without namespaces, execve of children, file
  changes, pipes.  Still no ptrace, mount, chroot, setuid, AF_INET/AF_INET6.
  (code-executor)
* ``standard-net`` — adds AF_INET/AF_INET6 sockets.  (integration-test)

Everything not listed fails with EPERM (the default action).  Never listed, so denied
everywhere (the escape suite tries each): ptrace, process_vm_*, mount, umount2,
pivot_root, chroot, unshare, setns, the set*id family, capset, keyctl, add_key,
request_key, bpf, perf_event_open, kexec_*, *init_module, delete_module, io_uring_*,
userfaultfd, open_by_handle_at, personality, SysV IPC, reboot, swapon/off, acct,
quotactl, *_time setters, iopl/ioperm, lookup_dcookie, name_to_handle_at.

Path restrictions are not seccomp's job (it cannot read path strings): the mounts are.
``python -m fluffy.seccomp.generate`` writes the OCI JSON under ``seccomp/generated/``;
a golden test keeps it equal to this file.
"""

from __future__ import annotations

import msgspec

# Constants from <linux/sched.h>, <sys/socket.h>, <fcntl.h>, <errno.h> (same on x86_64
# and aarch64).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
CLONE_NAMESPACES = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
O_WRONLY = 0o1
O_RDWR = 0o2
O_CREAT = 0o100
O_TRUNC = 0o1000
O_TMPFILE = 0o20000000  # __O_TMPFILE: an unnamed file that needs no O_CREAT
O_WRITE_INTENT = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_TMPFILE
EPERM = 1
ENOSYS = 38

PROFILES = ("strict", "standard", "standard-net")


class Arg(msgspec.Struct, frozen=True):
    """One condition on a syscall argument (all conditions of a rule must hold)."""

    index: int
    op: str  # "eq" | "masked_eq"
    value: int
    mask: int = 0  # for masked_eq: (arg & mask) == value


class Rule(msgspec.Struct, frozen=True):
    """Allow (or fail with ``errno``) ``names`` in ``profile`` and every profile after it."""

    profile: str
    names: tuple[str, ...]
    reason: str
    args: tuple[Arg, ...] = msgspec.field(default_factory=tuple)
    errno: int | None = None  # None: allow


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------- strict
    Rule(
        "strict",
        _names("""
        read readv pread64 preadv preadv2 write writev pwrite64 pwritev pwritev2 close
        close_range lseek fstat newfstatat statx stat lstat fstatfs statfs getdents64
        readlink readlinkat access faccessat faccessat2 getcwd chdir fchdir dup dup2 dup3
        getdents
        fcntl flock fsync fdatasync fadvise64 ioctl umask
    """),
        "file descriptors and read-only metadata; ioctl is harmless without a TTY "
        "(no TIOCSTI target) and Python queries TCGETS on std streams",
    ),
    Rule(
        "strict",
        ("openat",),
        "opens for reading only: write intent (O_WRONLY|O_RDWR|O_CREAT|O_TRUNC) fails",
        args=(Arg(2, "masked_eq", 0, O_WRITE_INTENT),),
    ),
    Rule(
        "strict",
        ("openat",),
        "write-only re-open of an existing file, never create/truncate: runc opens its "
        "exec fifo (/proc/self/fd/N, O_WRONLY) after loading the filter; the root is "
        "read-only and tmpfs/output start empty, so nothing writable exists to open",
        args=(Arg(2, "masked_eq", O_WRONLY, O_WRITE_INTENT),),
    ),
    Rule(
        "strict",
        ("open",),
        "legacy open, reading only (flags are its second argument)",
        args=(Arg(1, "masked_eq", 0, O_WRITE_INTENT),),
    ),
    Rule(
        "strict",
        _names("""
        mmap munmap mprotect mremap msync brk madvise mincore membarrier
    """),
        "memory management for the interpreter and its allocator",
    ),
    Rule(
        "strict",
        _names("""
        rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait
        rt_sigsuspend sigaltstack restart_syscall pause
    """),
        "signal handling",
    ),
    Rule(
        "strict",
        _names("""
        futex futex_waitv set_robust_list get_robust_list set_tid_address rseq
        sched_yield sched_getaffinity sched_getparam sched_getscheduler
        sched_get_priority_max sched_get_priority_min sched_getattr gettid
    """),
        "threads and their synchronisation",
    ),
    Rule(
        "strict",
        ("clone",),
        "threads only (Python needs them): CLONE_THREAD set and no namespace flag",
        args=(Arg(0, "masked_eq", CLONE_THREAD, CLONE_THREAD | CLONE_NAMESPACES),),
    ),
    Rule(
        "strict",
        ("clone3",),
        "clone3 passes its flags in memory where seccomp cannot read them; ENOSYS makes "
        "glibc fall back to clone, which is filtered",
        errno=ENOSYS,
    ),
    Rule(
        "strict",
        _names("""
        clock_gettime clock_getres clock_nanosleep nanosleep gettimeofday time times
        getitimer setitimer alarm timer_create timer_settime timer_gettime
        timer_getoverrun timer_delete timerfd_create timerfd_settime timerfd_gettime
    """),
        "time and timers (timeouts, SIGALRM-based time limits)",
    ),
    Rule(
        "strict",
        _names("""
        getpid getppid getuid geteuid getgid getegid getgroups getresuid getresgid
        getpgrp getpgid getsid getrlimit prlimit64 getrusage uname sysinfo getcpu
        getrandom capget arch_prctl prctl
    """),
        "identity and environment queries; prctl is needed for thread names and for "
        "loading a tighter seccomp filter (no privilege effect under no_new_privs)",
    ),
    Rule(
        "strict",
        _names("seccomp landlock_create_ruleset landlock_add_rule landlock_restrict_self"),
        "the in-sandbox host may only tighten its own restrictions",
    ),
    Rule("strict", _names("kill tgkill tkill"), "signals within the sandbox's own pid namespace"),
    Rule("strict", _names("exit exit_group"), "ending threads and the process"),
    Rule(
        "strict",
        ("execve",),
        "runc loads the filter before it execs the entrypoint, so execve must pass; without "
        "fork/clone no new process can exist, and the in-sandbox host drops execve itself",
    ),
    Rule(
        "strict",
        _names("""
        poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait
        epoll_pwait epoll_pwait2 eventfd eventfd2
    """),
        "event loops (asyncio)",
    ),
    Rule(
        "strict",
        ("socket",),
        "Unix sockets only: IPC with the kernel",
        args=(Arg(0, "eq", AF_UNIX),),
    ),
    Rule(
        "strict",
        ("socketpair",),
        "Unix socket pairs (asyncio's self-pipe)",
        args=(Arg(0, "eq", AF_UNIX),),
    ),
    Rule(
        "strict",
        _names("""
        connect sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg shutdown
        getsockname getpeername getsockopt setsockopt
    """),
        "using sockets that the socket rule let exist (Unix only in strict)",
    ),
    # -------------------------------------------------------------- standard
    Rule("standard", _names("fork vfork"), "process creation for tools and test runs"),
    Rule(
        "standard",
        ("clone",),
        "new processes, but never with a namespace flag "
        "(CLONE_NEWUSER/CLONE_NEWNS and the rest stay denied)",
        args=(Arg(0, "masked_eq", 0, CLONE_NAMESPACES),),
    ),
    Rule(
        "standard",
        _names("""
        execveat wait4 waitid setpgid setsid getpriority setpriority setrlimit
        pidfd_open pidfd_send_signal
    """),
        "running and reaping child processes",
    ),
    Rule("standard", _names("openat open"), "opens for writing (paths are limited by mounts)"),
    Rule("standard", _names("creat"), "legacy create"),
    Rule(
        "standard",
        _names("""
        unlink unlinkat mkdir mkdirat rmdir rename renameat renameat2 link linkat
        symlink symlinkat chmod fchmod fchmodat fchmodat2 fchown fchownat chown lchown truncate
        ftruncate fallocate utime utimes utimensat futimesat sync syncfs sync_file_range
        copy_file_range sendfile splice tee memfd_create mknodat
    """),
        "file changes (writable places are the output directory and tmpfs only)",
    ),
    Rule(
        "standard",
        _names("""
        getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr
    """),
        "reading extended attributes (cp -a, git)",
    ),
    Rule("standard", _names("pipe pipe2"), "pipes between processes"),
    Rule(
        "standard",
        _names("""
        inotify_init inotify_init1 inotify_add_watch inotify_rm_watch
    """),
        "file watching (test runners)",
    ),
    Rule(
        "standard",
        _names("bind listen accept accept4"),
        "servers on Unix sockets (AF_INET stays denied until standard-net)",
    ),
    Rule(
        "standard",
        _names("sched_setaffinity sched_setparam sched_setscheduler"),
        "process scheduling hints (bounded by the container's CPU limit)",
    ),
    # ---------------------------------------------------------- standard-net
    Rule(
        "standard-net",
        ("socket",),
        "IPv4 sockets for integration tests",
        args=(Arg(0, "eq", AF_INET),),
    ),
    Rule(
        "standard-net",
        ("socket",),
        "IPv6 sockets for integration tests",
        args=(Arg(0, "eq", AF_INET6),),
    ),
)


def rules_for(profile: str) -> list[Rule]:
    """Every rule that applies to ``profile`` (its own and the ones before it)."""
    if profile not in PROFILES:
        from fluffy.errors import ConfigError

        raise ConfigError(
            f"unknown seccomp profile {profile!r}",
            fix="Use one of: " + ", ".join(PROFILES),
            why="a sandbox's system calls are filtered by one of fluffy's named profiles",
        )
    upto = PROFILES.index(profile)
    return [rule for rule in RULES if PROFILES.index(rule.profile) <= upto]
