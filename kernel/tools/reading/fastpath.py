"""Kernel-native read-only tools: fs.read, fs.list, fs.exists, search.grep, search.glob.

The design's fast path: high-frequency reads run in the kernel, with no sandbox and no
second IPC hop.  They only ever *read* (the architectural invariant: every write goes
through a sandbox and the merge).  What they read is the session's *view*: the project
with the session's staged, not yet merged changes laid over it, so the AI sees what it
wrote.

Paths are the AI's: relative to the project, a leading ``/`` meaning the project root
("/src/app.py").  They are normalised and their symlinks resolved; anything that leads
outside the project is refused.  Files larger than ``read_max_size`` are read by line
range only; binary files (a NUL byte in the first 8 KiB) are described, not returned.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import re2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fluffy.errors import ToolFailed, ToolInputInvalid
from fluffy.kernel.globs import Patterns, is_secret_file
from fluffy.kernel.policy.request_paths import PathEscape, normalize
from fluffy.kernel.project.viewfiles import ignored_dir, ignored_file
from fluffy.kernel.workflow.states import Mode
from fluffy.pathnames import is_utf8, shown

BINARY_PROBE = 8192
#: Files search.grep skips (and fs.read refuses whole above read_max_size).
GREP_MAX_FILE = 1024 * 1024
GREP_MAX_LINE = 500
#: fs.list's note beside a name that is not UTF-8 (shown quoted, as git shows it).
UNNAMEABLE = "not UTF-8: the person's file; fluffy's tools cannot name it"
#: RE2 compiles a pattern within this much memory, or refuses it.
GREP_MAX_REGEX_MEMORY = 8 * 1024 * 1024


class StagedView(Protocol):
    """The session's staged changes (kernel.merge.staging.Staging satisfies it)."""

    def overlay(self) -> Mapping[str, str | None]: ...
    def read(self, rel: str) -> bytes | None: ...


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class ReadArgs(_Args):
    path: str = Field(description="File path relative to the project root")
    start_line: int = Field(1, ge=1, description="First line to return (1-based)")
    max_lines: int | None = Field(None, ge=1, le=100_000, description="Lines to return")


class ListArgs(_Args):
    path: str = Field(".", description="Directory relative to the project root")


class ExistsArgs(_Args):
    path: str


class GrepArgs(_Args):
    pattern: str = Field(min_length=1, max_length=1000, description="Python regular expression")
    path: str = Field(".", description="Directory or file to search")
    glob: str | None = Field(None, description="Only files matching this gitignore-style glob")
    case_insensitive: bool = False
    max_results: int = Field(200, ge=1, le=5000)


class GlobArgs(_Args):
    pattern: str = Field(min_length=1, max_length=1000, description="gitignore-style glob")
    max_results: int = Field(500, ge=1, le=20_000)


class PlanArgs(_Args):
    summary: str = Field("", max_length=4000, description="The plan, in a few lines")


class ExemptionArgs(_Args):
    category: str = Field(
        min_length=1,
        max_length=64,
        description="config_change, type_refactor, documentation or asset_update",
    )
    paths: list[str] = Field(
        min_length=1, max_length=100, description="The project files the change covers"
    )
    reason: str = Field(min_length=1, max_length=2000, description="Why TDD does not apply")


class ModeArgs(_Args):
    mode: Mode = Field(description="strict, explore or debug")
    reason: str = Field(min_length=1, max_length=2000, description="Why this mode fits the task")


class AddTestsArgs(_Args):
    reason: str = Field(
        min_length=1, max_length=2000, description="Why the change should get tests first"
    )


#: The kernel's workflow tools (kind ``workflow``): the state machine answers them.
WORKFLOW_TOOLS = frozenset(
    {"plan.complete", "workflow.request_exemption", "workflow.add_tests", "workflow.request_mode"}
)

