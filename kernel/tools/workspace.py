"""Each session's staged changes (kernel.merge.staging), kept by the kernel.

Staged = written by a tool, validated, not yet merged into the project.  The folder of
a session is ``<state>/staging/<session id>`` and is mounted read-only at /staged into
the session's plugin sandboxes.  The overlay (path -> sha256 or None) is cached: only
the kernel changes staging, and it does so through :meth:`Workspaces.changed`.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from fluffy.kernel.merge.staging import Staging


class SessionStage:
    """A session's Staging with its overlay cached (the fast path reads it per call)."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self._overlay: dict[str, str | None] | None = None

    @property
    def root(self) -> Path:
        return self.staging.root

    def overlay(self) -> Mapping[str, str | None]:
        if self._overlay is None:
            self._overlay = dict(self.staging.overlay())
        return self._overlay

    def read(self, rel: str) -> bytes | None:
        return self.staging.read(rel)

    def changed(self) -> None:
        self._overlay = None


class Workspaces:
    def __init__(self, state_dir: Path, project: Path) -> None:
        self.root = state_dir / "staging"
        self.project = project
        self.sessions: dict[str, SessionStage] = {}

    def get(self, session_id: str) -> SessionStage:
        stage = self.sessions.get(session_id)
        if stage is None:
            # sandboxes (another uid) read staging through their own mount of it
            self.root.mkdir(parents=True, exist_ok=True)
            self.root.chmod(0o755)
            stage = SessionStage(Staging(self.root / session_id, self.project))
            self.sessions[session_id] = stage
        return stage

    def overlay(self, session_id: str) -> Mapping[str, str | None]:
        if session_id not in self.sessions and not (self.root / session_id).exists():
            return {}
        return self.get(session_id).overlay()

    def drop_caches(self) -> None:
        """Memory pressure: forget the cached overlays (the staging objects stay: one per
        folder, or two would disagree about it)."""
        for stage in self.sessions.values():
            stage.changed()

    def discard(self, session_id: str) -> None:
        stage = self.sessions.pop(session_id, None)
        if stage is not None:
            stage.staging.clear()
        shutil.rmtree(self.root / session_id, ignore_errors=True)
