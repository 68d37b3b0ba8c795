"""What the kernel sets up around an L2 sandbox it talks to: its private socket folder,
and what to say when it went quiet (the tail of its output)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from fluffy.kernel.containers.runtime import sandbox_identity


def socket_dir(root: Path, name: str, uid: int | None = None) -> tuple[Path, dict[str, Any]]:
    """``root/ipc/name``, private to the peer ``uid`` (default: the sandbox user); the
    KernelServer.listen options.

    A peer of the kernel's own uid (a sandbox of a non-root kernel) gets a 0600 socket in
    a 0700 folder.  Under root, the folder and its socket belong to the peer (the kernel,
    root, still enters them).  Otherwise (a peer of another uid that a non-root kernel
    cannot give files to) the folder is only traversable inside the kernel's private
    state and the socket open to all; the peer's uid is still checked on connect.
    """
    uid = sandbox_identity()[0] if uid is None else uid
    folder = root / "ipc" / name
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    folder.mkdir(mode=0o700)
    same = uid == os.geteuid()
    own = os.geteuid() == 0 and not same
    if own:
        os.chown(folder, uid, uid)
    elif not same:
        folder.chmod(0o711)
    private = own or same
    options: dict[str, Any] = {
        "allowed_uids": frozenset({uid}),
        "owner": (uid, uid) if own else None,
        "mode": 0o600 if private else 0o666,
        "folder_mode": 0o700 if private else 0o711,
    }
    return folder, options


def output_tail(runtime: Any, container_id: str, chars: int = 1500) -> str:
    """The end of a container's output, for an error's why (never raises)."""
    with contextlib.suppress(Exception):
        return "".join(runtime.logs(container_id)).strip()[-chars:] or "no output"
    return "its logs could not be read"