ARGS: dict[str, type[_Args]] = {
    "fs.read": ReadArgs,
    "fs.list": ListArgs,
    "fs.exists": ExistsArgs,
    "search.grep": GrepArgs,
    "search.glob": GlobArgs,
    "plan.complete": PlanArgs,
    "workflow.request_exemption": ExemptionArgs,
    "workflow.add_tests": AddTestsArgs,
    "workflow.request_mode": ModeArgs,
}
DESCRIPTIONS = {
    "fs.read": "Read a text file of the project (optionally a line range).",
    "fs.list": "List a directory of the project.",
    "fs.exists": "Tell whether a path exists in the project.",
    "search.grep": "Search file contents with a regular expression.",
    "search.glob": "Find files whose paths match a glob.",
    "plan.complete": "Finish planning; the workflow moves on (strict: to writing tests).",
    "workflow.request_exemption": (
        "Ask the user for a TDD exemption (config, docs, assets, type-only changes) for "
        "named files; the user decides, and the turn waits for the answer."
    ),
    "workflow.add_tests": (
        "Ask the user to add tests before this explore change is merged; the user decides "
        "at the review."
    ),
    "workflow.request_mode": (
        "While planning, ask the user to switch this session's mode (strict: tests first; "
        "explore: no tests first, a coverage budget; debug: explore plus commands the user "
        "reviews). The user decides at once; the turn waits for the answer."
    ),
}


class _Schema(Mapping[str, Any]):
    """A tool's JSON schema, made from its model when first read: the kernel builds its
    registry while it starts, and pydantic's schema generation for these nine models
    (~5 ms, and its json_schema module) is not needed until a model is told its tools."""

    __slots__ = ("_model", "_schema")

    def __init__(self, model: type[_Args]) -> None:
        self._model = model
        self._schema: dict[str, Any] | None = None

    def _made(self) -> dict[str, Any]:
        if self._schema is None:
            self._schema = self._model.model_json_schema()
        return self._schema

    def __getitem__(self, key: str) -> Any:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


def kernel_tools() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """name -> (description, JSON schema) of the kernel's own tools."""
    return {name: (DESCRIPTIONS[name], _Schema(model)) for name, model in ARGS.items()}


