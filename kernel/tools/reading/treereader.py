"""A session's view (project + staged changes) as the natural-red check reads it."""

from __future__ import annotations

import os
from pathlib import Path

from fluffy.errors import FluffyError
from fluffy.kernel.project.viewfiles import ignored, ignored_dir
from fluffy.kernel.tools.reading.fastpath import FastPath, StagedView
from fluffy.pathnames import is_utf8


class SessionTree:
    """:class:`fluffy.kernel.workflow.missing.TreeReader` over the kernel's fast path."""

    def __init__(self, fast: FastPath, stage: StagedView) -> None:
        self.fast = fast
        self.stage = stage
        self.overlay = dict(stage.overlay())

    def read(self, rel: str) -> bytes | None:
        try:
            found = self.fast.content(rel, self.stage)
        except (FluffyError, OSError, ValueError):
            return None
        return None if found is None else found[0]

    def is_dir(self, rel: str) -> bool:
        path = self.fast.project / rel
        if path.is_dir() and not path.is_symlink():
            return True
        prefix = rel.rstrip("/") + "/"
        return any(k.startswith(prefix) and v is not None for k, v in self.overlay.items())

    def python_files(self, folder: str, limit: int) -> list[str]:
        return self.files(folder, (".py",), limit)

    def files(self, folder: str, suffixes: tuple[str, ...], limit: int) -> list[str]:
        """The view's files under ``folder`` whose names end in one of ``suffixes``."""
        found: list[str] = []
        base = self.fast.project if folder in ("", ".") else self.fast.project / folder
        prefix = "" if folder in ("", ".") else folder.rstrip("/") + "/"
        for current, dirs, files in os.walk(base):
            # a name that is not UTF-8 no tool of the model's can name: not shown
            dirs[:] = sorted(d for d in dirs if not ignored_dir(d) and is_utf8(d))
            rel_dir = Path(current).relative_to(self.fast.project).as_posix()
            for name in sorted(files):
                if not name.endswith(suffixes) or not is_utf8(name):
                    continue
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if self.overlay.get(rel, "") is None:
                    continue  # staged for deletion
                found.append(rel)
                if len(found) >= limit:
                    return found
        for rel, sha in sorted(self.overlay.items()):
            wanted = sha is not None and rel.endswith(suffixes) and rel.startswith(prefix)
            if wanted and rel not in found and not ignored(rel):
                found.append(rel)
        return found[:limit]
