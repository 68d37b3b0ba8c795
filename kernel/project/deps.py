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

A requirement fluffy cannot fetch offline (a path, a git URL, an editable) is left out
and named in :attr:`Requirements.skipped`.  :func:`env_inputs` hashes exactly the files
read, so the environment is rebuilt when one of them changes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from fluffy.kernel.project.files import (
    read_ini,
    read_text,
    read_toml,
    strings,
    table,
)

#: Extras and dependency groups that hold what the tests need.
TEST_SETS = frozenset({"test", "tests", "testing", "dev", "develop", "development"})
LOCK_FILES = ("uv.lock", "poetry.lock", "pdm.lock", "Pipfile.lock")
BASE_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "Pipfile")
_REQ_FILE = re.compile(r"(.*[-_])?requirements([-_.].*)?\.(txt|in)$|^(dev|test)s?[-_].*\.txt$")
_MAX_INCLUDE_DEPTH = 5
#: Requirements files for other jobs than testing (docs, linters, type checks, releases).
_NOT_FOR_TESTS = (
    *("doc", "lint", "mypy", "typecheck", "typing", "packaging", "release"),
    *("publish", "style", "format", "pre-commit", "ruff", "flake8", "black"),
)
#: A locked package with one of these keys is not from an index.
_LOCAL_KEYS = ("editable", "virtual", "directory", "path", "git", "url")


@dataclass
class Requirements:
    """The requirement set of a project's test environment."""

    requirements: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    build_requires: list[str] = field(default_factory=list)
    #: The project can be installed (it has packaging metadata).
    installable: bool = False
    name: str | None = None
    lock: str | None = None
    sources: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        """Canonical names of every requirement (for the natural-red third-party check)."""
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


def requirement_files(root: Path) -> list[str]:
    """Requirements files at the root and under ``requirements/`` (docs files left out)."""
    found: list[str] = []
    for folder in (".", "requirements"):
        base = root if folder == "." else root / folder
        try:
            names = sorted(p.name for p in base.iterdir() if p.is_file() and not p.is_symlink())
        except OSError:
            continue
        for name in names:
            if any(word in name.lower() for word in _NOT_FOR_TESTS):
                continue
            if (folder == "requirements" and name.endswith((".txt", ".in"))) or _REQ_FILE.match(
                name
            ):
                found.append(name if folder == "." else f"{folder}/{name}")
    # a .txt compiled from a .in (pip-tools) is the pinned one: prefer it
    return [f for f in found if not (f.endswith(".in") and f[:-3] + ".txt" in found)]


def _norm(name: str) -> str:
    return canonicalize_name(name)


def _parse(line: str, notes: list[str], origin: str) -> Requirement | None:
    try:
        return Requirement(line)
    except InvalidRequirement:
        notes.append(f"{origin}: {line!r} is not a requirement fluffy can fetch")
        return None


def _add(out: Requirements, line: str, origin: str) -> None:
    """Add one PEP 508 requirement (self-references expand the project's own extras)."""
    req = _parse(line, out.skipped, origin)
    if req is None:
        return
    if req.url:
        out.skipped.append(f"{req.name} ({origin}): a direct URL ({req.url[:80]})")
        return
    out.requirements.append(str(req))


# -- pyproject.toml -------------------------------------------------------------------
def _groups(pyproject: dict[str, Any], out: Requirements) -> None:
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
                _add(out, line, f"dependency group {key}")
            out.sources.append(f"dependency group `{key}`")


def _project_table(pyproject: dict[str, Any], out: Requirements) -> None:
    project = table(pyproject, "project")
    if not project:
        return
    name = project.get("name")
    out.name = name if isinstance(name, str) else out.name
    own = _norm(out.name) if out.name else None
    extras = table(project, "optional-dependencies")
    wanted = {key for key in extras if _norm(key) in TEST_SETS}
    lines = [(d, "dependencies") for d in strings(project.get("dependencies"))]
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
            req = _parse(line, out.skipped, f"extra {extra}")
            if req is not None and own is not None and _norm(req.name) == own:
                queue.extend(k for k in extras if _norm(k) in {_norm(e) for e in req.extras})
                continue  # the project itself: installed from the tree, never fetched
            lines.append((line, f"extra {extra}"))
    for line, origin in lines:
        _add(out, line, origin)


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


