"""What the kernel sets up around an L2 sandbox it talks to: its private socket folder,
and what to say when it went quiet (the tail of its output)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from fluffy.kernel.containers.runtime import SANDBOX_UID


def socket_dir(root: Path, name: str, uid: int = SANDBOX_UID) -> tuple[Path, dict[str, Any]]:
    """``root/ipc/name``, private to the peer ``uid``; the KernelServer.listen options.

    Under root, the folder and its sockets belong to the peer (the kernel, root, still
    enters them); otherwise the folder is only traversable inside the kernel's private
    state and the socket open to all, while the peer's uid is still checked on connect.
    """
    folder = root / "ipc" / name
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    folder.mkdir(mode=0o700)
    own = os.geteuid() == 0 and uid != os.geteuid()
    if own:
        os.chown(folder, uid, uid)
    else:
        folder.chmod(0o711)
    options: dict[str, Any] = {
        "allowed_uids": frozenset({uid}),
        "owner": (uid, uid) if own else None,
        "mode": 0o600 if own else 0o666,
        "folder_mode": 0o700 if own else 0o711,
    }
    return folder, options


def output_tail(runtime: Any, container_id: str, chars: int = 1500) -> str:
    """The end of a container's output, for an error's why (never raises)."""
    with contextlib.suppress(Exception):
        return "".join(runtime.logs(container_id)).strip()[-chars:] or "no output"
    return "its logs could not be read"
