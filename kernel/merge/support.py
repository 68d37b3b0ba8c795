"""Test-support code a session changed: why its green run cannot merge on its own.

A test run's outcome is written by the test process itself (pytest's JUnit report), and
code loaded into that process can rewrite it: a ``conftest.py`` whose
``pytest_runtest_makereport`` hook turns failures into passes made wrong code run
"green" and auto-merge.  A repository's *existing* support code is the person's and keeps
working; what a session changes of it is named here, and the merge then waits for a
person's review that names it (``--yes`` does not stand in for it).

Support code (by path or by content of a changed file):

* ``conftest.py`` anywhere; ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``;
* the test runner's configuration: ``pytest.ini``, ``tox.ini``, ``setup.cfg``,
  ``pyproject.toml``, ``.coveragerc``, ``pytest.toml``;
* a module the configuration or a ``conftest.py`` loads as a pytest plugin (``-p NAME`` in
  ``addopts``, ``pytest_plugins = [...]``);
* another ``*.ini``, ``*.cfg`` or ``*.toml`` in a sub-folder (pytest reads one there when
  it runs tests of that folder);
* a module or package that takes the place of the test runner or of Python's own
  library in the test process: a changed file whose top-level module name (at the root,
  under ``src/``, or in a folder without ``__init__.py``, all of which reach sys.path
  before the installed packages) is ``pytest``, ``coverage``, ``pip``, a ``pytest_*``
  plugin, one of their dependencies or a standard-library module; and anything under a
  ``*.dist-info`` or ``*.egg-info`` folder (entry points load pytest plugins);
* any changed Python file that defines or binds a pytest hook (``pytest_*``), imports or
  names pytest's internals (``_pytest``, ``pluggy``), registers a plugin
  (``pluginmanager``), assigns into the ``pytest`` module, or schedules code at exit
  (``atexit``); and code outside the tests that imports pytest at all.

A JavaScript project's support code (:mod:`fluffy.kernel.merge.jssupport`): the runners'
and transpilers' configuration, setup files, ``__mocks__``, ``package.json``, and code
that reaches the run's reporting or exit.

The last items are heuristics over what can be seen (a test module can still patch pytest
in ways it does not name): the cross-check of a deciding green run
(:mod:`fluffy.kernel.tools.testing.guardrun`) runs the person's tests without the session's test
changes, so such a patch cannot turn the person's failing tests green.
"""

from __future__ import annotations

import ast
import configparser
import re
import shlex
import sys
import tomllib
from collections.abc import Callable, Iterable

import msgspec

from fluffy.kernel.merge.jssupport import js_support

_LOADED_AT_START = ("sitecustomize.py", "usercustomize.py")
_CONFIG = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".coveragerc",
           "pytest.toml", ".pytest.toml")  # fmt: skip
#: Anything of these kinds pytest may read as its configuration when run from its folder.
_CONFIG_SUFFIXES = (".ini", ".cfg", ".toml")
_INTERNAL_MODULES = ("_pytest", "pluggy")
_ADDOPTS_PLUGIN = re.compile(r"^-p(?:=|$)?(.*)$")
MAX_PARSE_BYTES = 2 * 1024 * 1024
#: Hooks pytest honours in a test module itself; they parametrise, they do not report.
_TEST_MODULE_HOOKS = frozenset({"pytest_generate_tests"})

#: The test runner, what it loads and what Python loads at start: a module of the
#: project's by one of these names is imported in their place (the working folder and
#: pytest's rootdir come first on sys.path).
_TOOL_MODULES = frozenset({
    "pytest", "_pytest", "py", "pluggy", "coverage", "pip", "setuptools", "pkg_resources",
    "_distutils_hack", "wheel", "iniconfig", "packaging", "site", "sitecustomize",
    "usercustomize", "exceptiongroup", "tomli", "typing_extensions", "colorama", "pygments",
    # pytest plugins loaded by entry point whose modules do not start with pytest_
    "xdist", "_hypothesis_pytestplugin", "hypothesis", "anyio", "typeguard", "faker",
    "syrupy", "respx", "time_machine", "freezegun", "trio", "execnet",
})  # fmt: skip
#: Standard-library modules a kernel on a newer Python no longer lists.
_REMOVED_STDLIB = frozenset({"distutils", "imp", "asyncore", "asynchat", "smtpd"})
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")

#: rel path -> the view's bytes of it (staged if staged, else the project's), or None
Reader = Callable[[str], bytes | None]


class SupportChange(msgspec.Struct, frozen=True):
    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path} ({self.why})"


def _text(data: bytes | None) -> str | None:
    if data is None or len(data) > MAX_PARSE_BYTES:
        return None
    return data.decode("utf-8", "replace")


def _addopts(name: str, text: str) -> list[str]:
    """``addopts`` of a pytest configuration file, split like a shell would."""
    raw: object = None
    if name in ("pyproject.toml", "pytest.toml"):
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError, ValueError):
            return []
        tool = data.get("tool") if name == "pyproject.toml" else data
        section = tool.get("pytest") if isinstance(tool, dict) else None
        if isinstance(section, dict):
            section = section.get("ini_options", section)
        raw = section.get("addopts") if isinstance(section, dict) else None
    else:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read_string(text)
        except (configparser.Error, ValueError):
            return []
        for section in ("pytest", "tool:pytest"):
            if parser.has_option(section, "addopts"):
                raw = parser.get(section, "addopts")
    if isinstance(raw, list):
        return [str(x) for x in raw]
    try:
        return shlex.split(raw) if isinstance(raw, str) else []
    except ValueError:
        return []