def parse_args(tool: str, args: Any) -> Any:
    try:
        return ARGS[tool].model_validate(args if args is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(arguments)"
        raise ToolInputInvalid(
            f"{tool}: argument {where}: {first['msg']}",
            why=f"{len(exc.errors())} problem(s) with the arguments",
        ) from None


def _linear_regex(pattern: str, ignore_case: bool) -> Any:
    """The model's pattern in RE2: time linear in the text, memory capped, so no pattern
    (``([\\w ]+)+!`` and the like) can stall the kernel's event loop."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    options.max_mem = GREP_MAX_REGEX_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ToolInputInvalid(
            f"search.grep: {pattern!r} is not an RE2 regular expression: {why}",
            fix="search.grep uses RE2 syntax (as ripgrep does): no backreferences or "
            "lookaround; search for a simpler pattern and filter the matches.",
        ) from None


@dataclass
class FastPath:
    project: Path
    read_max_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        self.project = self.project.resolve()

    # -- paths ------------------------------------------------------------------------
    def rel(self, raw: str) -> str:
        """The AI's path as a normalised project-relative path ('.' = the root)."""
        text = raw.strip()
        if text.startswith("/") and not text.startswith(self.project.as_posix() + "/"):
            text = text.lstrip("/") or "."
        try:
            return normalize(text, self.project)
        except PathEscape as exc:
            raise ToolInputInvalid(
                f"path {raw!r} is not inside the project",
                why=str(exc),
                fix="Use a path relative to the project root, without '..'.",
            ) from None

    def files(self, stage: StagedView | None, under: str = ".") -> Iterator[str]:
        """Every file of the view (ignored folders skipped, symlinks not followed)."""
        overlay = stage.overlay() if stage is not None else {}
        base = self.project if under == "." else self.project / under
        prefix = "" if under == "." else under.rstrip("/") + "/"
        stack = [base] if base.is_dir() and not base.is_symlink() else []
        seen: set[str] = set()
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as entries:
                    found = sorted(entries, key=lambda e: e.name)
            except OSError:
                continue
            for entry in found:
                if not is_utf8(entry.name):  # no tool of the model's can name it
                    continue
                rel = Path(entry.path).relative_to(self.project).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    if not ignored_dir(entry.name):
                        stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False) and not ignored_file(entry.name):
                    seen.add(rel)
                    if overlay.get(rel, "") is not None:  # not staged for deletion
                        yield rel
        for rel, staged in sorted(overlay.items()):
            if staged is not None and rel not in seen and (not prefix or rel.startswith(prefix)):
                yield rel

    def content(self, rel: str, stage: StagedView | None) -> tuple[bytes, bool] | None:
        """(bytes, staged?) of a file of the view, or None if there is none."""
        if stage is not None:
            overlay = stage.overlay()
            if rel in overlay:
                data = stage.read(rel)
                return None if data is None else (data, True)
        path = self.project / rel
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ToolFailed(
                f"cannot read {rel}",
                why=exc.strerror or str(exc),
                fix="Check that the path exists and is readable in the project.",
            ) from None
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolFailed(f"{rel} is a directory", fix="Use fs.list for directories.")
            if not stat.S_ISREG(info.st_mode):
                raise ToolFailed(
                    f"{rel} is not a regular file (a device, FIFO or socket)",
                    fix="Read regular files only; fs.list shows what a folder holds.",
                )
            if info.st_size > self.read_max_bytes * 64:
                raise ToolFailed(
                    f"{rel} is {info.st_size} bytes, too large to read",
                    fix="Search it with search.grep instead.",
                )
            with os.fdopen(fd, "rb", closefd=False) as fh:
                return fh.read(), False
        finally:
            os.close(fd)

    # -- tools ------------------------------------------------------------------------
    def read(
        self, args: ReadArgs, stage: StagedView | None, *, normalized: bool = False
    ) -> dict[str, Any]:
        rel = args.path if normalized else self.rel(args.path)
        self.not_secret(rel, stage)
        found = self.content(rel, stage)
        if found is None:
            raise ToolFailed(
                f"{rel} does not exist", fix="List the folder with fs.list or search.glob."
            )
        data, staged = found
        if b"\x00" in data[:BINARY_PROBE]:
            return {
                "path": rel,
                "binary": True,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "staged": staged,
            }
        whole = args.start_line == 1 and args.max_lines is None
        if whole and len(data) > self.read_max_bytes:
            raise ToolFailed(
                f"{rel} is {len(data)} bytes, more than fs.read returns at once "
                f"({self.read_max_bytes})",
                fix="Ask for a line range with start_line and max_lines.",
            )
        text = data.decode("utf-8", "replace")
        lines = text.splitlines(keepends=True)
        first = args.start_line - 1
        last = len(lines) if args.max_lines is None else min(len(lines), first + args.max_lines)
        chunk = text if whole else "".join(lines[first:last])
        if len(chunk.encode()) > self.read_max_bytes:
            raise ToolFailed(
                f"lines {args.start_line}-{last} of {rel} are more than fs.read returns at once",
                fix="Ask for fewer lines.",
            )
        return {
            "path": rel,
            "content": chunk,
            "size": len(data),
            "total_lines": len(lines),
            "start_line": args.start_line,
            "end_line": last,
            "staged": staged,
        }

    def not_secret(self, rel: str, stage: StagedView | None) -> None:
        """The person's secret files are not read to the model (the session's own staged
        version is: the model wrote it)."""
        if is_secret_file(rel) and (stage is None or rel not in stage.overlay()):
            raise ToolFailed(
                f"{rel} holds secrets, and fluffy does not show it to the model",
                why="files such as .env, keys and credentials are the person's; a model "
                "that reads one could carry it into a file or its answer",
                fix="Ask the person for what you need from it (names of settings, not "
                "values); an example file (.env.example) can be read.",
            )

    def list(
        self, args: ListArgs, stage: StagedView | None, *, normalized: bool = False
    ) -> dict[str, Any]:
        rel = args.path if normalized else self.rel(args.path)
        folder = self.project if rel == "." else self.project / rel
        overlay = stage.overlay() if stage is not None else {}
        prefix = "" if rel == "." else rel + "/"
        entries: dict[str, dict[str, Any]] = {}
        if folder.is_dir():
            with os.scandir(folder) as found:
                for entry in found:
                    kind = (
                        "symlink"
                        if entry.is_symlink()
                        else "dir"
                        if entry.is_dir(follow_symlinks=False)
                        else "file"
                    )
                    size = entry.stat(follow_symlinks=False).st_size if kind == "file" else None
                    entries[entry.name] = {"name": entry.name, "type": kind, "size": size}
                    if not is_utf8(entry.name):  # shown quoted, as git shows it
                        entries[entry.name].update(name=shown(entry.name), note=UNNAMEABLE)
        elif not any(path.startswith(prefix) for path, h in overlay.items() if h is not None):
            raise ToolFailed(
                f"{rel} is not a directory of the project",
                fix="List an existing folder; fs.list with no path lists the project's root.",
            )
        for path, staged in overlay.items():
            if not path.startswith(prefix):
                continue
            head, _, rest = path[len(prefix) :].partition("/")
            if staged is None and not rest:
                entries.pop(head, None)
            elif staged is not None and head not in entries:
                entries[head] = {
                    "name": head,
                    "type": "dir" if rest else "file",
                    "size": None,
                    "staged": True,
                }
        return {"path": rel, "entries": [entries[k] for k in sorted(entries)]}

    def exists(
        self, args: ExistsArgs, stage: StagedView | None, *, normalized: bool = False
    ) -> dict[str, Any]:
        rel = args.path if normalized else self.rel(args.path)
        overlay = stage.overlay() if stage is not None else {}
        if rel in overlay:
            return {"path": rel, "exists": overlay[rel] is not None, "type": "file"}
        path = self.project / rel
        if not os.path.lexists(path):
            staged_dir = any(p.startswith(rel + "/") and h for p, h in overlay.items())
            return {"path": rel, "exists": staged_dir, "type": "dir" if staged_dir else None}
        kind = "symlink" if path.is_symlink() else "dir" if path.is_dir() else "file"
        return {"path": rel, "exists": True, "type": kind}

    def grep(self, args: GrepArgs, stage: StagedView | None) -> dict[str, Any]:
        regex = _linear_regex(args.pattern, args.case_insensitive)
        only = Patterns([args.glob]) if args.glob else None
        under = self.rel(args.path)
        overlay = stage.overlay() if stage is not None else {}
        candidates: Iterable[str]
        if under != "." and under in overlay:  # a file of the view: staged, or deleted
            candidates = [under] if overlay[under] is not None else []
        elif under != "." and (self.project / under).is_file():
            candidates = [under]
        else:
            candidates = self.files(stage, under)
        matches: list[dict[str, Any]] = []
        truncated = False
        for rel in candidates:
            if only is not None and not only.match(rel):
                continue
            if is_secret_file(rel) and rel not in overlay:
                continue  # the person's secrets are not searched (see not_secret)
            found = self.content(rel, stage)
            if found is None or len(found[0]) > GREP_MAX_FILE:
                continue
            data = found[0]
            if b"\x00" in data[:BINARY_PROBE]:
                continue
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                if regex.search(line):
                    if len(matches) >= args.max_results:
                        truncated = True
                        break
                    matches.append({"path": rel, "line": number, "text": line[:GREP_MAX_LINE]})
            if truncated:
                break
        return {"matches": matches, "truncated": truncated}

    def glob(self, args: GlobArgs, stage: StagedView | None) -> dict[str, Any]:
        spec = Patterns([args.pattern.lstrip("/") or "*"])
        paths: list[str] = []
        truncated = False
        for rel in self.files(stage):
            if spec.match(rel):
                if len(paths) >= args.max_results:
                    truncated = True
                    break
                paths.append(rel)
        return {"paths": sorted(paths), "truncated": truncated}

    def run(
        self, tool: str, args: Any, stage: StagedView | None, *, normalized: bool = False
    ) -> dict[str, Any]:
        """Run ``tool``; ``normalized``: the path is already :meth:`rel`'s (the router's)."""
        parsed = parse_args(tool, args)
        if isinstance(parsed, ReadArgs):
            return self.read(parsed, stage, normalized=normalized)
        if isinstance(parsed, ListArgs):
            return self.list(parsed, stage, normalized=normalized)
        if isinstance(parsed, ExistsArgs):
            return self.exists(parsed, stage, normalized=normalized)
        if isinstance(parsed, GrepArgs):
            return self.grep(parsed, stage)
        if isinstance(parsed, GlobArgs):
            return self.glob(parsed, stage)
        raise ToolInputInvalid(f"{tool} is not a kernel-native read tool")