def _poetry_entry(name: str, value: Any, origin: str, out: Requirements) -> None:
    if _norm(name) == "python":
        return
    extras: list[str] = []
    marker = ""
    if isinstance(value, dict):
        if any(k in value for k in ("path", "git", "url", "file")):
            out.skipped.append(f"{name} ({origin}): a path, git or URL dependency")
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
        out.skipped.append(f"{name} ({origin}): the constraint {value!r} (the lock decides)")
        spec = ""
    line = name + (f"[{','.join(extras)}]" if extras else "") + spec
    _add(out, line + (f"; {marker}" if marker else ""), origin)


def _poetry(pyproject: dict[str, Any], out: Requirements) -> None:
    poetry = table(pyproject, "tool", "poetry")
    if not poetry:
        return
    name = poetry.get("name")
    out.name = out.name or (name if isinstance(name, str) else None)
    deps = table(poetry, "dependencies")
    for dep, value in deps.items():
        _poetry_entry(dep, value, "poetry dependencies", out)
    if deps:
        out.sources.append("`[tool.poetry.dependencies]`")
    for group, body in table(poetry, "group").items():
        if _norm(group) in TEST_SETS:
            for dep, value in table(body, "dependencies").items():
                _poetry_entry(dep, value, f"poetry group {group}", out)
            out.sources.append(f"poetry group `{group}`")
    for dep, value in table(poetry, "dev-dependencies").items():
        _poetry_entry(dep, value, "poetry dev-dependencies", out)


# -- setup.cfg / setup.py -----------------------------------------------------------
def _setup_cfg(root: Path, out: Requirements) -> None:
    cfg = read_ini(root, "setup.cfg", out.skipped)
    if cfg is None:
        return
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
            _add(out, line, "setup.cfg")


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
                    _add(out, line, f"setup.py {keyword.arg}")
            elif keyword.arg == "extras_require" and isinstance(value, dict):
                for extra, lines in value.items():
                    if isinstance(extra, str) and _norm(extra.split(":")[0]) in TEST_SETS:
                        for line in strings(lines):
                            _add(out, line, f"setup.py extra {extra}")
        out.sources.append("setup.py (literal arguments)")
        return


# -- Pipfile, requirements files, locks -------------------------------------------------
def _pipfile(root: Path, out: Requirements) -> None:
    locked = read_text(root, "Pipfile.lock")
    if locked is not None:
        try:
            data = json.loads(locked)
        except ValueError:
            data = None
        if isinstance(data, dict):
            for section in ("default", "develop"):
                for name, entry in table(data, section).items():
                    if not isinstance(entry, dict) or "version" not in entry:
                        out.skipped.append(f"{name} (Pipfile.lock): not from an index")
                        continue
                    marker = entry.get("markers")
                    line = f"{name}{entry['version']}" + (f"; {marker}" if marker else "")
                    _add(out, line, "Pipfile.lock")
            out.lock = "Pipfile.lock"
            out.sources.append("Pipfile.lock")
            return
    pipfile = read_toml(root, "Pipfile", out.skipped)
    for section in ("packages", "dev-packages"):
        for name, value in table(pipfile, section).items():
            _poetry_entry(name, value if value != "*" else "*", f"Pipfile {section}", out)
    if pipfile:
        out.sources.append("Pipfile")


