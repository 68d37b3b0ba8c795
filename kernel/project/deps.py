"""What a project's tests need installed, read from its own files (never by running them).

The sources, each optional:

* ``pyproject.toml``: ``[project] dependencies``; the extras ``test``/``tests``/``testing``
  /``dev`` of ``[project.optional-dependencies]``; the groups of the same names in
  ``[dependency-groups]`` (PEP 735, ``include-group`` followed); Poetry's
  ``[tool.poetry.dependencies]`` and its test/dev groups (caret and tilde ranges turned
  into PEP 440); ``[build-system] requires`` for the project's own install;
* ``setup.cfg`` (``install_requires``, the same extras) and ``setup.py`` (literal
  ``install_requires`` / ``extras_require`` / ``tests_require`` read with ``ast``: a
  setup.py is never executed on the host);
* ``Pipfile`` (``[packages]``, ``[dev-packages]``), or ``Pipfile.lock`` when present;
* requirements files: ``requirements*.txt``, ``*-requirements.txt``,
  ``requirements/*.txt`` (docs files left out), their ``-r``/``-c`` includes inlined;
* a lock file (``uv.lock``, ``poetry.lock``, ``pdm.lock``) becomes *constraints*: the
  versions it pins, applied to whatever the sources above ask for.

Every line is parsed as data (:mod:`fluffy.kernel.project.reqlines`) and re-rendered from
its parts; a line fluffy will not fetch (a URL, VCS, a local path, a pip option, a name
that does not parse) is never passed on and is named, with its file and line, in
:attr:`Requirements.refused`.  :func:`env_inputs` hashes exactly the files read, so the
environment is rebuilt when one of them changes.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from fluffy.kernel.project.files import read_ini, read_text, read_toml, strings, table
from fluffy.kernel.project.lockfiles import LOCK_FILES, Locked, pipfile_lock, toml_lock
from fluffy.kernel.project.reqfiles import RequirementsReader, requirement_files
from fluffy.kernel.project.reqlines import Refusal, line_of, requirement, requirement_line
from fluffy.pathnames import is_utf8

__all__ = ["Requirements", "collect_requirements", "env_inputs", "env_key", "input_files",
           "poetry_spec", "requirement_files"]  # fmt: skip

#: Extras and dependency groups that hold what the tests need.
TEST_SETS = frozenset({"test", "tests", "testing", "dev", "develop", "development"})
BASE_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "Pipfile")
#: PEP 517's default backend, for a project that declares none.
DEFAULT_BUILD_REQUIRES = ["setuptools>=40.8.0", "wheel"]


class Requirements(msgspec.Struct):
    """The requirement set of a project's test environment."""

    requirements: list[str] = msgspec.field(default_factory=list)
    constraints: list[str] = msgspec.field(default_factory=list)
    build_requires: list[str] = msgspec.field(default_factory=list)
    #: The project can be installed (it has packaging metadata).
    installable: bool = False
    name: str | None = None
    lock: str | None = None
    sources: list[str] = msgspec.field(default_factory=list)
    #: Notes on what was not read (a file that does not parse, a Poetry ``||`` range).
    skipped: list[str] = msgspec.field(default_factory=list)
    #: Lines never fetched (URLs, VCS, paths, options), each with its file and line.
    refused: list[Refusal] = msgspec.field(default_factory=list)
    #: ``name==version`` -> the sha256s a lock or a ``--hash`` allows for its files
    hashes: dict[str, set[str]] = msgspec.field(default_factory=dict)
    #: Where each requirement was read (line -> "file:line"), for errors that name it.
    origins: dict[str, str] = msgspec.field(default_factory=dict)
    #: Every requirements or constraints file read (includes too): the environment's inputs.
    files: list[str] = msgspec.field(default_factory=list)

    @property
    def names(self) -> set[str]:
        """Canonical names of every requirement (for the natural-red third-party check)."""
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name

        found: set[str] = set()
        for line in self.requirements:
            try:
                found.add(canonicalize_name(Requirement(line).name))
            except InvalidRequirement:
                continue
        return found

    def wanted(self) -> bool:
        """Whether an environment is worth building (anything to install)."""
        return bool(self.requirements) or self.installable

    def add(self, line: str, where: str) -> None:
        """One PEP 508 requirement, parsed (a URL, path or option is refused)."""
        kept = requirement_line(line, where, self.refused)
        if kept is not None:
            self.requirements.append(kept)
            self.origins.setdefault(kept, where)

    def constrain(self, line: str, where: str) -> None:
        """One constraint, already parsed and rendered by the reader."""
        self.constraints.append(line)
        self.origins.setdefault(line, where)

    def take(self, locked: Locked) -> None:
        self.lock = locked.name
        self.refused += locked.refused
        for line in locked.requirements:
            self.requirements.append(line)
            self.origins.setdefault(line, str(locked.name))
        for line in locked.constraints:
            self.constrain(line, str(locked.name))
        for key, digests in locked.hashes.items():
            self.hashes.setdefault(key, set()).update(digests)


