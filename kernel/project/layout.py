"""A project's layout as its own files say it: source roots, packages, test roots.

Detection reads, in order: the build backend's settings in ``pyproject.toml``
(setuptools ``package-dir`` / ``packages.find``, hatch's wheel ``packages``, poetry's
``packages``, flit's module, pdm's ``package-dir``), ``setup.cfg`` (``package_dir``,
``packages.find``), pytest's settings (``testpaths``, ``pythonpath``, in pytest's own
order: pytest.ini, pyproject.toml, tox.ini, setup.cfg), and then the folders themselves:
``src/<pkg>`` is a src layout, ``<pkg>/__init__.py`` at the top a flat one, ``<mod>.py``
at the top a single module.  :attr:`Layout.notes` says how each part was found; the first
session shows them, and ``fluffy init`` writes them into the policy's comments.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from fluffy.kernel.project.files import ini_list, is_folder, read_ini, read_toml, strings, table
from fluffy.kernel.project.nodelayout import (
    CODE_EXTS,
    NODE_TEST_GLOBS,
    NodeFacts,
    node_parts,
    node_project,
    tests_beside_code,
)

Kind = Literal["src", "flat", "modules", "empty", "node"]
Language = Literal["python", "javascript"]

#: Generic test file patterns (pytest's defaults and conftest files), always tests.
GENERIC_TEST_GLOBS = ("**/test_*.py", "**/*_test.py", "**/conftest.py")
#: Top-level folders that hold no importable project code.
NOT_PACKAGES = frozenset(
    {"tests", "test", "testing", "docs", "doc", "examples", "example", "scripts", "tools"}
    | {"benchmarks", "bench", "build", "dist", "site", "node_modules", "venv", "env"}
)
#: Top-level Python files that are tooling, not the project's code (tools run them by
#: their name: build, task runners, Python's own start-up hooks).
NOT_MODULES = frozenset(
    {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py", "dodo.py"}
    | {"sitecustomize.py", "usercustomize.py"}
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: At most this many packages are listed (a monorepo does not make a huge policy).
MAX_PACKAGES = 40


@dataclass(frozen=True)
class Layout:
    """What the project looks like (paths are relative, posix, ``.`` for the root)."""

    kind: Kind
    name: str | None = None
    #: Folders whose children are importable (``src``, ``.``).
    source_roots: tuple[str, ...] = (".",)
    #: Top-level importable packages and modules, as project paths.
    packages: tuple[str, ...] = ()
    #: Folders that hold the tests (existing, or where they would go).
    test_roots: tuple[str, ...] = ("tests",)
    #: pytest's own ``pythonpath`` setting (already on sys.path in a test run).
    pythonpath: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: what the code is written in; a JavaScript/TypeScript project's facts in ``node``
    language: Language = "python"
    node: NodeFacts | None = None

    @property
    def test_globs(self) -> tuple[str, ...]:
        roots = tuple(f"{root}/**" for root in self.test_roots if root not in ("", "."))
        generic = NODE_TEST_GLOBS if self.language == "javascript" else GENERIC_TEST_GLOBS
        return tuple(dict.fromkeys((*roots, *generic)))

    @property
    def source_globs(self) -> tuple[str, ...]:
        """Where code_writing may write: the source roots' trees, the flat packages and
        top-level modules (new top-level modules too, unless the code lives under a
        source root)."""
        globs: list[str] = []
        for root in self.source_roots:
            if root not in ("", "."):
                globs.append(f"{root}/**")
        top = "." in self.source_roots or not self.source_roots
        if self.language == "javascript":
            if top:
                globs += [f"*.{ext}" for ext in CODE_EXTS]
            return tuple(dict.fromkeys(globs))
        for package in self.packages:
            if "/" in package:
                continue  # under a source root, covered above
            globs.append(package if package.endswith(".py") else f"{package}/**")
        if top:
            globs.append("*.py")
        return tuple(dict.fromkeys(globs or ("src/**", "*.py")))

    @property
    def merge_globs(self) -> tuple[str, ...]:
        """Where a change may merge without review (ADR-054): the test globs, the source
        roots' trees, and at the project's top only its packages and modules: the ones
        found, and new modules where the code lives at the top (a ``.py`` file the layout
        would find as a module; tooling such as ``tasks.py`` is not) -- never the whole
        top, whose other files are configuration some tool on the host reads."""
        globs = [f"{root}/**" for root in self.source_roots if root not in ("", ".")]
        if self.language == "javascript":
            if "." in self.source_roots or not self.source_roots:  # code at the top, not
                # the tools' settings there (vite.config.ts, eslint.config.js, dotfiles)
                globs += [f"/*.{ext}" for ext in CODE_EXTS] + ["!/*.config.*", "!/.*"]
            return tuple(dict.fromkeys((*self.test_globs, *globs)))
        for package in self.packages:
            if "/" not in package:  # at the top (under a source root: covered above)
                globs.append(f"/{package}" if package.endswith(".py") else f"{package}/**")
        if "." in self.source_roots or not self.source_roots:
            tooling = sorted(NOT_MODULES - {"conftest.py"})  # conftest.py: a test file
            globs += ["/*.py", *(f"!/{name}" for name in tooling)]
        return tuple(dict.fromkeys((*self.test_globs, *globs)))

    def import_roots(self) -> tuple[str, ...]:
        """Folders to put on sys.path so the project imports without being installed."""
        return tuple(dict.fromkeys((*self.source_roots, *self.pythonpath)))

    def describe(self) -> str:
        """One line for people: ``src layout: src/humanize; tests in tests/``."""
        if self.language == "javascript" and self.node is not None:
            return describe_node(self)
        shown = ", ".join(self.packages[:4]) + (" ..." if len(self.packages) > 4 else "")
        label = {
            "src": "src layout",
            "flat": "flat layout",
            "modules": "single modules",
            "empty": "no Python code yet",
        }[self.kind]
        where = f": {shown}" if shown else ""
        tests = ", ".join(f"{root}/" for root in self.test_roots)
        return f"{label}{where}; tests in {tests}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source_roots": list(self.source_roots),
            "packages": list(self.packages),
            "test_roots": list(self.test_roots),
            "test_globs": list(self.test_globs),
            "source_globs": list(self.source_globs),
            "merge_globs": list(self.merge_globs),
            "pythonpath": list(self.pythonpath),
            "notes": list(self.notes),
            "summary": self.describe(),
            "language": self.language,
            "node": None if self.node is None else msgspec.structs.asdict(self.node),
        }


def _clean(rel: str) -> str | None:
    """A relative folder path from a config file, normalised; None if it leaves the root."""
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or rel.startswith("/"):
        return None
    return "/".join(parts) or "."


def _configured_roots(root: Path, pyproject: dict[str, Any], notes: list[str]) -> list[str]:
    """Source roots named by the build backend's settings."""
    found: list[str] = []
    tool = table(pyproject, "tool")
    setuptools = table(tool, "setuptools")
    package_dir = setuptools.get("package-dir")
    if isinstance(package_dir, dict) and isinstance(package_dir.get(""), str):
        found.append(package_dir[""])
    find = table(setuptools, "packages", "find")
    found.extend(strings(find.get("where")))
    wheel = table(tool, "hatch", "build", "targets", "wheel")
    for package in strings(wheel.get("packages")):
        parent = package.rsplit("/", 1)[0] if "/" in package else "."
        found.append(parent)
    poetry = table(tool, "poetry")
    for entry in poetry.get("packages") or []:
        if isinstance(entry, dict) and isinstance(entry.get("from"), str):
            found.append(entry["from"])
    pdm_dir = table(tool, "pdm", "build").get("package-dir")
    if isinstance(pdm_dir, str):
        found.append(pdm_dir)
    cfg = read_ini(root, "setup.cfg", notes)
    if cfg is not None and cfg.has_section("options"):
        for line in ini_list(cfg.get("options", "package_dir", fallback="")):
            if line.startswith("="):
                found.append(line[1:])
        if cfg.has_section("options.packages.find"):
            found.extend(ini_list(cfg.get("options.packages.find", "where", fallback="")))
    roots = []
    for raw in found:
        rel = _clean(raw)
        if rel is not None and (rel == "." or is_folder(root, rel)):
            roots.append(rel)
    if roots:
        notes.append(f"source roots from the build settings: {', '.join(dict.fromkeys(roots))}")
    return list(dict.fromkeys(roots))


