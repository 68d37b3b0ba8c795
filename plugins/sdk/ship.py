"""A call's output files, sent to the kernel over the call's socket (``tool.files``).

The sandbox's ``/output`` is its own tmpfs (sized, noexec, nosuid, nodev) that nobody
outside the sandbox sees: the kernel never reads a folder the sandbox can change.  When
the plugin's handler has returned, the host sends what it wrote under
``/output/<call_id>/`` -- regular files only, links and anything else are left out -- in
frames of at most :data:`FRAME_BYTES`, before ``tool.result``.  The kernel writes them
into its own call folder (:meth:`fluffy.kernel.tools.sandbox.plugins.PluginRunner._files`).
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FRAME_BYTES = 1024 * 1024  # raw bytes per tool.files frame (base64 keeps it under 4 MiB)
MAX_ENTRIES = 256  # file pieces per frame


def regular_files(root: Path) -> Iterator[str]:
    """Paths (relative, '/'-separated) of the regular files under ``root``, never through
    a link; nothing when ``root`` is missing or not a folder."""
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return
    except OSError:
        return
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder, name)
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    yield path.relative_to(root).as_posix()
            except OSError:
                continue


def frames(root: Path) -> Iterator[list[dict[str, Any]]]:
    """``tool.files`` entries ``{"path", "offset", "data"}`` (data base64), in frames."""
    batch: list[dict[str, Any]] = []
    size = 0
    for rel in regular_files(root):
        try:
            fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as handle:
            offset = 0
            while True:
                data = handle.read(FRAME_BYTES - size)
                if offset and not data:
                    break
                batch.append(
                    {"path": rel, "offset": offset, "data": base64.b64encode(data).decode()}
                )
                offset += len(data)
                size += len(data)
                if size >= FRAME_BYTES or len(batch) >= MAX_ENTRIES:
                    yield batch
                    batch, size = [], 0
                if not data:
                    break  # an empty file: one entry
    if batch:
        yield batch