def _norm(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


class _Source:
    """A configuration file's text, to name the line an entry came from."""

    def __init__(self, rel: str, text: str | None) -> None:
        self.rel, self.text = rel, text

    def where(self, needle: str) -> str:
        return f"{self.rel}:{line_of(self.text, needle) or '?'}"

    def add(self, out: Requirements, line: str) -> None:
        out.add(line, self.where(line))


# -- pyproject.toml -------------------------------------------------------------------
def _groups(pyproject: dict[str, Any], src: _Source, out: Requirements) -> None:
    groups = table(pyproject, "dependency-groups")

    def expand(name: str, seen: set[str]) -> list[str]:
        items: list[str] = []
        for key, entries in groups.items():
            if _norm(key) != name or key in seen:
                continue
            seen.add(key)
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, str):
                    items.append(entry)
                elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
                    items.extend(expand(_norm(entry["include-group"]), seen))
        return items

    for key in groups:
        if _norm(key) in TEST_SETS:
            for line in expand(_norm(key), set()):
                src.add(out, line)
            out.sources.append(f"dependency group `{key}`")


def _project_table(pyproject: dict[str, Any], src: _Source, out: Requirements) -> None:
    project = table(pyproject, "project")
    if not project:
        return
    name = project.get("name")
    out.name = name if isinstance(name, str) else out.name
    own = _norm(out.name) if out.name else None
    extras = table(project, "optional-dependencies")
    wanted = {key for key in extras if _norm(key) in TEST_SETS}
    lines = list(strings(project.get("dependencies")))
    if lines:
        out.sources.append("`[project] dependencies`")
    queue = sorted(wanted)
    done: set[str] = set()
    while queue:
        extra = queue.pop()
        if extra in done:
            continue
        done.add(extra)
        out.sources.append(f"extra `{extra}`")
        for line in strings(extras.get(extra)):
            req = requirement(line, src.where(line), out.refused)
            if req is None:
                continue
            if own is not None and _norm(req.name) == own:
                queue.extend(k for k in extras if _norm(k) in {_norm(e) for e in req.extras})
                continue  # the project itself: installed from the tree, never fetched
            lines.append(line)
    for line in lines:
        src.add(out, line)


_RANGE = re.compile(r"^([\^~])\s*(\d+(?:\.\d+){0,2})(\S*)$")


def _caret_or_tilde(kind: str, version: str, suffix: str) -> list[str]:
    """``^1.2.3`` -> ``>=1.2.3,<2``; ``^0.2`` -> ``>=0.2,<0.3``; ``~1.2.3`` -> ``<1.3``."""
    nums = [int(x) for x in version.split(".")]
    if kind == "^":
        index = next((i for i, n in enumerate(nums) if n), len(nums) - 1)
    else:
        index = 1 if len(nums) >= 2 else 0
    upper = [*nums[:index], nums[index] + 1]
    return [f">={version}{suffix}", "<" + ".".join(str(n) for n in upper)]


