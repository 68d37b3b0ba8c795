"""A project's MCP servers: one record per server, ``.fluffy/mcp/NAME.json``.

``fluffy mcp add`` writes a record after the server's image was built and the server,
started once in its sandbox, listed its tools; the kernel reads the records at start
(and on ``mcp.reload``) and offers each tool to the model as ``mcp.NAME.TOOL``.  The
folder is part of what the kernel trusts, so a built-in policy rule protects it like the
policy file.  A record is untrusted input all the same (the project is the user's, and
the tools were described by the server): every field is validated, sizes are capped,
and a record that does not load is reported by name, never half-used.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fluffy.errors import McpServerInvalid, MergeRefused
from fluffy.kernel.confined_files import read_existing, write_atomic
from fluffy.kernel.mcp.schema import schema_problem
from fluffy.kernel.net.allowlist import ENTRY_SYNTAX, AllowList, AuthorityError, Rule

RECORD_DIR: Final = ".fluffy/mcp"
NAME_PATTERN: Final = r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$|^[a-z]$"
TOOL_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
IMAGE_PATTERN: Final = r"^fluffy/mcp-server:[0-9a-f]{12,64}$"
MAX_RECORD_BYTES: Final = 256 * 1024
MAX_TOOLS: Final = 128
MAX_DESCRIPTION: Final = 2000
MAX_SCHEMA_BYTES: Final = 16 * 1024
MAX_ARGS: Final = 64
MAX_HOSTS: Final = 32
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
#: Variables a server may not set: the sandbox's own plumbing.
RESERVED_ENV: Final = frozenset({"PATH", "HOME", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH"})


def _printable(text: str, what: str) -> str:
    if "\x00" in text or any(ord(c) < 32 and c not in "\t\n" for c in text):
        raise ValueError(f"{what} contains control characters")
    return text


class McpTool(BaseModel):
    """One tool as the server listed it (tools/list), checked and capped."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = Field(pattern=TOOL_PATTERN)
    description: str = Field(default="", max_length=MAX_DESCRIPTION)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    read_only: bool = False  # the server's readOnlyHint (shown to the user, never trusted)

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return _printable(value, "the description")

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(value)) > MAX_SCHEMA_BYTES:
            raise ValueError(f"the input schema is over {MAX_SCHEMA_BYTES} bytes")
        if value.get("type", "object") != "object":
            raise ValueError("the input schema must describe an object")
        problem = schema_problem(value)  # a provider would refuse every request with it
        if problem is not None:
            raise ValueError(f"the input schema is {problem}")
        return value


