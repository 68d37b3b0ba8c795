# What the engine gate lets L1 ask of the engine (stdlib only, pure functions).
#
# A request is matched against :data:`ROUTES` on its path without the API version prefix,
# once the path is plain (no path the engine would read as another); anything else is
# refused.  A container create body must be fluffy's hardened sandbox template exactly:
# :func:`create_body` refuses every deviation and returns the body to forward, serialised
# anew from what was checked (the project's label forced, the seccomp profile replaced by
# the gate's copy on Podman).

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

PROJECT_LABEL = "org.fluffy.project"
IMAGE = re.compile(r"^((docker\.io|localhost)/)?fluffy/[a-z0-9-]+:[0-9a-f]{12,64}$")
VERSION = re.compile(r"^/v(\d+)\.(\d+)(?=/)")
#: the oldest engine API the gate lets through (Docker 20.10, Podman 4): Docker applies a
#: HostConfig sent to start in versions before 1.24, and older versions change defaults
OLDEST_API = (1, 41)
#: a path the engine could read as another: a . or .. segment, //, %-escapes, \, or a
#: second version (the engines' routers clean or decode; the gate routes the plain form)
UNPLAIN = re.compile(r"/\.\.?(/|$)|//|%|\\|^/v\d")
ID = r"(?P<id>[A-Za-z0-9][A-Za-z0-9_.-]{0,127})"
#: (method, path pattern, kind): "open" needs nothing more, "list" gets the project's
#: label filter forced, "own" must name one of the project's containers.
ROUTES = [
    ("GET", r"/_ping", "open"), ("HEAD", r"/_ping", "open"), ("GET", r"/version", "open"),
    ("GET", r"/images/json", "open"), ("GET", r"/images/[A-Za-z0-9/_.:-]+/json", "open"),
    ("GET", r"/containers/json", "list"), ("GET", r"/volumes", "list"),
    ("POST", r"/containers/create", "create"),
    ("POST", rf"/containers/{ID}/(start|stop|kill|wait|pause|unpause)", "own"),
    ("GET", rf"/containers/{ID}/(json|logs)", "own"), ("DELETE", rf"/containers/{ID}", "own"),
]  # fmt: skip
#: The create body the kernel sends (docker SDK create_container, captured through the gate
#: on Docker and Podman), key by key: a type is a value checked below (lists and maps of
#: strings), a dict the template of an object, anything else a fixed value, forwarded
#: whether sent or not.  Keys match case-insensitively, as the engines' Go decoders match
#: them; any other key is refused, whatever its value (an empty MaskedPaths unmasks /proc).
HOST = {"Binds": list, "Tmpfs": dict, "Memory": int, "MemorySwap": int, "NanoCpus": int,
        "PidsLimit": int, "SecurityOpt": list, "NetworkMode": "none", "ReadonlyRootfs": True,
        "CapDrop": ["ALL"], "IpcMode": "private", "Init": False}  # fmt: skip
TOP = {"Image": str, "User": str, "Cmd": list, "Env": list, "WorkingDir": str, "Labels": dict,
       "HostConfig": HOST, "NetworkDisabled": True, "Tty": False, "OpenStdin": False,
       "StdinOnce": False, "AttachStdin": False, "AttachStdout": True,
       "AttachStderr": True}  # fmt: skip
TMPFS_OPTIONS = {"rw", "noexec", "exec", "nosuid", "nodev"}  # exec: /tmp only (test code)
UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, **dict.fromkeys("0123456789", 1)}  # tmpfs size=
TMPFS_TARGETS = ("/tmp", "/output")  # noqa: S108 (the sandbox's own scratch and output)


class Refused(Exception):
    """The gate says no: what was asked, why not (shown to L1 and logged)."""


@dataclass
class Scope:
    """One project's gate: its label, the host folders sandboxes may mount, the seccomp
    profiles it trusts (text -> host path), and the engine kind."""

    project_id: str
    project: Path
    writable: tuple[Path, ...]  # the kernel's state and socket folders (host paths)
    profiles: dict[str, Path]
    engine: str = "docker"
    owned: set[str] = field(default_factory=set)
    #: rootless Podman: the gate (never L1) sets UsernsMode keep-id (wire.userns), so a
    #: sandbox's uid is the user's own on the host, as L1's is
    userns: dict[str, str] = field(default_factory=dict)