def poetry_spec(spec: str) -> str | None:
    """A Poetry version constraint as PEP 440 (None: not expressible, e.g. ``||``)."""
    spec = spec.strip()
    if spec in ("", "*"):
        return ""
    if "||" in spec:
        return None
    parts: list[str] = []
    for piece in (p.strip() for p in spec.split(",")):
        found = _RANGE.match(piece)
        if found and not piece.startswith("~="):
            parts += _caret_or_tilde(found.group(1), found.group(2), found.group(3))
        elif piece[:1].isdigit():
            parts.append(f"=={piece}")
        else:
            parts.append(piece)
    return ",".join(parts)


def _poetry_entry(name: str, value: Any, src: _Source, out: Requirements) -> None:
    if _norm(name) == "python":
        return
    where = src.where(name)
    extras: list[str] = []
    marker = ""
    if isinstance(value, dict):
        if any(k in value for k in ("path", "git", "url", "file")):
            out.refused.append(Refusal(where, name, "a path, git or URL dependency, not a "
                                       "release from the package index"))  # fmt: skip
            return
        if value.get("optional"):
            return
        extras = strings(value.get("extras"))
        markers = value.get("markers")
        marker = markers if isinstance(markers, str) else ""
        value = value.get("version", "*")
    if isinstance(value, list):  # multiple-constraint dependencies: the lock decides
        value = "*"
    spec = poetry_spec(str(value))
    if spec is None:
        out.skipped.append(f"{name} ({where}): the constraint {value!r} (the lock decides)")
        spec = ""
    line = name + (f"[{','.join(extras)}]" if extras else "") + spec
    out.add(line + (f"; {marker}" if marker else ""), where)


def _poetry(pyproject: dict[str, Any], src: _Source, out: Requirements) -> None:
    poetry = table(pyproject, "tool", "poetry")
    if not poetry:
        return
    name = poetry.get("name")
    out.name = out.name or (name if isinstance(name, str) else None)
    deps = table(poetry, "dependencies")
    for dep, value in deps.items():
        _poetry_entry(dep, value, src, out)
    if deps:
        out.sources.append("`[tool.poetry.dependencies]`")
    for group, body in table(poetry, "group").items():
        if _norm(group) in TEST_SETS:
            for dep, value in table(body, "dependencies").items():
                _poetry_entry(dep, value, src, out)
            out.sources.append(f"poetry group `{group}`")
    for dep, value in table(poetry, "dev-dependencies").items():
        _poetry_entry(dep, value, src, out)


# -- setup.cfg / setup.py -----------------------------------------------------------
def _setup_cfg(root: Path, out: Requirements) -> None:
    cfg = read_ini(root, "setup.cfg", out.skipped)
    if cfg is None:
        return
    src = _Source("setup.cfg", read_text(root, "setup.cfg"))
    name = cfg.get("metadata", "name", fallback=None)
    out.name = out.name or name
    if cfg.has_section("options") or cfg.has_section("metadata"):
        out.installable = True
    lines = [
        line for line in (cfg.get("options", "install_requires", fallback="") or "").splitlines()
    ]
    if cfg.has_section("options.extras_require"):
        for extra, value in cfg.items("options.extras_require"):
            if _norm(extra) in TEST_SETS:
                lines += value.splitlines()
                out.sources.append(f"setup.cfg extra `{extra}`")
    for line in (raw.split("#", 1)[0].strip() for raw in lines):
        if line:
            src.add(out, line)


def _literal(node: ast.AST, names: Mapping[str, ast.AST]) -> Any:
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _setup_py(root: Path, out: Requirements) -> None:
    text = read_text(root, "setup.py", 1024 * 1024)
    if text is None:
        return
    src = _Source("setup.py", text)
    out.installable = True
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        out.skipped.append("setup.py does not parse; its requirements were not read")
        return
    names = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        func = call.func
        if getattr(func, "id", getattr(func, "attr", "")) != "setup":
            continue
        for keyword in call.keywords:
            value = _literal(keyword.value, names) if keyword.arg else None
            if keyword.arg in ("install_requires", "tests_require"):
                for line in strings(value):
                    src.add(out, line)
            elif keyword.arg == "extras_require" and isinstance(value, dict):
                for extra, lines in value.items():
                    if isinstance(extra, str) and _norm(extra.split(":")[0]) in TEST_SETS:
                        for line in strings(lines):
                            src.add(out, line)
        out.sources.append("setup.py (literal arguments)")
        return