class McpServer(BaseModel):
    """A registered server: how to run it, what it was built from, what it offers."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    version: int = 1
    name: str = Field(pattern=NAME_PATTERN)
    command: list[str] = Field(min_length=1, max_length=MAX_ARGS)
    pip: list[str] = Field(default_factory=list, max_length=32)
    path: str | None = None  # the host folder its code was copied from (for the user)
    image: str = Field(pattern=IMAGE_PATTERN)
    packages: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    #: what it may reach through the kernel's proxy (network_whitelist syntax; each also
    #: needs the policy's network_whitelist); none: no network at all
    allowed_hosts: list[str] = Field(default_factory=list, max_length=MAX_HOSTS)
    tools: list[McpTool] = Field(default_factory=list, max_length=MAX_TOOLS)
    server_info: str = Field(default="", max_length=200)
    added_at: float = 0.0

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        for arg in value:
            if len(arg) > 4096:
                raise ValueError("an argument is over 4096 characters")
            _printable(arg, "the command")
        if not value[0].strip():
            raise ValueError("the command is empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _ENV_NAME.match(key) or key in RESERVED_ENV or key.startswith("FLUFFY_"):
                raise ValueError(f"{key!r} cannot be set for a server")
            if len(text) > 4096:
                raise ValueError(f"{key} is over 4096 characters")
            _printable(text, key)
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        entries = []
        for entry in value:
            try:
                entries.append(Rule.read(entry).entry)
            except AuthorityError as exc:
                raise ValueError(f"the host {entry!r} is invalid: {exc} ({ENTRY_SYNTAX})") from None
        if len({e.lower() for e in entries}) != len(entries):
            raise ValueError("a host is given twice")
        return entries

    @field_validator("tools")
    @classmethod
    def _unique(cls, value: list[McpTool]) -> list[McpTool]:
        names = [tool.name for tool in value]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same name")
        return value

    def hosts(self) -> AllowList | None:
        """Its own allow-list for the proxy; None when it may reach nothing."""
        if not self.allowed_hosts:
            return None
        return AllowList(Rule.read(entry) for entry in self.allowed_hosts)

    def tool_names(self) -> list[str]:
        return [f"mcp.{self.name}.{tool.name}" for tool in self.tools]


def check_name(name: str) -> str:
    if not re.match(NAME_PATTERN, name):
        raise McpServerInvalid(
            f"{name!r} is not a valid MCP server name",
            why="a server's name becomes part of its tools' names (mcp.NAME.TOOL) and of "
            "its record's file name",
            fix="Use lower-case letters, digits and '-', starting with a letter, at most "
            "32 characters (e.g. `time`, `git-repo`).",
        )
    return name


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in exc.errors()
    )


def parse_record(data: bytes, source: str) -> McpServer:
    try:
        raw = json.loads(data)
        return McpServer.model_validate(raw)
    except (ValueError, ValidationError) as exc:
        why = _problems(exc) if isinstance(exc, ValidationError) else str(exc)
        raise McpServerInvalid(
            f"the MCP server record {source} does not load",
            why=why[:1000],
            fix="Register the server again (`fluffy mcp remove NAME`, then `fluffy mcp add "
            "NAME ...`); records are written by fluffy, not by hand.",
        ) from None


def load_records(project: Path) -> tuple[dict[str, McpServer], dict[str, str]]:
    """(servers by name, problems by file name) of the project's records.

    A record that cannot be read as one (a link, too big, invalid, a name that does not
    match its file) is a problem, never a server; a missing folder is no servers."""
    servers: dict[str, McpServer] = {}
    problems: dict[str, str] = {}
    folder = project / RECORD_DIR
    if folder.is_symlink():
        return servers, {RECORD_DIR: "the folder is a link; records are read from the project"}
    if not folder.is_dir():
        return servers, problems
    for entry in sorted(folder.iterdir()):
        if not entry.name.endswith(".json"):
            continue
        rel = f"{RECORD_DIR}/{entry.name}"
        try:
            data = read_existing(project, rel, MAX_RECORD_BYTES)
            if data is None:
                continue
            server = parse_record(data, rel)
            if f"{server.name}.json" != entry.name:
                raise McpServerInvalid(f"{rel} names the server {server.name!r}")
        except MergeRefused as exc:
            problems[entry.name] = exc.why or exc.what
            continue
        except McpServerInvalid as exc:
            problems[entry.name] = f"{exc.what}: {exc.why}"
            continue
        servers[server.name] = server
    return servers, problems


def save_record(project: Path, server: McpServer) -> Path:
    data = json.dumps(server.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
    if len(data) > MAX_RECORD_BYTES:
        raise McpServerInvalid(
            f"the record of {server.name} would be over {MAX_RECORD_BYTES // 1024} KiB",
            why="the server lists too many or too large tools",
            fix="Use a server with fewer tools.",
        )
    write_atomic(project, f"{RECORD_DIR}/{server.name}.json", data.encode(), mode=0o644)
    return project / RECORD_DIR / f"{server.name}.json"


def remove_record(project: Path, name: str) -> bool:
    path = project / RECORD_DIR / f"{check_name(name)}.json"
    if path.is_symlink() or path.is_file():
        path.unlink()
        return True
    return False
