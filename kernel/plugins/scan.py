"""Reading a plugin folder: its files, its manifest, its entry, its imports.

:func:`read_plugin` is everything the kernel can check about a plugin without running
it: the folder's files pass the store's rules (:func:`~.store.inspect_tree`), the
manifest validates, the entry file exists as a regular file, and no Python file imports
fluffy's internals (plugins may import ``fluffy.plugins.sdk`` and ``fluffy.errors``: the
L2 images carry nothing else of fluffy, so this is early feedback, not the boundary).
The plugin's code is parsed, never imported or run, in the kernel.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import msgspec

from fluffy.errors import PluginError, PluginManifestInvalid
from fluffy.kernel.plugins.manifest import PluginManifest, load_manifest
from fluffy.kernel.plugins.store import FileEntry, inspect_tree, read_capped

MANIFEST: Final = "manifest.yaml"
#: What a plugin may import of fluffy (the rest is the kernel's, the CLI's, the host's).
ALLOWED_FLUFFY: Final = ("fluffy.plugins.sdk", "fluffy.errors")


class Discovered(msgspec.Struct, frozen=True):
    """A plugin folder found by a scan (the design's DISCOVERED): valid or not."""

    folder: Path
    manifest: PluginManifest | None
    error: PluginError | None

    @property
    def manifest_path(self) -> Path:
        return self.folder / MANIFEST

    @property
    def name(self) -> str:
        return self.manifest.name if self.manifest is not None else self.folder.name


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _forbidden(module: str) -> bool:
    if module == "fluffy" or not _within(module, "fluffy"):
        return False  # the bare package is a namespace; `from fluffy import x` names x
    return not any(_within(module, ok) for ok in ALLOWED_FLUFFY)


def imported_modules(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, module) of every absolute import, ``__import__`` and ``import_module`` literal."""
    tree = ast.parse(source, filename)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if called in ("__import__", "import_module") and literal:
                found.append((node.lineno, str(getattr(first, "value", ""))))
    return found


def check_imports(folder: Path, files: list[FileEntry]) -> None:
    """Refuse a plugin whose Python files do not parse or import fluffy's internals."""
    for entry in files:
        if not entry.rel.endswith(".py"):
            continue
        try:
            source = read_capped(folder / entry.rel).decode("utf-8")
            modules = imported_modules(source, entry.rel)
        except UnicodeDecodeError:
            raise PluginManifestInvalid(
                f"{entry.rel} is not UTF-8 text", why="plugin code is Python source"
            ) from None
        except SyntaxError as exc:
            raise PluginManifestInvalid(
                f"{entry.rel}:{exc.lineno}: not valid Python: {exc.msg}",
                why="the plugin's code is parsed (never run) in the kernel before it is installed",
                fix="Fix the syntax error.",
            ) from None
        for line, module in modules:
            if _forbidden(module):
                raise PluginManifestInvalid(
                    f"{entry.rel}:{line} imports {module}, which is fluffy's internals",
                    why="plugins run in L2 sandboxes that carry only the SDK; they may import "
                    f"{' and '.join(ALLOWED_FLUFFY)} of fluffy",
                    fix="Use the ToolContext the handler gets (fluffy.plugins.sdk) instead.",
                )


def read_plugin(folder: Path) -> PluginManifest:
    """The plugin folder's manifest, once everything checkable without running it is."""
    files = inspect_tree(folder)
    manifest = load_manifest(folder / MANIFEST)
    entry = folder / manifest.entry
    if entry.is_symlink() or not entry.is_file():
        raise PluginManifestInvalid(
            f"{folder / MANIFEST}: entry: {manifest.entry!r} is not a file of the plugin folder",
            why="the entry is the Python file whose PLUGIN the sandbox loads",
            fix="Point entry at the plugin's main .py file (relative to manifest.yaml).",
        )
    check_imports(folder, files)
    return manifest


def discover(folder: Path) -> Discovered:
    try:
        return Discovered(folder, read_plugin(folder), None)
    except PluginError as error:
        return Discovered(folder, None, error)


def scan(directory: Path) -> list[Discovered]:
    """The plugin folder ``directory``, or each plugin folder directly inside it."""
    if (directory / MANIFEST).exists():
        return [discover(directory)]
    if not directory.is_dir():
        return []
    return [
        discover(child)
        for child in sorted(directory.iterdir())
        if (child / MANIFEST).exists() or (child / MANIFEST).is_symlink()
    ]
