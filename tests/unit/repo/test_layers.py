"""The layer rules of docs/architecture.md, checked on the source.

Most rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``), run
here and by ``lint-imports`` in scripts/check; the rules a contract cannot say (standard
library only, what an L2 image carries, line budgets) are checked below on the AST.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "fluffy"
LAYER_DIRS = ("bootstrap", "gate", "kernel", "sandboxes", "seccomp", "plugins", "images")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for the whole package (through the layer symlinks)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(PKG, followlinks=True):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                rel = Path(dirpath, name).relative_to(ROOT).with_suffix("")
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                found[".".join(parts)] = Path(dirpath, name)
    return found


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                names.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.add(node.module)
    return names


MODULES = _modules()


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("name", LAYER_DIRS)
def test_layer_directories_are_subpackages_of_fluffy(name: str) -> None:
    link = PKG / name
    assert link.is_symlink() and os.readlink(link) == f"../{name}"
    assert (ROOT / name / "__init__.py").is_file()


def test_only_fluffy_is_installed_as_a_top_level_name() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(_in(p, "fluffy") for p in setuptools["packages"])
    assert "package-dir" not in setuptools


def test_every_package_directory_is_shipped() -> None:
    declared = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert on_disk == declared, (
        f"add to pyproject: {on_disk - declared}; stale: {declared - on_disk}"
    )


def test_the_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    """Layers inside the kernel, no package cycles, kernel and sandboxes apart, only the
    container manager talks to the engine, plugins never import the kernel, the trusted
    base imports nothing else of fluffy: pyproject.toml's contracts, on this checkout."""
    from importlinter import api  # noqa: F401  (configures import-linter's adapters)
    from importlinter.application.use_cases import lint_imports

    import fluffy

    # the graph is built from the fluffy that imports: this checkout's (PYTHONPATH=.)
    assert Path(fluffy.__file__).resolve().parent == PKG
    kept = lint_imports(str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
    assert kept, capsys.readouterr().out


def test_the_contracts_see_the_layer_folders_as_subpackages() -> None:
    """The layer folders are reached through symlinks; the graph must still hold them."""
    import grimp

    graph = grimp.build_graph("fluffy", cache_dir=None)
    for name in LAYER_DIRS:
        assert f"fluffy.{name}" in graph.modules, name
    assert "fluffy.kernel.ai.loop" in graph.find_modules_that_directly_import("fluffy.ipc.ai_types")


def test_bootstrap_imports_the_standard_library_only() -> None:
    for module, path in MODULES.items():
        if _in(module, "fluffy.bootstrap"):
            for imp in _imports(path, module):
                top = imp.split(".")[0]
                # the trusted base: itself, the engine gate and the error tree (each also
                # standard library only)
                trusted = any(_in(imp, f"fluffy.{p}") for p in ("bootstrap", "gate", "errors"))
                assert top in sys.stdlib_module_names or trusted, (module, imp)


def _closure(roots: list[str]) -> tuple[set[str], set[str]]:
    """(fluffy modules, other top-level names) that importing ``roots`` runs: each
    module's imports, followed through fluffy's own, parent packages included (Python
    runs a package's ``__init__`` before its modules)."""
    seen: set[str] = set()
    outside: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module not in MODULES:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for imp in _imports(MODULES[module], module):
            if _in(imp, "fluffy"):
                # `from fluffy.errors import X`: the package (X may be a name in it)
                todo += [imp] if imp in MODULES else [imp.rpartition(".")[0]]
            else:
                outside.add(imp.split(".")[0])
    return seen, outside


def test_what_the_bootstrap_runs_is_the_standard_library_and_the_error_tree() -> None:
    # not only its own imports: everything they import in turn (the error tree, the
    # gate, fluffy's own __init__) stays on the standard library, so the host needs no
    # third-party package to start the kernel
    inside, outside = _closure([m for m in MODULES if _in(m, "fluffy.bootstrap")])
    assert outside <= set(sys.stdlib_module_names), sorted(outside - set(sys.stdlib_module_names))
    strays = sorted(m for m in inside if not any(
        _in(m, p) for p in ("fluffy.bootstrap", "fluffy.gate", "fluffy.errors")
    ) and m not in ("fluffy", "fluffy._version"))  # fmt: skip
    assert strays == [], strays
    assert "fluffy.errors.tree" in inside  # the walk follows `from fluffy.errors import`


def test_the_engine_gate_imports_the_standard_library_only() -> None:
    for module, path in MODULES.items():
        if _in(module, "fluffy.gate"):
            for imp in _imports(path, module):
                top = imp.split(".")[0]
                assert top in sys.stdlib_module_names or _in(imp, "fluffy.gate"), (module, imp)


def test_the_engine_gate_stays_under_its_500_line_budget() -> None:
    code = sum(
        1
        for path in (ROOT / "gate").rglob("*.py")
        for line in path.read_text().splitlines()
        if not re.match(r"^\s*(#.*)?$", line)
    )
    assert code < 500, f"the engine gate has {code} lines of code; its budget is < 500"


def test_bootstrap_stays_under_its_500_line_budget() -> None:
    code = 0
    for path in (ROOT / "bootstrap").rglob("*.py"):
        code += sum(
            1 for line in path.read_text().splitlines() if not re.match(r"^\s*(#.*)?$", line)
        )
    assert code < 500, f"bootstrap has {code} lines of code; the design's budget is < 500"


def test_sandbox_code_needs_only_what_l2_images_carry() -> None:
    from fluffy.images.spec import SANDBOX_PARTS

    carried = {f"fluffy.{part.removesuffix('.py')}" for part in SANDBOX_PARTS}
    for module, path in MODULES.items():
        if _in(module, "fluffy.sandboxes") or _in(module, "fluffy.seccomp"):
            for imp in _imports(path, module):
                top = imp.split(".")[0]
                ok = top in sys.stdlib_module_names or top in ("msgspec", "pyseccomp")
                # the provider adapters (ai-provider image: ai-provider.lock)
                ok = ok or (_in(module, "fluffy.sandboxes.ai") and top in ("httpx", "httpcore"))
                assert ok or imp == "fluffy" or any(_in(imp, c) for c in carried), (module, imp)


def test_import_scanner_sees_relative_and_absolute_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import docker\nfrom . import x\nfrom ..y import z\n")
    assert _imports(sample, "fluffy.kernel.m") == {"docker", "fluffy.kernel", "fluffy.y"}


def test_only_the_engine_clients_ignore_a_contract() -> None:
    """An ignored import is a hole in a layer: only kernel/containers may import an
    engine client.  Anything else must be fixed in the code, not listed -- the syscall
    layer has its own package on top (kernel/syscalls/), so it needs no exception."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    holes = [
        (contract["id"], ignored)
        for contract in contracts["contracts"]
        for ignored in contract.get("ignore_imports", [])
        if not ignored.startswith("fluffy.kernel.containers.")
    ]
    assert not holes, holes
