"""Natural red: a test that fails because the code it tests does not exist yet.

A model's first red is often a test that imports or calls what it is about to write::

    from calc import subtract        ImportError: cannot import name 'subtract' from 'calc'
    calc.mul(2, 3)                   AttributeError: module 'calc' has no attribute 'mul'
    Calc().sub(3, 1)                 AttributeError: 'Calc' object has no attribute 'sub'
    import calc.advanced             ModuleNotFoundError: No module named 'calc.advanced'
    divide(4, 2)                     NameError: name 'divide' is not defined

Such a failure proves the behaviour is missing only if the project really lacks the
thing, so the message is never believed alone: :class:`MissingCode` checks the *tree*
the run saw (the project plus the session's staged changes) with Python's own parser.
It counts only when the named module is the project's (resolved under its import roots)
and the named symbol is not defined there -- not as a function, class, assignment,
import or submodule, and the module has no ``__getattr__`` or star import that could
supply it; a class counts only when every class of that name in the project lacks the
attribute (methods, class attributes, ``self.x = ...``), has no ``__getattr__``, and all
its bases are project classes that lack it too.  A new top-level module counts unless it
is in the standard library, declared as a dependency or provided by an installed
distribution (a *missing third-party module* is an environment problem, not red).

Anything the checker cannot decide (dynamic code, a file that does not parse, a class
whose base is not the project's) is *not* red: the guard errs on the side of TDD.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Callable, Iterable
from typing import Literal, Protocol

import msgspec

#: Source files larger than this are not parsed (treated as "cannot tell").
MAX_SOURCE_BYTES = 2 * 1024 * 1024
#: At most this many files are searched for a class or a name.
MAX_SCAN_FILES = 3000

_Q = r"['\"]([^'\"]{1,300})['\"]"
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("partial", re.compile(r"ImportError: cannot import name .* partially initialized")),
    ("name", re.compile(rf"ImportError: cannot import name {_Q} from {_Q}")),
    ("module", re.compile(rf"ModuleNotFoundError: No module named {_Q}")),
    ("attribute", re.compile(rf"AttributeError: module {_Q} has no attribute {_Q}")),
    ("member", re.compile(rf"AttributeError: {_Q} object has no attribute {_Q}")),
    ("member", re.compile(rf"AttributeError: type object {_Q} has no attribute {_Q}")),
    ("global", re.compile(rf"NameError: name {_Q} is not defined")),
)
Kind = Literal["name", "module", "attribute", "member", "global"]


class Missing(msgspec.Struct, frozen=True):
    """What a failure message says is missing."""

    kind: Kind
    target: str  # module (name, module, attribute), class (member) or name (global)
    name: str = ""  # the symbol / attribute


def named_missing(message: str) -> Missing | None:
    """The missing thing a pytest crash message names, or None (any other failure)."""
    for kind, pattern in _PATTERNS:
        found = pattern.search(message)
        if found is None:
            continue
        if kind == "partial":
            return None  # a circular import, not missing code
        groups = found.groups()
        if kind == "name":
            return Missing("name", groups[1], groups[0])
        if kind in ("attribute", "member"):
            return Missing(kind, groups[0], groups[1])  # type: ignore[arg-type]
        return Missing(kind, groups[0])  # type: ignore[arg-type]
    return None


class TreeReader(Protocol):
    """The view a run saw: the project with the session's staged changes."""

    def read(self, rel: str) -> bytes | None: ...

    def is_dir(self, rel: str) -> bool: ...

    def python_files(self, folder: str, limit: int) -> list[str]: ...


def _join(root: str, rel: str) -> str:
    return rel if root in ("", ".") else f"{root}/{rel}"


class _Module(msgspec.Struct):
    defined: set[str]
    dynamic: bool  # __getattr__ at module level or a star import: anything may exist
    classes: dict[str, ast.ClassDef]


def _parse(data: bytes | None) -> ast.Module | None:
    if data is None or len(data) > MAX_SOURCE_BYTES:
        return None
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _targets(node: ast.AST) -> Iterable[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Tuple | ast.List):
        for item in node.elts:
            yield from _targets(item)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _module_facts(tree: ast.Module) -> _Module:
    """Names bound at module level (any branch of if/try/with counts), star imports."""
    defined: set[str] = set()
    classes: dict[str, ast.ClassDef] = {}
    dynamic = False
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defined.add(node.name)
            dynamic |= node.name == "__getattr__"
        elif isinstance(node, ast.ClassDef):
            defined.add(node.name)
            classes[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                defined.update(_targets(target))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            defined.update(_targets(node.target))
        elif isinstance(node, ast.Import):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    dynamic = True
                else:
                    defined.add(alias.asname or alias.name)
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for part in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, part, []) or []:
                    if isinstance(child, ast.ExceptHandler):
                        stack.extend(child.body)
                    else:
                        stack.append(child)
    return _Module(defined, dynamic, classes)


