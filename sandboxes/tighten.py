"""Tighten the sandbox's own seccomp filter after start-up (defence in depth).

The container's profile must allow what start-up needs (runc's exec fifo, the
entrypoint's execve); once the in-sandbox host has started, it can load a second,
narrower filter built from the same rules minus ``deny``.  Filters stack: the kernel
applies every loaded filter, so this can only take permissions away.
"""

from __future__ import annotations

from fluffy.seccomp.compile import build_filter

#: What a started in-sandbox host no longer needs under the strict profile.
AFTER_START_DENY = ("execve", "execveat")


def tighten(profile: str, deny: tuple[str, ...] = AFTER_START_DENY) -> None:
    """Load ``profile`` minus ``deny`` on top of the container's filter (all threads)."""
    build_filter(profile, extra_deny=deny).load()
