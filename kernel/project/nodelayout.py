"""A JavaScript or TypeScript project's layout as its own files say it (npm, pnpm, yarn).

Read, all as data (nothing of the project runs): ``package.json`` (its name, the
``workspaces`` globs, the ``test`` script, ``engines.node``, ``packageManager``, the test
runner among the dependencies), ``pnpm-workspace.yaml``'s ``packages``, the lock file that
names the package manager, ``tsconfig.json``, ``.nvmrc`` / ``.node-version``; then the
folders: ``src/`` and ``lib/`` hold code (in the top package and in each workspace
package), ``test/``, ``tests/``, ``spec/`` and ``__tests__/`` hold tests, and anywhere a
``*.test.*`` / ``*.spec.*`` file is a test.  :func:`node_layout` returns it as a
:class:`~fluffy.kernel.project.layout.Layout` whose notes say how each part was found.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec
import yaml

from fluffy.kernel.project.files import is_folder, read_json, read_text, strings
from fluffy.kernel.project.nodeversion import DEFAULT, choose_node
from fluffy.pathnames import is_utf8

#: The extensions of JavaScript and TypeScript code (the globs list each: .gitignore
#: patterns have no braces).
CODE_EXTS = ("js", "mjs", "cjs", "jsx", "ts", "mts", "cts", "tsx")
#: Test files wherever they are (vitest's and jest's default patterns).
NODE_TEST_GLOBS = (
    *(f"**/*.{kind}.{ext}" for kind in ("test", "spec") for ext in CODE_EXTS),
    "**/__tests__/**",
)
#: Folders that hold tests, in the order they are looked for.
TEST_FOLDERS = ("test", "tests", "spec", "__tests__")
#: Folders that hold a package's code.
CODE_FOLDERS = ("src", "lib")
#: Lock files, and the package manager each one names.
LOCKS = (
    ("pnpm-lock.yaml", "pnpm"),
    ("yarn.lock", "yarn"),
    ("package-lock.json", "npm"),
    ("npm-shrinkwrap.json", "npm"),
)
#: Test runners, as a dependency's name (the first found in the dev dependencies wins).
RUNNERS = ("vitest", "jest", "mocha", "ava", "tap", "uvu")
#: At most this many workspace packages are listed.
MAX_WORKSPACES = 40
#: At most this many folder entries are looked at for tests beside the code.
MAX_SCANNED = 5000
_TEST_FILE = re.compile(rf"[^/]+\.(?:test|spec)\.(?:{'|'.join(CODE_EXTS)})")
_WORD = re.compile(r"[a-z]+")


class NodeFacts(msgspec.Struct, frozen=True):
    """What the project's files say about running it (shown on the first run)."""

    manager: str = "npm"
    typescript: bool = False
    runner: str | None = None
    test_script: str | None = None
    #: The Node major the environment runs, e.g. "24", when the project's files say
    #: anything about it (None: they do not, or ask for one fluffy does not have).
    node: str | None = None
    #: The lock file the environment installs from (None: none, so no packages).
    lock: str | None = None


def _workspace_globs(root: Path, package: dict[str, Any], notes: list[str]) -> list[str]:
    declared = package.get("workspaces")
    globs = strings(declared.get("packages") if isinstance(declared, dict) else declared)
    source = "package.json (workspaces)"
    text = read_text(root, "pnpm-workspace.yaml")
    if not globs and text is not None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            notes.append("pnpm-workspace.yaml is not valid YAML; it was ignored")
            data = None
        globs = strings(data.get("packages")) if isinstance(data, dict) else []
        source = "pnpm-workspace.yaml"
    if globs:
        notes.append(f"workspaces from {source}: {', '.join(globs[:6])}")
    return globs


