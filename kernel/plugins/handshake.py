"""The syscall API version window for plugins (design: Version Compatibility).

The IPC handshake itself is :func:`fluffy.ipc.protocol.negotiate` (every connection,
plugin or CLI, goes through it): integer versions, the kernel speaks
``[current - 1, current]`` and a request outside gets ``ipc.version_unsupported`` naming
the range.  This module adds the plugin side of the contract:

- at registration, a manifest whose ``min_api_version`` is above the current version is
  REJECTED (the plugin needs syscalls this kernel does not have), with the range named;
- a plugin host is asked to speak at least the manifest's ``min_api_version``: when a
  job is handed out, a connection that negotiated less is refused
  (:func:`check_negotiated`).

Syscall API changes are listed in CHANGELOG.md, each marked breaking / non-breaking.
"""

from __future__ import annotations

from fluffy.errors import PluginIncompatible, VersionUnsupported
from fluffy.ipc.protocol import CURRENT_API_VERSION, SUPPORTED_API_VERSIONS, negotiate

__all__ = [
    "CURRENT_API_VERSION",
    "SUPPORTED_API_VERSIONS",
    "api_window",
    "check_min_api_version",
    "check_negotiated",
    "negotiate",
]


def api_window() -> tuple[int, int]:
    """(lowest, highest) syscall API version this kernel speaks."""
    low, high = SUPPORTED_API_VERSIONS
    return low, high


def _range() -> str:
    low, high = api_window()
    return f"[{low}, {high}]"


def check_min_api_version(plugin: str, min_api_version: int) -> None:
    """Refuse a plugin needing a newer syscall API than this kernel speaks."""
    low, high = api_window()
    if min_api_version > high:
        raise PluginIncompatible(
            f"{plugin} needs syscall API version {min_api_version} or later; this kernel "
            f"speaks versions {low} to {high}",
            why=f"the kernel supports {_range()} (the latest two versions); the manifest's "
            f"min_api_version is {min_api_version}",
            fix=f"Install a version of {plugin} whose min_api_version is at most {high}, "
            "or update fluffy.",
        )


def check_negotiated(plugin: str, negotiated: int, min_api_version: int) -> None:
    """Refuse work to a connection that speaks an older API than the plugin declared."""
    if negotiated < min_api_version:
        raise VersionUnsupported(
            f"{plugin} connected with syscall API version {negotiated}, but its manifest "
            f"needs at least {min_api_version}",
            why=f"this kernel speaks {_range()}; the manifest's min_api_version is "
            f"{min_api_version}",
            fix=f"Connect with a version from {min_api_version} to {api_window()[1]}.",
        )