def load_profiles(folder: Path) -> dict[str, Path]:
    """The generated seccomp profiles fluffy ships: canonical JSON -> file."""
    return {_canonical(path.read_text()): path for path in sorted(folder.glob("*.json"))}


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def route(method: str, path: str) -> tuple[str, str | None]:
    """(kind, container reference) for an allowed request; :class:`Refused` otherwise."""
    bare, _, query = path.partition("?")
    if (version := VERSION.match(bare)) and (int(version[1]), int(version[2])) < OLDEST_API:
        raise Refused(f"engine API {version[0][1:]} is older than the kernel's (1.41 or later)")
    bare = VERSION.sub("", bare, count=1)
    if UNPLAIN.search(bare) or ";" in query:  # a ; split the query before Go 1.17
        raise Refused(f"{path[:200]} is not a plain path (., .., //, %, \\, ; or a 2nd version)")
    # Docker reads a parameter's lower-case name, Podman any case: once, in lower case
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    if len(set(names)) < len(names) or not all(re.fullmatch("[a-z_]+", n) for n in names):
        raise Refused(f"a query parameter is repeated or not in lower case: {names!r:.200}")
    for want, pattern, kind in ROUTES:
        found = re.fullmatch(pattern, bare)
        if method == want and found:
            return kind, found.groupdict().get("id")
    raise Refused(f"{method} {bare} is not an operation fluffy's kernel uses")


def force_label(path: str, project_id: str) -> str:
    """A list request limited to the project's resources (its label filter added)."""
    base, _, query = path.partition("?")
    params = dict(parse_qsl(query))
    try:
        filters = json.loads(params.get("filters") or "{}", object_pairs_hook=_unique)
        labels = filters.get("label") or []
        labels = list(labels) if isinstance(labels, list) else [k for k, v in labels.items() if v]
    except (ValueError, AttributeError, TypeError, RecursionError):
        raise Refused("the list filter is not JSON of the engine's form") from None
    filters["label"] = [*labels, f"{PROJECT_LABEL}={project_id}"]
    params["filters"] = json.dumps(filters)
    return f"{base}?{urlencode(params)}"


def parse(body: bytes) -> Any:
    """A create body, refused if the engine could read it otherwise (see below)."""
    try:  # Go's decoder matches a key in any case and keeps the last: none twice
        data = json.loads(body or b"null", object_pairs_hook=_unique)
        json.dumps(data, ensure_ascii=False).encode()  # a lone surrogate: U+FFFD to Go
        return data
    except (ValueError, RecursionError):
        raise Refused("the create body is not JSON or has a lone surrogate (Go: U+FFFD)") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({key.casefold() for key, _ in pairs}) < len(pairs):
        raise Refused(f"a key is repeated in {[key for key, _ in pairs]!r:.200}")
    return dict(pairs)


def create_body(body: bytes, scope: Scope) -> bytes:
    """The create to forward: the template as checked, serialised anew (keys canonical)."""
    return json.dumps(check_create(parse(body), scope)).encode()


def check_create(body: Any, scope: Scope) -> dict[str, Any]:
    """The body to forward, or :class:`Refused` naming the first deviation."""
    out = _template(body, TOP, "")
    image, user = out.get("Image"), str(out.get("User"))
    if not isinstance(image, str) or not IMAGE.match(image):
        raise Refused(f"image {image!r} is not one of fluffy's content-hash images")
    if not re.fullmatch(r"[1-9]\d*:\d+", user):
        raise Refused(f"user {user!r} is not a numeric non-root uid:gid")
    # labels are data (matched exactly by the engines), the project's own forced
    labels = {k: v for k, v in out.get("Labels", {}).items() if k.casefold() != PROJECT_LABEL}
    out["Labels"] = {**labels, PROJECT_LABEL: scope.project_id}
    out["HostConfig"] = _check_host(out.get("HostConfig", {}), scope)
    return out