def _folders(path: Path) -> list[str]:
    """The folders directly in ``path`` (no links, no dot-folders, no node_modules)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return []
    return sorted(
        e.name
        for e in entries
        if e.is_dir(follow_symlinks=False)
        and not e.name.startswith(".")
        and e.name != "node_modules"
        and is_utf8(e.name)  # a name no text of fluffy's can carry: not a package of it
    )


def _workspaces(root: Path, globs: list[str]) -> list[str]:
    """The workspace packages' folders (each holding a package.json) the globs name; a
    glob is a folder path whose parts may be ``*`` (one level) or end in ``/**``."""
    found: list[str] = []
    for raw in globs:
        if raw.startswith("!"):
            continue
        parts = [p for p in raw.strip().strip("/").split("/") if p not in ("", ".")]
        if not parts or any(p == ".." for p in parts):
            continue
        if parts[-1] == "**":
            parts[-1] = "*"
        candidates = [""]
        for part in parts:
            following: list[str] = []
            for base in candidates:
                if part == "*":
                    try:
                        names = sorted(
                            e.name
                            for e in os.scandir(root / base)
                            if not e.name.startswith(".") and is_utf8(e.name)
                        )
                    except OSError:
                        names = []
                    following += [f"{base}{n}/" for n in names if n != "node_modules"]
                elif is_utf8(part):  # a JSON escape can spell a name no text carries
                    following.append(f"{base}{part}/")
            candidates = following[: MAX_WORKSPACES * 4]
        for candidate in candidates:
            rel = candidate.rstrip("/")
            if is_folder(root, rel) and (root / rel / "package.json").is_file():
                found.append(rel)
    return list(dict.fromkeys(found))


def _facts(root: Path, package: dict[str, Any], notes: list[str]) -> NodeFacts:
    manager = "npm"
    declared = package.get("packageManager")
    named = _WORD.match(declared) if isinstance(declared, str) else None
    if named is not None:
        manager = named.group(0)
        notes.append(f"package manager from package.json (packageManager): {str(declared)[:40]}")
    else:
        for lock, name in LOCKS:
            if (root / lock).is_file():
                manager = name
                notes.append(f"package manager from its lock file: {lock}")
                break
    deps: dict[str, Any] = {}
    for key in ("dependencies", "devDependencies"):
        value = package.get(key)
        if isinstance(value, dict):
            deps.update(value)
    scripts = package.get("scripts")
    script = scripts.get("test") if isinstance(scripts, dict) else None
    script = script if isinstance(script, str) and script.strip() else None
    runner = next((name for name in RUNNERS if name in deps), None)
    if runner is None and script is not None and "node --test" in script:
        runner = "node"
    typescript = "typescript" in deps or (root / "tsconfig.json").is_file()
    node = choose_node(root, package)  # what the environment's build runs: the same choice
    notes.extend(node.notes)
    if script is not None:
        notes.append(f"test script (package.json): {script[:120]}")
    asked = node.source != DEFAULT or bool(node.notes)  # the files said something
    major = str(node.major) if node.major is not None and asked else None
    lock_file = next((name for name, _ in LOCKS if (root / name).is_file()), None)
    return NodeFacts(manager, typescript, runner, script, major, lock_file)


def tests_beside_code(root: Path, code: list[str]) -> str | None:
    """The first ``*.test.*`` / ``*.spec.*`` file (its path) in a code folder, when the
    project keeps its tests beside the code (``src/ms.test.ts``); None if none is found
    among the first :data:`MAX_SCANNED` entries.  Links and ``node_modules`` are not
    followed."""
    seen = 0
    for base in code:
        top = root / base
        if not base or not is_folder(root, base):
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(
                d for d in dirs if d != "node_modules" and not d.startswith(".") and is_utf8(d)
            )
            seen += len(dirs) + len(files)
            for name in sorted(files):
                if _TEST_FILE.fullmatch(name) and is_utf8(name):
                    return Path(folder, name).relative_to(root).as_posix()
            if seen > MAX_SCANNED:
                return None
    return None


def node_project(root: Path) -> tuple[dict[str, Any], list[str]] | None:
    """``package.json`` and the notes of reading it; None when there is none."""
    notes: list[str] = []
    package = read_json(root, "package.json", notes)
    if package is None:
        return None
    return package, notes


def node_parts(
    root: Path, package: dict[str, Any], notes: list[str]
) -> tuple[list[str], list[str], list[str], NodeFacts]:
    """(code roots, workspace packages, test roots, facts) of a Node project."""
    workspaces = _workspaces(root, _workspace_globs(root, package, notes))
    if len(workspaces) > MAX_WORKSPACES:
        notes.append(
            f"{len(workspaces)} workspace packages: the first {MAX_WORKSPACES} are listed; "
            "add the others' folders to the policy's globs (`fluffy init`) to write there"
        )
        workspaces = workspaces[:MAX_WORKSPACES]
    code: list[str] = []
    tests: list[str] = []
    for base in ("", *(f"{w}/" for w in workspaces)):
        found = [f"{base}{f}" for f in CODE_FOLDERS if is_folder(root, f"{base}{f}")]
        code += found or ([base.rstrip("/")] if base else [])  # a package's own top
        tests += [f"{base}{f}" for f in TEST_FOLDERS if is_folder(root, f"{base}{f}")]
    if code:
        notes.append(f"code in {', '.join(code[:6])}" + (" ..." if len(code) > 6 else ""))
    return code, workspaces, tests, _facts(root, package, notes)
