"""A plugin's files on the wire: what the CLI sends ``plugin.install`` and how both sides
name the set of bytes reviewed.

The kernel in L1 does not see host paths (only its fixed mounts, docs/architecture.md),
so the CLI reads the plugin folder once (:func:`~.store.read_tree`: the store's rules,
no links, each file within its limit) and sends the bytes, base64 in JSON.  One IPC
frame is at most 4 MiB and base64 costs a third more, so at most
:data:`MAX_SENT_BYTES` are sent (the store itself takes up to 10 MiB from a folder
when no kernel runs).  :func:`tree_digest` names the exact bytes: the kernel's plan
carries it, an approval must repeat it, and the CLI installs the bytes it names.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from fluffy.errors import InvalidPayload, PluginInstallRefused
from fluffy.kernel.plugins.store import MAX_FILE_BYTES, MAX_FILES, check_rel, sha256

#: Largest plugin (all files) sent to a kernel: 2 MiB, 2.7 MiB as base64 in a 4 MiB frame.
MAX_SENT_BYTES: Final = 2 * 1024 * 1024


def tree_digest(files: Mapping[str, bytes]) -> str:
    """SHA-256 over every (path, SHA-256 of its bytes), sorted: one name for the set."""
    listing = [[rel, sha256(data)] for rel, data in sorted(files.items())]
    return hashlib.sha256(json.dumps(listing, separators=(",", ":")).encode()).hexdigest()


def check_sendable(files: Mapping[str, bytes]) -> None:
    """Refuse a plugin too large to send to a kernel (before anything is sent)."""
    total = sum(len(data) for data in files.values())
    if total > MAX_SENT_BYTES:
        raise PluginInstallRefused(
            f"the plugin's files add up to {total} bytes; at most "
            f"{MAX_SENT_BYTES // (1024 * 1024)} MiB are sent to a running kernel for review",
            why="the kernel in L1 reviews the bytes the CLI sends it, in one IPC frame",
            fix="Leave build output and data out of the plugin folder.",
        )


def encode_files(files: Mapping[str, bytes]) -> list[dict[str, str]]:
    return [
        {"path": rel, "data": base64.b64encode(data).decode("ascii")}
        for rel, data in sorted(files.items())
    ]


def decode_files(sent: list[Any]) -> dict[str, bytes]:
    """The files of a request; malformed ones are :class:`InvalidPayload`, unsafe paths
    and sizes over the limits :class:`PluginInstallRefused` (nothing is written here)."""
    if len(sent) > MAX_FILES:
        raise PluginInstallRefused(f"the plugin holds more than {MAX_FILES} files")
    files: dict[str, bytes] = {}
    total = 0
    for item in sent:
        path, text = item.path, item.data
        if len(text) > (MAX_FILE_BYTES * 4) // 3 + 4:
            raise PluginInstallRefused(f"{path!r} is larger than {MAX_FILE_BYTES // 1024} KiB")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidPayload(f"plugin.install: the data of {path!r} is not base64") from None
        check_rel(path)
        if path in files:
            raise InvalidPayload(f"plugin.install: {path!r} is sent twice")
        total += len(data)
        if total > MAX_SENT_BYTES:
            raise PluginInstallRefused(
                f"the plugin's files add up to more than {MAX_SENT_BYTES // (1024 * 1024)} MiB"
            )
        files[path] = data
    return files
