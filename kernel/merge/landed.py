"""What a session merged and has not committed yet: each change, as the commit takes it.

The AI's commit holds HEAD's tree plus the session's own changes to the paths it merged,
never whatever else is in the working tree: the person's untracked files, their other
uncommitted edits -- also those in a file the session changed, made before the session
or while it worked -- and their index stay theirs.  So the record keeps, for each path,
every change the session merged since its last commit as the pair (the content the
change was made against, the session's content); the git tool carries those changes
onto HEAD's file (:func:`fluffy.merge3.carry`) and leaves a path out of the commit,
with a note, where they overlap the person's uncommitted lines.

The record lives in ``<state>/landed/<session>/``, which the git tool's sandbox sees
read-only at ``/staged`` when it commits::

    blobs/<sha256>   each content, named by its hash
    landed.json      {"changes": {path: [[base sha256 or null, new sha256 or null], ...]},
                      "pending": [the paths of the last record whose merge has not ended]}

(null base: the path did not exist; null new: the session removed it; a base whose
blob is missing is a copy the staging area lost: the git tool then commits the change
only onto the very same content.)  It is written *before* the merge touches the project,
pending, and settled when the merge ends (:meth:`Landed.settle`: the paths it wrote keep
their new change, the others lose it) -- also when a kernel killed mid-merge completes or
drops the merge at its next start -- so the record never holds a change the project does
not.  A commit clears it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from fluffy.kernel.confined_files import read_existing, safe_relpath, write_atomic

MAX_LANDED_BYTES = 64 * 1024 * 1024
HEX64 = frozenset("0123456789abcdef")

Step = tuple[str | None, str | None]  # (base sha256, new sha256); None: absent


class Change(msgspec.Struct, frozen=True):
    """One merged change of a path: what it was made against, and the session's content."""

    base_sha256: str | None  # None: the path did not exist
    base: bytes | None  # the base's content (None: absent, or a copy that was lost)
    new: bytes | None  # None: the session removed the path


def safe_name(session_id: str) -> str:
    """A session id as one folder name (ids are hex; anything else is refused)."""
    if not session_id or not all(c.isalnum() or c in "-_" for c in session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    return session_id


def _sha(value: object) -> str | None:
    """A recorded hash as it is (None: absent); anything else becomes ``""``, which the
    git tool refuses for that path (a damaged record is never read as a removal)."""
    if value is None:
        return None
    return value if isinstance(value, str) and len(value) == 64 and set(value) <= HEX64 else ""


class Landed:
    """One session's merged, uncommitted changes (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.index = root / "landed.json"

    def _load(self) -> tuple[dict[str, list[Step]], set[str]]:
        """(path -> its merged changes, oldest first; the paths still pending)."""
        try:
            data = json.loads(self.index.read_text())
        except (OSError, ValueError):
            return {}, set()
        if not isinstance(data, dict):
            return {}, set()
        changes, pending = data.get("changes"), data.get("pending")
        listing: dict[str, list[Step]] = {}
        for rel, steps in (changes if isinstance(changes, dict) else {}).items():
            if not isinstance(steps, list):
                continue
            kept = [
                (_sha(step[0]), _sha(step[1]))
                for step in steps
                if isinstance(step, list) and len(step) == 2
            ]
            if kept:
                listing[str(rel)] = kept
        waiting = {p for p in pending if isinstance(p, str)} if isinstance(pending, list) else set()
        return listing, waiting

    def paths(self) -> dict[str, list[Step]]:
        """path -> its merged changes, oldest first (what git.commit is handed)."""
        return self._load()[0]

    def blob(self, sha: str | None) -> bytes | None:
        """The content named ``sha`` (None when absent or not that content)."""
        if sha is None:
            return None
        data = read_existing(self.blobs, sha, MAX_LANDED_BYTES)
        return data if data is not None and hashlib.sha256(data).hexdigest() == sha else None

    def add(self, changes: Mapping[str, Change]) -> None:
        """Record one more change for each path (after the ones it already has), pending
        until :meth:`settle`."""
        for folder in (self.root, self.blobs):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)  # the git tool's sandbox reads it as another uid
        listing, _ = self._load()
        for rel, change in changes.items():
            new = self._put(change.new)
            base = change.base_sha256
            if change.base is not None:
                base = self._put(change.base)
            listing.setdefault(safe_relpath(rel), []).append((base, new))
        self._save(listing, {safe_relpath(rel) for rel in changes})  # one atomic write

    def unsettled(self) -> bool:
        return bool(self._load()[1])

    def settle(self, written: Iterable[str]) -> None:
        """The merge of the last record ended: the paths it wrote keep their new change,
        the others lose it (nothing, or a merge that stopped, wrote them)."""
        listing, pending = self._load()
        if not pending:
            return
        for rel in pending - set(written):
            steps = listing.get(rel)
            if steps:
                steps.pop()
                if not steps:
                    del listing[rel]
        self._save(listing, set())

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _put(self, data: bytes | None) -> str | None:
        if data is None:
            return None
        sha = hashlib.sha256(data).hexdigest()
        if self.blob(sha) is None:
            write_atomic(self.blobs, sha, data, mode=0o644, dir_mode=0o755)
        return sha

    def _save(self, listing: Mapping[str, list[Step]], pending: set[str]) -> None:
        if not listing and not self.root.is_dir():
            return  # nothing recorded, nothing to take back
        changes = {rel: [list(step) for step in steps] for rel, steps in sorted(listing.items())}
        tmp = self.index.with_suffix(".tmp")
        with tmp.open("w") as handle:
            handle.write(json.dumps({"changes": changes, "pending": sorted(pending)}, indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.chmod(0o644)
        tmp.replace(self.index)
