"""Every event type the audit module defines is written by the kernel's code (and every
type the code writes is defined): an event type nothing writes is a promise the log does
not keep.  Read from the source with ast, so a type that loses its last writer fails."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fluffy.kernel.audit.entry import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[4]
#: The code that runs (fluffy/ holds the CLI; its other folders are links to these).
SOURCES = ("kernel", "fluffy/cli", "gate", "sandboxes", "plugins", "bootstrap", "images")


def _modules() -> list[tuple[Path, ast.Module]]:
    found = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found.append((path, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    extra = [ROOT / "fluffy" / name for name in ("doctor.py", "demo.py", "demo_session.py")]
    found += [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in extra]
    return found


def _is_event(call: ast.Call) -> bool:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name == "Event" and bool(call.args)


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


class Resolver:
    """The string values an expression can have, followed through conditional
    expressions, local assignments and parameters (to every call of the function)."""

    def __init__(self, modules: list[tuple[Path, ast.Module]]) -> None:
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.calls: dict[str, list[ast.Call]] = {}
        self.parent: dict[ast.AST, ast.AST] = {}
        for _, tree in modules:
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    self.parent[child] = node
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions.setdefault(node.name, []).append(node)
                elif isinstance(node, ast.Call):
                    self.calls.setdefault(_call_name(node), []).append(node)
        self.patterns: list[str] = []

    def _function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def values(self, expr: ast.expr, depth: int = 0) -> set[str]:
        if depth > 6:
            return set()
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.IfExp):
            return self.values(expr.body, depth + 1) | self.values(expr.orelse, depth + 1)
        if isinstance(expr, ast.JoinedStr):
            pieces = [
                re.escape(v.value) if isinstance(v, ast.Constant) else "(.+)" for v in expr.values
            ]
            self.patterns.append("".join(pieces))
            return set()
        if isinstance(expr, ast.Name):
            return self._name(expr, depth)
        return set()

    def _name(self, expr: ast.Name, depth: int) -> set[str]:
        function = self._function(expr)
        if function is None:
            return set()
        found: set[str] = set()
        for node in ast.walk(function):  # assigned in the function
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == expr.id for t in node.targets
            ):
                found |= self.values(node.value, depth + 1)
        params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if expr.id in params:  # a parameter: what every call passes
            index = params.index(expr.id) - (1 if params and params[0] == "self" else 0)
            for call in self.calls.get(function.name, []):
                for keyword in call.keywords:
                    if keyword.arg == expr.id:
                        found |= self.values(keyword.value, depth + 1)
                if 0 <= index < len(call.args):
                    found |= self.values(call.args[index], depth + 1)
        return found


def _told_kinds(modules: list[tuple[Path, ast.Module]], method: str) -> set[str]:
    """The literal first arguments of calls to ``method`` (the manager's ``_tell``)."""
    kinds = set()
    for _, tree in modules:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == method
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                kinds.add(str(node.args[0].value))
    return kinds


def written_types() -> tuple[set[str], list[str]]:
    """The event types some Event(...) in the code can be given; the f-strings."""
    modules = _modules()
    resolver = Resolver(modules)
    written: set[str] = set()
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_event(node):
                written |= resolver.values(node.args[0])
    # f"sandbox_{kind}": the kinds the manager tells (other f-strings reached by name
    # through a same-named function are not event types: only names are looked at)
    patterns = [p for p in resolver.patterns if re.fullmatch(r"[a-z_]*\(\.\+\)", p)]
    for pattern in patterns:
        assert pattern == "sandbox_(.+)", f"an event type built as {pattern!r}: name it"
        written |= {f"sandbox_{kind}" for kind in _told_kinds(modules, "_tell")}
    return {w for w in written if re.fullmatch(r"[a-z_]+", w)}, patterns


def test_every_defined_event_type_is_written_by_the_code() -> None:
    written, _ = written_types()
    never = sorted(EVENT_TYPES - written)
    assert not never, f"defined but never written: {never}"


def test_the_code_writes_no_undefined_event_type() -> None:
    """Each Event("literal", ...) names a defined type (the log would refuse it)."""
    _, patterns = written_types()
    assert patterns, "the sandbox lifecycle's f-string was not found: the scan is broken"
    literals = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_event(node):
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    literals.add(first.value)
    assert {"kernel_start", "capability_issued", "test_run_recorded"} <= literals
    assert not sorted(literals - EVENT_TYPES)