def plugin_modules(paths: Iterable[str], read: Reader) -> set[str]:
    """Module names loaded as pytest plugins by the configuration or any conftest.py."""
    found: set[str] = set()
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if name not in _CONFIG and not name.endswith(".py"):
            continue
        text = _text(read(path))
        if text is None:
            continue
        if name in _CONFIG:
            args = _addopts(name, text)
            for i, arg in enumerate(args):
                match = _ADDOPTS_PLUGIN.match(arg)
                if match is None:
                    continue
                value = match.group(1) or (args[i + 1] if i + 1 < len(args) else "")
                if value and not value.startswith("no:"):
                    found.add(value)
        elif name.endswith(".py"):
            found |= _pytest_plugins(text)
    return found


def _pytest_plugins(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
        ):
            for item in ast.walk(node.value):
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    found.add(item.value)
    return found


def _module_paths(module: str) -> tuple[str, ...]:
    rel = module.replace(".", "/")
    return (f"{rel}.py", f"{rel}/__init__.py")


def touches_machinery(text: str) -> str | None:
    """Why a Python file reaches into the test process's reporting (None: it does not)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("pytest_")
            and node.name not in _TEST_MODULE_HOOKS
        ):
            return f"it defines the pytest hook {node.name}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                top = name.split(".")[0]
                if top in _INTERNAL_MODULES:
                    return f"it imports pytest's internals ({name})"
                if top == "atexit":
                    return "it runs code when the test process exits"
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.split(".")[0] in _INTERNAL_MODULES
        ):
            return f"it names pytest's internals ({node.value[:40]})"
        if isinstance(node, ast.Attribute) and node.attr == "pluginmanager":
            return "it registers with pytest's plugin manager"
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id.startswith("pytest_")
                    and (target.id not in _TEST_MODULE_HOOKS and target.id != "pytest_plugins")
                ):
                    return f"it binds the pytest hook {target.id}"
                while isinstance(target, ast.Attribute | ast.Subscript):
                    target = target.value
                if isinstance(target, ast.Name) and target.id == "pytest":
                    return "it changes the pytest module"
    return None


def _where_plugins_are_named(changed: list[str]) -> list[str]:
    """The configuration files at the root, and every conftest.py pytest would load for
    the changed paths (the root's, each folder's on the way, the usual test folders')."""
    found = [*_CONFIG, "conftest.py", "tests/conftest.py", "test/conftest.py"]
    for path in changed:
        parts = path.split("/")[:-1]
        found += ["/".join([*parts[:i], "conftest.py"]) for i in range(1, len(parts) + 1)]
    return list(dict.fromkeys(found))


def _is_test_file(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def imports_runner(text: str) -> str | None:
    """Why code outside the tests reaches the test runner (None: it does not)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                if name.split(".")[0] in ("pytest", *_INTERNAL_MODULES):
                    return f"code outside the tests imports the test runner ({name})"
    return None


def _top_modules(path: str, read: Reader) -> set[str]:
    """The top-level module names ``path`` can be imported as (see the module docstring):
    a module file, or a file in a regular package (a folder without ``__init__.py`` is a
    namespace package, which never takes the place of a regular module or package)."""
    parts = path.split("/")
    if not parts[-1].endswith(_MODULE_SUFFIXES):  # data, not a module Python imports
        return set()
    roots = {0} | ({1} if parts[0] == "src" and len(parts) > 1 else set())
    roots |= {i for i in range(1, len(parts)) if read("/".join(parts[:i]) + "/__init__.py") is None}
    found = set()
    for i in roots:
        if i == len(parts) - 1:
            found.add(parts[i].split(".", 1)[0])
        elif read("/".join(parts[: i + 1]) + "/__init__.py") is not None:
            found.add(parts[i])
    return {name for name in found if name.isidentifier()}


def shadows(path: str, read: Reader) -> str | None:
    """Why ``path`` can take the place of the runner or the standard library (or None)."""
    if any(part.lower().endswith(_METADATA_SUFFIXES) for part in path.split("/")):
        return "Python reads it as a package's metadata (entry points load pytest plugins)"
    for name in sorted(_top_modules(path, read)):
        if name in _TOOL_MODULES or name.startswith(("pytest_", "_pytest")):
            return f"the test process would import it in place of the test runner's {name}"
        if name in sys.stdlib_module_names or name in _REMOVED_STDLIB:
            return f"the test process would import it in place of Python's own {name}"
    return None


def support_changes(changed: Iterable[str], read: Reader) -> list[SupportChange]:
    """The changed paths that are test-support code, each with why (module docstring)."""
    changed = list(changed)
    plugins = plugin_modules([*_where_plugins_are_named(changed), *changed], read)
    plugin_files = {path: module for module in plugins for path in _module_paths(module)}
    out: list[SupportChange] = []
    for path in changed:
        name = path.rsplit("/", 1)[-1]
        if name == "conftest.py":
            why = "pytest loads it into the test process: its hooks can rewrite results"
        elif name in _LOADED_AT_START or name.endswith(".pth"):
            why = "Python runs it when the test process starts"
        elif name in _CONFIG:
            why = "it configures the test runner (plugins, options)"
        elif "/" in path and name.endswith(_CONFIG_SUFFIXES):
            why = "pytest may read it as its configuration when tests run from its folder"
        elif any(path == f or path.endswith("/" + f) for f in plugin_files):
            module = next(m for f, m in plugin_files.items() if path == f or path.endswith("/" + f))
            why = f"pytest loads it as the plugin {module}"
        elif (shadowed := shadows(path, read)) is not None:
            why = shadowed
        elif (js := js_support(path, read)) is not None:
            why = js
        elif name.endswith(".py") and (text := _text(read(path))) is not None:
            found = touches_machinery(text)
            if found is None and not _is_test_file(name):
                found = imports_runner(text)
            if found is None:
                continue
            why = found
        else:
            continue
        out.append(SupportChange(path, why))
    return out
