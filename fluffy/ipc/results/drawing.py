"""docs/ipc-results.md: every syscall result type, field by field, generated.

    python -m fluffy.ipc.results.drawing --update docs/ipc-results.md

The page carries the drawing between two markers; a unit test checks that it is the
drawing of the classes as they are, so a change to a result shows up in review beside
its CHANGELOG.md entry.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from fluffy.ipc import results
from fluffy.ipc.results import Part, Result

BEGIN = "<!-- BEGIN generated result types -->"
END = "<!-- END generated result types -->"


def result_modules() -> list[types.ModuleType]:
    """The modules of :mod:`fluffy.ipc.results` that declare types, by name."""
    names = sorted(m.name for m in pkgutil.iter_modules(results.__path__) if m.name != "drawing")
    return [importlib.import_module(f"{results.__name__}.{name}") for name in names]


def declared(module: types.ModuleType) -> list[type[msgspec.Struct]]:
    """The Result and Part classes ``module`` defines, in the order it defines them."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Result | Part)
        and value not in (Result, Part)
        and value.__module__ == module.__name__
    ]


def type_text(tp: Any) -> str:
    """A field's type as the page spells it: ``list[Part]``, ``str | null``, ``"a" | "b"``
    (a field that may be ``UNSET`` is drawn without it: it is left out then)."""
    if tp is None or tp is type(None):
        return "null"
    if tp is typing.Any:
        return "any JSON"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a).lower() for a in args)
    if origin in (typing.Union, types.UnionType):  # UNSET: "required: no" says it
        return " | ".join(type_text(a) for a in args if a is not msgspec.UnsetType)
    if origin in (list, tuple, set, frozenset):
        return f"list[{type_text(args[0]) if args else 'any JSON'}]"
    if origin is dict:
        return f"map[{type_text(args[0])}, {type_text(args[1])}]"
    if origin is typing.Annotated:
        return type_text(args[0])
    if isinstance(tp, type):
        return {"str": "string", "int": "int", "float": "number", "bool": "bool"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp)


def result_text(tp: Any) -> str:
    """A syscall's declared result as CHANGELOG.md names it: ``Session``, ``Session`` or
    null, list of ``Transition``, null."""
    if tp is None or tp is type(None):
        return "null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        named = [result_text(a) for a in args if a is not type(None)]
        return " or ".join(named + (["null"] if type(None) in args else []))
    if origin is list:
        return f"list of {result_text(args[0])}"
    return f"`{getattr(tp, '__name__', tp)}`"


def drawing() -> str:
    lines: list[str] = []
    for module in result_modules():
        for cls in declared(module):
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            kind = "result" if issubclass(cls, Result) else "part"
            lines += [f"### `{cls.__name__}` ({kind}, {module.__name__.rsplit('.', 1)[1]})", ""]
            if doc:
                lines += [doc, ""]
            lines += ["| field | type | required |", "|---|---|---|"]
            config = cls.__struct_config__
            if config.tag_field is not None:  # one kind of a tagged union: its tag first
                lines.append(f'| `{config.tag_field}` | "{config.tag}" | yes |')
            for field in msgspec.structs.fields(cls):
                required = "yes" if field.required else "no"
                shown = type_text(field.type).replace("|", "\\|")  # not a cell's edge
                lines.append(f"| `{field.encode_name}` | {shown} | {required} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def drawn_in(page: str) -> str:
    """The drawing a page carries between the markers ("" when it has none)."""
    if BEGIN not in page or END not in page:
        return ""
    return page.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", type=Path, help="rewrite the drawing in this page")
    args = parser.parse_args(argv)
    text = drawing()
    if args.update is None:
        sys.stdout.write(text)
        return 0
    page = args.update.read_text(encoding="utf-8")
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    args.update.write_text(f"{head}{BEGIN}\n\n{text}\n{END}{tail}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
