"""Each session's staged changes (kernel.merge.staging), kept by the kernel.

Staged = written by a tool, validated, not yet merged into the project.  The folder of
a session is ``<state>/staging/<session id>`` and is mounted read-only at /staged into
the session's plugin sandboxes.  One :class:`Staging` per folder: it keeps its entries in
memory, so the view (:meth:`Staging.overlay`) costs no I/O.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from fluffy.kernel.merge.landed import Landed, safe_name
from fluffy.kernel.merge.staging import Staging


class Workspaces:
    def __init__(self, state_dir: Path, project: Path) -> None:
        self.root = state_dir / "staging"
        #: what each session merged and has not committed (kept past a discard)
        self.landed_root = state_dir / "landed"
        self.project = project
        self.sessions: dict[str, Staging] = {}
        #: told each folder that is removed (sandboxes made to mount it are stale)
        self.on_discard: list[Callable[[Path], None]] = []

    def get(self, session_id: str) -> Staging:
        stage = self.sessions.get(session_id)
        if stage is None:
            # sandboxes (another uid) read staging through their own mount of it
            self.root.mkdir(parents=True, exist_ok=True)
            self.root.chmod(0o755)
            stage = Staging(self.root / session_id, self.project)
            self.sessions[session_id] = stage
        return stage

    def landed(self, session_id: str) -> Landed:
        """What the session merged and has not committed (``<state>/landed/<id>``, which
        git.commit's sandbox sees read-only at /staged)."""
        self.landed_root.mkdir(parents=True, exist_ok=True)
        self.landed_root.chmod(0o755)
        return Landed(self.landed_root / safe_name(session_id))

    def overlay(self, session_id: str) -> Mapping[str, str | None]:
        if session_id not in self.sessions and not (self.root / session_id).exists():
            return {}
        return self.get(session_id).overlay()

    def discard(self, session_id: str) -> None:
        stage = self.sessions.pop(session_id, None)
        if stage is not None:
            stage.clear()
        shutil.rmtree(self.root / session_id, ignore_errors=True)
        for tell in self.on_discard:
            tell(self.root / session_id)