def pytest_settings(root: Path, notes: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """pytest's settings as pytest finds them: (file, {option: value}); ('', {}) if none."""
    ini = read_ini(root, "pytest.ini", notes)
    if ini is not None and ini.has_section("pytest"):
        return "pytest.ini", dict(ini.items("pytest"))
    pyproject = read_toml(root, "pyproject.toml", notes) or {}
    options = table(pyproject, "tool", "pytest", "ini_options")
    if options:
        return "pyproject.toml", options
    native = {k: v for k, v in table(pyproject, "tool", "pytest").items() if k != "ini_options"}
    if native:
        return "pyproject.toml", native
    for name, section in (("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
        parsed = read_ini(root, name, notes)
        if parsed is not None and parsed.has_section(section):
            return name, dict(parsed.items(section))
    return "", {}


def _setting_list(value: Any) -> list[str]:
    return strings(value) if not isinstance(value, str) else ini_list(value)


def _packages_in(root: Path, folder: str) -> list[str]:
    """Importable top-level packages (folders with __init__.py, or namespace folders of
    .py files) and modules directly under ``folder``."""
    base = root if folder == "." else root / folder
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError:
        return []
    found: list[str] = []
    for entry in entries:
        name = entry.name
        rel = name if folder == "." else f"{folder}/{name}"
        if name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            if not _IDENT.fullmatch(name) or (folder == "." and name in NOT_PACKAGES):
                continue
            if (Path(entry.path) / "__init__.py").is_file() or (
                folder != "." and _has_python(entry.path)
            ):
                found.append(rel)
        elif entry.is_file(follow_symlinks=False) and name.endswith(".py"):
            stem = name[:-3]
            if _IDENT.fullmatch(stem) and name not in NOT_MODULES and not _looks_like_test(name):
                found.append(rel)
    return found[:MAX_PACKAGES]


def _has_python(path: str) -> bool:
    try:
        return any(e.name.endswith(".py") for e in os.scandir(path))
    except OSError:
        return False


def _looks_like_test(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py")


def detect_layout(root: Path) -> Layout:
    """The project's layout (see the module docstring); never raises for a bad file."""
    notes: list[str] = []
    pyproject = read_toml(root, "pyproject.toml", notes) or {}
    name = table(pyproject, "project").get("name") or table(pyproject, "tool", "poetry").get("name")
    name = name if isinstance(name, str) else None
    settings_file, settings = pytest_settings(root, notes)
    pythonpath = [
        rel for rel in (_clean(p) for p in _setting_list(settings.get("pythonpath"))) if rel
    ]
    roots = _configured_roots(root, pyproject, notes)
    if not roots:
        src_packages = _packages_in(root, "src") if is_folder(root, "src") else []
        if src_packages:
            roots = ["src"]
            notes.append("src/ holds the code (src layout)")
        else:
            roots = ["."]
    packages: list[str] = []
    for source_root in roots:
        packages.extend(_packages_in(root, source_root))
    if roots == ["."]:
        has_dirs = any(not p.endswith(".py") for p in packages)
        kind: Kind = "flat" if has_dirs else ("modules" if packages else "empty")
        if packages:
            notes.append(f"code at the top: {', '.join(packages[:6])}")
    else:
        kind = "src" if any(r != "." for r in roots) else "flat"
    test_roots = [
        rel
        for rel in (_clean(p) for p in _setting_list(settings.get("testpaths")))
        if rel and rel != "." and is_folder(root, rel)
    ]
    if test_roots:
        notes.append(f"test folders from {settings_file} (testpaths): {', '.join(test_roots)}")
    else:
        test_roots = [rel for rel in ("tests", "test") if is_folder(root, rel)] or ["tests"]
    found = node_project(root)
    if found is not None and kind == "empty":  # a JavaScript/TypeScript project
        return _node_layout(root, *found)
    if found is not None:
        notes.append("package.json found too: tests run as the Python code's (pytest)")
    return Layout(
        kind=kind,
        name=name,
        source_roots=tuple(dict.fromkeys(roots)),
        packages=tuple(dict.fromkeys(packages)),
        test_roots=tuple(dict.fromkeys(test_roots)),
        pythonpath=tuple(dict.fromkeys(pythonpath)),
        notes=tuple(notes),
    )


def _node_layout(root: Path, package: dict[str, Any], notes: list[str]) -> Layout:
    code, workspaces, tests, facts = node_parts(root, package, notes)
    name = package.get("name")
    beside = None if tests else tests_beside_code(root, code)
    if beside is not None:  # no test folder: the tests sit beside the code (*.test.* globs)
        notes.append(f"tests beside the code (e.g. {beside})")
    return Layout(
        kind="node",
        name=name if isinstance(name, str) else None,
        source_roots=tuple(code) or (".",),
        packages=tuple(workspaces),
        test_roots=tuple(tests) or (() if beside is not None else ("test",)),
        notes=tuple(notes),
        language="javascript",
        node=facts,
    )


def describe_node(layout: Layout) -> str:
    """``JavaScript project (pnpm, TypeScript, vitest): src/; tests in test/, *.test.*``."""
    facts = layout.node or NodeFacts()
    what = ", ".join(
        part
        for part in (facts.manager, "TypeScript" if facts.typescript else "", facts.runner or "")
        if part
    )
    roots = [f"{r}/" for r in layout.source_roots if r != "."] or ["code at the top"]
    shown = ", ".join(roots[:4]) + (" ..." if len(roots) > 4 else "")
    tests = ", ".join([*(f"{r}/" for r in layout.test_roots), "*.test.*", "*.spec.*"])
    if not layout.test_roots:
        tests += " beside the code"
    script = f"; test script: {facts.test_script}" if facts.test_script else ""
    return f"JavaScript project ({what}): {shown}; tests in {tests}{script}"
