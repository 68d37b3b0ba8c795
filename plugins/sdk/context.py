"""What a tool handler gets (design: ``ToolContext``): the view, its output area, ``run``.

A handler never writes the project.  It reads the *view* (``/workspace`` + staged
changes), writes its own files under ``/output/<call_id>/files/`` (:meth:`write_file`)
and proposes changes with :meth:`emit_patch` / :meth:`emit_full` / :meth:`emit_delete`:
each writes a change file under ``/output/<call_id>/`` and adds an entry to
:attr:`changes`, which the plugin host puts into the tool's result for the kernel to
validate and merge.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from fluffy.errors import ToolFailed, ToolInputInvalid
from fluffy.plugins.sdk.diff import unified_diff
from fluffy.plugins.sdk.paths import normalise_path
from fluffy.plugins.sdk.run import RunResult, run_command, scrubbed
from fluffy.plugins.sdk.view import Entry, ProjectView

SESSION_MODES = ("strict", "explore", "debug")
CALL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_call_id(call_id: object) -> str:
    if not isinstance(call_id, str) or not CALL_ID.fullmatch(call_id):
        raise ValueError(
            f"call_id {call_id!r} is not a plain name (letters, digits, '.', '_', '-'; "
            "at most 128 characters)"
        )
    return call_id


class ToolContext:
    """One tool call's view of the world.  Paths are relative to the project root."""

    def __init__(
        self,
        *,
        call_id: str,
        view: ProjectView,
        output: Path,
        sandbox_id: str = "",
        plugin_name: str = "",
        session_mode: str = "strict",
        env: Mapping[str, str] | None = None,
        tool_name: str = "",
        timeout_s: float = 60.0,
        read_only: bool = False,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        if session_mode not in SESSION_MODES:
            raise ValueError(f"session_mode {session_mode!r} is not one of {SESSION_MODES}")
        self.call_id = check_call_id(call_id)
        self.view = view
        self.call_dir = Path(output) / call_id
        self.call_dir.mkdir(parents=True, exist_ok=True)
        self.sandbox_id = sandbox_id
        self.plugin_name = plugin_name
        self.session_mode = session_mode
        self.tool_name = tool_name
        self.timeout_s = timeout_s
        self.read_only = read_only
        self._env: Mapping[str, str] = MappingProxyType(
            scrubbed(os.environ) if env is None else dict(env)
        )
        #: The kernel's settings for this call (not the model's arguments).
        self.settings: Mapping[str, object] = MappingProxyType(dict(settings or {}))
        self._changes: list[dict[str, str]] = []
        self._next_file = 0

    # -- properties ----------------------------------------------------------------
    @property
    def env(self) -> Mapping[str, str]:
        """The (scrubbed) environment, read-only."""
        return self._env

    @property
    def workspace(self) -> Path:
        """The project folder (read-only; without the staged changes)."""
        return self.view.workspace

    @property
    def changes(self) -> list[dict[str, str]]:
        """The changes emitted so far (a copy), in the result's ``changes`` format."""
        return [dict(change) for change in self._changes]

    # -- running -------------------------------------------------------------------
    def run(
        self,
        command: Sequence[str],
        *,
        cwd: str | Path | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | bytes | None = None,
    ) -> RunResult:
        """Run ``command`` (a list; never a shell).

        ``cwd`` defaults to the project folder; ``timeout_s`` to the tool's timeout;
        ``env`` is added to the scrubbed environment.
        """
        return run_command(
            command,
            cwd=self.workspace if cwd is None else cwd,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            env={**self._env, **(env or {})},
            input=input,
        )

    # -- the view ------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        return self.view.read_bytes(normalise_path(path))

    def read_file(self, path: str) -> str:
        """A text file of the view (UTF-8)."""
        rel = normalise_path(path)
        try:
            return self.view.read_bytes(rel).decode("utf-8")
        except UnicodeDecodeError:
            raise ToolInputInvalid(
                f"{rel} is not UTF-8 text", fix="Only text files can be read as text."
            ) from None

    def list_dir(self, path: str = ".") -> list[str]:
        return self.view.list_dir(normalise_path(path, allow_root=True))

    def file_exists(self, path: str) -> bool:
        """Whether ``path`` is a file of the view."""
        return self.view.is_file(normalise_path(path))

    def is_dir(self, path: str) -> bool:
        return self.view.is_dir(normalise_path(path, allow_root=True))

    def walk(self, path: str = ".", skip: frozenset[str] = frozenset()) -> list[Entry]:
        """Every file and link of the view under ``path`` (links never followed)."""
        return self.view.walk(normalise_path(path, allow_root=True), skip)

    # -- output --------------------------------------------------------------------
    def _output_file(self, name: str, data: bytes) -> Path:
        target = self.call_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        real_call = os.path.realpath(self.call_dir)
        real_parent = os.path.realpath(target.parent)
        if real_parent != real_call and not real_parent.startswith(real_call + os.sep):
            raise ToolFailed(
                f"the output path {name} leads outside this call's output folder",
                why="a link inside the output folder points elsewhere",
                fix="Write to a path without links (something replaced a folder with a link).",
            )
        if target.is_symlink():
            target.unlink()
        target.write_bytes(data)
        return target

    def write_file(self, path: str, content: str | bytes) -> Path:
        """Write a file of this call's own output (``/output/<call_id>/files/<path>``)."""
        rel = normalise_path(path)
        data = content.encode("utf-8") if isinstance(content, str) else content
        return self._output_file(f"files/{rel}", data)

    # -- changes -------------------------------------------------------------------
    def _record(self, change: dict[str, str]) -> dict[str, str]:
        if self.read_only:
            raise ToolFailed(
                f"{self.tool_name or 'this tool'} is read-only but tried to change "
                f"{change['path']}",
                why="its ToolDefinition says read_only=True",
                fix="Set read_only=False in the tool's definition, or do not emit changes.",
            )
        for earlier in [c for c in self._changes if c["path"] == change["path"]]:
            self._changes.remove(earlier)  # the last change of a path wins
            if "file" in earlier:
                (self.call_dir / earlier["file"]).unlink(missing_ok=True)
        self._changes.append(change)
        return dict(change)

    def _change_file(self, suffix: str, data: bytes) -> str:
        name = f"{self._next_file}.{suffix}"
        self._next_file += 1
        self._output_file(name, data)
        return name

    def _writable(self, path: str) -> str:
        rel = normalise_path(path)
        if self.view.is_dir(rel):
            raise ToolInputInvalid(
                f"{rel} is a folder of the project", fix="Name a file, not a folder."
            )
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if self.view.is_file(parent):
                raise ToolInputInvalid(
                    f"{rel} cannot be created: {parent} is a file",
                    fix="Choose a path whose folders are folders (or delete the file first).",
                )
        return rel

    def emit_patch(self, path: str, new_text: str) -> dict[str, str] | None:
        """Propose ``path``'s new content as a unified diff against the view.

        Returns the change, or None when the content is unchanged.  Falls back to a
        full file when a patch cannot express the change (a non-UTF-8 original, an
        empty new file).
        """
        rel = self._writable(path)
        old: str | None = None
        if self.view.is_file(rel):
            try:
                old = self.view.read_bytes(rel).decode("utf-8")
            except UnicodeDecodeError:
                return self.emit_full(rel, new_text)
        if old == new_text:
            return None
        diff = unified_diff(rel, old, new_text)
        if not diff:
            return self.emit_full(rel, new_text)
        name = self._change_file("diff", diff.encode("utf-8"))
        return self._record({"path": rel, "op": "patch", "file": name})

    def emit_full(self, path: str, content: str | bytes) -> dict[str, str]:
        """Propose ``path``'s complete new content (full-file mode)."""
        rel = self._writable(path)
        data = content.encode("utf-8") if isinstance(content, str) else content
        name = self._change_file("content", data)
        return self._record({"path": rel, "op": "full", "file": name})

    def emit_delete(self, path: str) -> dict[str, str]:
        """Propose deleting file ``path`` of the view."""
        rel = normalise_path(path)
        if not self.view.is_file(rel):
            raise ToolInputInvalid(
                f"{rel} is not a file of the project, so it cannot be deleted",
                fix="Check the path; search.glob lists the project's files.",
            )
        return self._record({"path": rel, "op": "delete"})