def _requirements_text(
    root: Path, rel: str, out: Requirements, depth: int = 0, seen: set[str] | None = None
) -> None:
    seen = set() if seen is None else seen
    if rel in seen or depth > _MAX_INCLUDE_DEPTH:
        return
    seen.add(rel)
    text = read_text(root, rel, 4 * 1024 * 1024)
    if text is None:
        out.skipped.append(f"{rel}: not readable")
        return
    folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ", "-c ", "--constraint ")):
            target = line.split(None, 1)[1].strip()
            joined = f"{folder}/{target}" if folder else target
            if line.startswith(("-c", "--constraint")):
                _constraints_file(root, joined, out)
            else:
                _requirements_text(root, joined, out, depth + 1, seen)
            continue
        if line.startswith(("-e", "--editable", ".", "/")) or line.startswith("-"):
            if not line.startswith(("--hash", "-i", "--index-url", "--extra-index-url")):
                out.skipped.append(f"{rel}: {line[:80]!r} (an option or a local install)")
            continue
        _add(out, line.split(" --hash", 1)[0], rel)


def _constraints_file(root: Path, rel: str, out: Requirements) -> None:
    text = read_text(root, rel, 4 * 1024 * 1024) or ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(" --hash", 1)[0].strip()
        if line and not line.startswith("-"):
            out.constraints.append(line)


def _lock(root: Path, out: Requirements) -> None:
    for name in ("uv.lock", "poetry.lock", "pdm.lock"):
        data = read_toml(root, name, out.skipped)
        if data is None:
            continue
        own = _norm(out.name) if out.name else None
        for package in data.get("package") or []:
            if not isinstance(package, dict):
                continue
            pname, version = package.get("name"), package.get("version")
            source = package.get("source")
            source = source if isinstance(source, dict) else {}
            if any(k in source or k in package for k in _LOCAL_KEYS) or source.get("type") in (
                "directory",
                "git",
                "url",
                "file",
            ):
                continue  # the project itself, or not from an index
            if isinstance(pname, str) and isinstance(version, str) and _norm(pname) != own:
                out.constraints.append(f"{pname}=={version}")
        out.lock = name
        out.sources.append(f"versions pinned by {name}")
        return


def collect_requirements(root: Path) -> Requirements:
    """The project's requirement set (see the module docstring)."""
    out = Requirements()
    pyproject = read_toml(root, "pyproject.toml", out.skipped) or {}
    build = table(pyproject, "build-system")
    out.installable = bool(build)
    declared = "requires" in build  # PEP 518: present (even empty) means exactly these
    out.build_requires = strings(build.get("requires"))
    _project_table(pyproject, out)
    _groups(pyproject, out)
    _poetry(pyproject, out)
    _setup_cfg(root, out)
    _setup_py(root, out)
    _pipfile(root, out)
    for rel in requirement_files(root):
        before = len(out.requirements)
        _requirements_text(root, rel, out)
        if len(out.requirements) > before:
            out.sources.append(rel)
    if out.lock is None:
        _lock(root, out)
    if out.installable and not declared:
        out.build_requires = ["setuptools>=40.8.0", "wheel"]  # PEP 517's default backend
    out.requirements = list(dict.fromkeys(out.requirements))
    out.constraints = list(dict.fromkeys(out.constraints))
    return out


def input_files(root: Path) -> list[str]:
    """The files an environment is built from (present ones only)."""
    names = [*BASE_FILES, *LOCK_FILES, *requirement_files(root)]
    wheels = root / ".fluffy" / "wheels"
    if wheels.is_dir() and not wheels.is_symlink():
        names += sorted(f".fluffy/wheels/{p.name}" for p in wheels.glob("*.whl") if p.is_file())
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
    """The environment's cache key: its inputs, the image it builds on, the interpreter."""
    digest = hashlib.sha256(f"fluffy-env-v{scheme}\0{base_image}\0{python}\0".encode())
    for rel, sha in sorted(inputs.items()):
        digest.update(f"{rel}\0{sha}\0".encode())
    return digest.hexdigest()[:16]