# -- Pipfile, requirements files, build requirements ------------------------------------
def _pipfile(root: Path, out: Requirements) -> None:
    locked = pipfile_lock(root)
    if locked is not None:
        out.take(locked)
        out.sources.append("Pipfile.lock")
        return
    pipfile = read_toml(root, "Pipfile", out.skipped)
    src = _Source("Pipfile", read_text(root, "Pipfile"))
    for section in ("packages", "dev-packages"):
        for name, value in table(pipfile, section).items():
            _poetry_entry(name, value, src, out)
    if pipfile:
        out.sources.append("Pipfile")


def _build_requires(build: dict[str, Any], src: _Source, out: Requirements) -> None:
    """``[build-system] requires``, parsed like every other line (a URL here would run its
    backend on this machine at download time)."""
    for line in strings(build.get("requires")):
        kept = requirement_line(line, src.where(line), out.refused)
        if kept is not None:
            out.build_requires.append(kept)


def collect_requirements(root: Path) -> Requirements:
    """The project's requirement set (see the module docstring)."""
    out = Requirements()
    pyproject = read_toml(root, "pyproject.toml", out.skipped) or {}
    src = _Source("pyproject.toml", read_text(root, "pyproject.toml"))
    build = table(pyproject, "build-system")
    out.installable = bool(build)
    declared = "requires" in build  # PEP 518: present (even empty) means exactly these
    _build_requires(build, src, out)
    _project_table(pyproject, src, out)
    _groups(pyproject, src, out)
    _poetry(pyproject, src, out)
    _setup_cfg(root, out)
    _setup_py(root, out)
    _pipfile(root, out)
    reader = RequirementsReader(root, out.refused, out.hashes)
    for rel in requirement_files(root):
        before = len(out.requirements)
        reader.requirements(rel, out.add, out.constrain)
        if len(out.requirements) > before:
            out.sources.append(rel)
    out.files = reader.read
    if out.lock is None and (locked := toml_lock(root, out.name, out.skipped)) is not None:
        out.take(locked)
        out.sources.append(f"versions pinned by {locked.name}")
    if out.installable and not declared:
        out.build_requires = list(DEFAULT_BUILD_REQUIRES)
    out.requirements = list(dict.fromkeys(out.requirements))
    out.constraints = list(dict.fromkeys(out.constraints))
    return out


def input_files(root: Path) -> list[str]:
    """The files an environment is built from (present ones only): the project's
    configuration, lock files, every requirements or constraints file read (includes
    too), and the project's own wheels."""
    names = [*BASE_FILES, *LOCK_FILES, *requirement_files(root), *collect_requirements(root).files]
    wheels = root / ".fluffy" / "wheels"
    if wheels.is_dir() and not wheels.is_symlink():
        names += sorted(
            f".fluffy/wheels/{p.name}"
            for p in wheels.glob("*.whl")
            if p.is_file() and is_utf8(p.name)  # no wheel's name is anything else
        )
    return [
        rel for rel in dict.fromkeys(names) if read_text(root, rel, 64 * 1024 * 1024) is not None
    ]


def env_inputs(root: Path) -> dict[str, str]:
    """rel path -> sha256 of every file the environment is built from."""
    out: dict[str, str] = {}
    for rel in input_files(root):
        data = (root / rel).read_bytes()
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def env_key(inputs: dict[str, str], base_image: str, python: str, scheme: int) -> str:
    """The environment's cache key: its inputs, the image it builds on, the interpreter.
    The image by its bare name: the host calls it ``fluffy/code-executor:<hash>``, Podman
    in L1 lists it as ``localhost/...`` and Docker may say ``docker.io/...`` -- one image,
    so one key (``fluffy env`` and ``test.run`` agree)."""
    for prefix in ("docker.io/", "localhost/"):
        base_image = base_image.removeprefix(prefix)
    digest = hashlib.sha256(f"fluffy-env-v{scheme}\0{base_image}\0{python}\0".encode())
    for rel, sha in sorted(inputs.items()):
        digest.update(f"{rel}\0{sha}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:16]
