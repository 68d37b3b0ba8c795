"""docs/errors.md's drawing of the error tree is generated, and checked exactly here."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fluffy.errors
from fluffy.errors import FluffyError, all_error_classes
from fluffy.errors.drawing import BEGIN, END, drawing, drawn_in, main

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "errors.md"
TREE_DIR = ROOT / "fluffy" / "errors"
LINE = re.compile(
    r"^(?P<indent>(?:[│ ]   |[├└]── )*)(?P<name>\w+)\s+(?P<code>\S+)\s+(?P<module>\w+)$"
)


def _modules() -> list[str]:
    return [f"fluffy.errors.{m.name}" for m in pkgutil.iter_modules([str(TREE_DIR)])]


def _drawn() -> list[tuple[str, str, str]]:
    """(class, code, module) of every line of the drawing."""
    rows = []
    for line in drawing().splitlines():
        match = LINE.match(line)
        assert match, line
        rows.append((match["name"], match["code"], match["module"]))
    return rows


def test_docs_errors_md_carries_the_drawing_exactly() -> None:
    drawn = drawn_in(PAGE.read_text(encoding="utf-8"))
    assert drawn == drawing(), "run: python -m fluffy.errors.drawing --update docs/errors.md"


def test_the_drawing_has_every_class_once_with_its_code_and_module() -> None:
    rows = _drawn()
    by_name = {cls.__name__: cls for cls in all_error_classes()}
    assert [r[0] for r in rows].count("FluffyError") == 1 and rows[0][0] == "FluffyError"
    assert len({r[0] for r in rows}) == len(rows)  # each class once
    for name, code, module in rows:
        cls = by_name[name]
        assert (code, f"fluffy.errors.{module}") == (cls.code, cls.__module__), name


def test_every_code_is_unique_and_of_the_form_area_name() -> None:
    codes = [code for _, code, _ in _drawn()]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    for code in codes:
        assert re.fullmatch(r"[a-z]+\.[a-z]+(_[a-z]+)*", code), code


def test_every_class_of_the_tree_is_reachable_from_fluffy_error() -> None:
    drawn = {name for name, _, _ in _drawn()}
    defined = set()
    for module in _modules():
        for name, value in vars(importlib.import_module(module)).items():
            mine = inspect.isclass(value) and value.__module__ == module
            if mine and issubclass(value, BaseException):
                assert issubclass(value, FluffyError), f"{module}.{name} is outside the tree"
                defined.add(name)
    exported = {
        name for name in fluffy.errors.__all__ if inspect.isclass(getattr(fluffy.errors, name))
    }
    assert defined == exported == drawn


def test_the_tree_imports_the_standard_library_only() -> None:
    for path in sorted(TREE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                inside = name == "fluffy.errors" or name.startswith("fluffy.errors.")
                assert name.split(".")[0] in sys.stdlib_module_names or inside, (path.name, name)


def test_the_tree_and_its_drawing_need_no_site_packages() -> None:
    """-I -S: no site-packages and no PYTHONPATH; the module prints the same drawing."""
    script = (
        "import json, runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "try:\n"
        "    runpy.run_module('fluffy.errors.drawing', run_name='__main__')\n"
        "except SystemExit as end:\n"
        "    assert end.code == 0, end.code\n"
        "outside = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)\n"
        "print(json.dumps(sorted(outside - {'fluffy', '__main__'})), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == drawing()
    assert json.loads(done.stderr) == []


def test_update_rewrites_only_the_generated_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "errors.md"
    page.write_text(f"# title\n\n{BEGIN}stale\n{END}\n\nafter\n", encoding="utf-8")
    assert main(["--update", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert drawn_in(text) == drawing()
    assert text.startswith("# title\n\n") and text.endswith(f"{END}\n\nafter\n")
    page.write_text("no markers\n", encoding="utf-8")
    assert main(["--update", str(page)]) == 1
    assert "no <!-- BEGIN generated" in capsys.readouterr().err
    assert page.read_text(encoding="utf-8") == "no markers\n"