def _template(data: Any, spec: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` with ``spec``'s keys and fixed values, or :class:`Refused`."""
    if not isinstance(data, dict):
        raise Refused(f"{where.rstrip('.') or 'the create body'} is not a JSON object")
    names = {name.casefold(): name for name in spec}
    out = {name: want for name, want in spec.items() if not isinstance(want, type | dict)}
    for key, value in data.items():
        name = names.get(key.casefold(), "")
        want, shown = spec.get(name), f"{where}{name} {value!r:.80}"
        if not name:
            raise Refused(f"{where}{key} is set: fluffy's sandboxes never set it")
        if isinstance(want, dict):
            value = _template(value, want, f"{name}.")
        elif isinstance(want, type):
            items = value.values() if type(value) is dict else value if type(value) is list else ()
            if type(value) is not want or not all(type(item) is str for item in items):
                raise Refused(f"{shown} is not of the template's type ({want.__name__})")
        elif json.dumps(value) != json.dumps(want):
            raise Refused(f"{shown} is not {want!r}")
        out[name] = value
    return out


def _check_host(host: dict[str, Any], scope: Scope) -> dict[str, Any]:
    memory, cpus, pids = host.get("Memory"), host.get("NanoCpus"), host.get("PidsLimit")
    for name, value in (("Memory", memory), ("NanoCpus", cpus), ("PidsLimit", pids)):
        if type(value) is not int or value <= 0:
            raise Refused(f"HostConfig.{name} must be a positive limit, not {value!r}")
    if host.get("MemorySwap") != memory:
        raise Refused("HostConfig.MemorySwap must equal Memory (no swap beyond the limit)")
    if (pids or 0) > 4096 or (cpus or 0) > 64 * 10**9:
        raise Refused("HostConfig limits exceed the sandbox maximums (4096 pids, 64 CPUs)")
    for target, options in host.get("Tmpfs", {}).items():
        opts = set(options.split(","))
        sized = {o for o in opts if re.fullmatch(r"size=[1-9]\d{0,9}[kmg]?|mode=1?[0-7]{3}", o)}
        sizes = [int(o[5:].rstrip("kmg")) * UNITS[o[-1]] for o in sized if o[:5] == "size="]
        need = {"nosuid", "nodev", "noexec" if target != "/tmp" else "nodev"}  # noqa: S108
        safe = need <= opts and len(opts & {"exec", "noexec"}) == 1 and len(sizes) == 1
        safe = safe and sizes[0] <= 2**30 and not opts - TMPFS_OPTIONS - sized
        if target not in TMPFS_TARGETS or not safe:
            raise Refused(f"tmpfs {target!r} ({options!r}) is not a sized /tmp or noexec /output")
    return dict(host, Binds=[_check_bind(b, scope) for b in host.get("Binds", [])],
                SecurityOpt=_check_security(host.get("SecurityOpt", []), scope),
                **scope.userns)  # fmt: skip


def _check_bind(bind: str, scope: Scope) -> str:
    parts = bind.split(":")
    if len(parts) != 3 or parts[2] not in ("ro", "rw") or not parts[1].startswith("/"):
        raise Refused(f"bind {bind!r} is not source:target:ro|rw")
    # resolved here, and the resolved path is what the engine gets: a link planted by L1
    # in its own folders cannot lead the mount out of them
    source, real = parts[0], Path(os.path.realpath(parts[0]))
    if not real.is_dir() and not real.is_file():
        raise Refused(f"bind source {source} does not exist")
    if real == scope.project or scope.project in real.parents:
        if parts[2] != "ro":
            raise Refused(f"the project ({source}) is mounted read-only only")
    elif not any(real == root or root in real.parents for root in scope.writable):
        raise Refused(f"bind source {source} is outside the project and fluffy's folders")
    return f"{real}:{parts[1]}:{parts[2]}"


def _check_security(options: list[str], scope: Scope) -> list[str]:
    profile = [o for o in options if o.startswith("seccomp=")]
    rest = sorted(o for o in options if o not in profile)
    if rest != ["no-new-privileges:true"] or len(profile) != 1:
        raise Refused("SecurityOpt must be no-new-privileges:true and one seccomp profile")
    try:
        path = scope.profiles[_canonical(profile[0].removeprefix("seccomp="))]
    except (ValueError, KeyError):
        raise Refused("the seccomp profile is not one of fluffy's generated profiles") from None
    # Podman reads a profile from a file only: the gate's own copy, never the kernel's
    chosen = f"seccomp={path}" if scope.engine == "podman" else profile[0]
    return ["no-new-privileges:true", chosen]