def _class_members(node: ast.ClassDef) -> tuple[set[str], bool]:
    """Attributes a class defines (body and ``self.x =`` in its methods), and whether it
    can answer any name (``__getattr__`` / ``__getattribute__``)."""
    members: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            members.add(child.name)
        elif isinstance(child, ast.Assign):
            for target in child.targets:
                members.update(_targets(target))
                if isinstance(target, ast.Attribute):
                    members.add(target.attr)
        elif isinstance(child, ast.AnnAssign | ast.AugAssign):
            members.update(_targets(child.target))
            if isinstance(child.target, ast.Attribute):
                members.add(child.target.attr)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            members.add(child.value)  # __slots__ = ("x",), setattr(self, "x", ...)
    return members, bool(members & {"__getattr__", "__getattribute__"})


class MissingCode:
    """Decides, against the tree, whether a failure names code the project lacks."""

    def __init__(
        self,
        reader: TreeReader,
        import_roots: Iterable[str],
        *,
        third_party: Callable[[str], bool] = lambda _top: False,
    ) -> None:
        self.reader = reader
        self.roots = tuple(dict.fromkeys(import_roots)) or (".",)
        self.third_party = third_party
        self._facts: dict[str, _Module | None] = {}

    # -- the tree -----------------------------------------------------------------
    def _facts_of(self, rel: str) -> _Module | None:
        if rel not in self._facts:
            tree = _parse(self.reader.read(rel))
            self._facts[rel] = None if tree is None else _module_facts(tree)
        return self._facts[rel]

    def module_file(self, module: str) -> str | None:
        """The project file (or namespace folder) of a dotted module; None: not the
        project's."""
        path = module.replace(".", "/")
        for root in self.roots:
            base = _join(root, path)
            for candidate in (f"{base}.py", f"{base}/__init__.py"):
                if self.reader.read(candidate) is not None:
                    return candidate
            if self.reader.is_dir(base):
                return base  # a namespace package
        return None

    # -- the judgement -----------------------------------------------------------------
    def proves(self, message: str) -> bool:
        """Whether ``message`` names code the project does not have (see the docstring)."""
        missing = named_missing(message)
        if missing is None:
            return False
        if missing.kind == "module":
            return self._module_missing(missing.target)
        if missing.kind in ("name", "attribute"):
            return self._symbol_missing(missing.target, missing.name)
        if missing.kind == "member":
            return self._member_missing(missing.target, missing.name)
        return self._global_missing(missing.target)

    def _module_missing(self, module: str) -> bool:
        if not all(part.isidentifier() for part in module.split(".")):
            return False
        if self.module_file(module) is not None:
            return False  # it exists: the import failed for another reason
        top = module.split(".")[0]
        if self.module_file(top) is not None:
            return True  # a submodule of the project's own package
        # a new top-level module of the project, unless the stdlib or a dependency has it
        return top not in sys.stdlib_module_names and not self.third_party(top)

    def _symbol_missing(self, module: str, name: str) -> bool:
        where = self.module_file(module)
        if where is None or not name.isidentifier():
            return False  # not the project's module (third-party, stdlib): not red
        if self.module_file(f"{module}.{name}") is not None:
            return False  # a submodule of that name exists
        if not where.endswith(".py"):
            return True  # a namespace package defines nothing itself
        facts = self._facts_of(where)
        return facts is not None and not facts.dynamic and name not in facts.defined

    def _all_modules(self) -> list[str]:
        files: list[str] = []
        for root in self.roots:
            files.extend(self.reader.python_files(root, MAX_SCAN_FILES - len(files)))
            if len(files) >= MAX_SCAN_FILES:
                break
        return list(dict.fromkeys(files))

    def _classes_named(self, name: str) -> list[ast.ClassDef] | None:
        found: list[ast.ClassDef] = []
        for rel in self._all_modules():
            facts = self._facts_of(rel)
            if facts is None:
                continue
            if name in facts.classes:
                found.append(facts.classes[name])
        return found

    def _member_missing(self, class_name: str, attribute: str, depth: int = 0) -> bool:
        if not attribute.isidentifier() or depth > 8:
            return False
        classes = self._classes_named(class_name)
        if not classes:
            return False  # not a class of the project (a built-in, a third-party type)
        for node in classes:
            members, dynamic = _class_members(node)
            if (
                dynamic
                or attribute in members
                or (
                    node.decorator_list
                    and any(not _plain_decorator(d) for d in node.decorator_list)
                )
            ):
                return False
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id == "object":
                    continue
                if not isinstance(base, ast.Name | ast.Attribute):
                    return False
                base_name = base.id if isinstance(base, ast.Name) else base.attr
                if not self._member_missing(base_name, attribute, depth + 1):
                    return False
            if node.keywords:  # metaclass=...: anything is possible
                return False
        return True

    def _global_missing(self, name: str) -> bool:
        if not name.isidentifier() or hasattr(builtins, name):
            return False
        for rel in self._all_modules():
            facts = self._facts_of(rel)
            if facts is None or name in facts.defined:
                return False
        return True


def _plain_decorator(node: ast.expr) -> bool:
    """``@dataclass`` (plain or called) adds fields from annotations, which count."""
    target = node.func if isinstance(node, ast.Call) else node
    name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
    return name in ("dataclass", "total_ordering", "final")
