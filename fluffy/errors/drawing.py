"""The drawing of the error tree: every class, its code and the module that holds it.

``python -m fluffy.errors.drawing`` prints it; ``... --update docs/errors.md`` writes it
between that page's markers, and ``tests/unit/errors/test_errors_drawing.py`` checks that the
page and the classes agree, character for character.  Each line is one class, drawn
under its parent; children are in the order of their codes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fluffy.errors.tree import FluffyError

#: The markers around the generated section of docs/errors.md.
BEGIN = "<!-- BEGIN generated: python -m fluffy.errors.drawing -->\n```\n"
END = "```\n<!-- END generated -->"
#: Width of the class column (the tree's lines and the name), then the code's.
NAME_WIDTH = 38
CODE_WIDTH = 30


def _children(cls: type[FluffyError]) -> list[type[FluffyError]]:
    """The direct subclasses defined in the tree's own modules (never a test's)."""
    found = [c for c in cls.__subclasses__() if c.__module__.startswith("fluffy.errors.")]
    return sorted(found, key=lambda c: c.code)


def _line(prefix: str, cls: type[FluffyError]) -> str:
    where = cls.__module__.removeprefix("fluffy.errors.")
    return f"{prefix + cls.__name__:<{NAME_WIDTH}}{cls.code:<{CODE_WIDTH}}{where}".rstrip()


def drawing() -> str:
    """The tree from :class:`FluffyError` down, one class a line (ends with a newline)."""
    lines = [_line("", FluffyError)]

    def walk(cls: type[FluffyError], indent: str) -> None:
        children = _children(cls)
        for i, child in enumerate(children):
            last = i == len(children) - 1
            lines.append(_line(indent + ("└── " if last else "├── "), child))
            walk(child, indent + ("    " if last else "│   "))

    walk(FluffyError, "")
    return "\n".join(lines) + "\n"


def drawn_in(page: str) -> str:
    """The drawing a page carries between the markers (ValueError: it has none)."""
    start = page.index(BEGIN) + len(BEGIN)
    return page[start : page.index(END, start)]


def main(argv: list[str]) -> int:
    # the package fluffy.errors was imported before this module: every area is loaded
    if not argv:
        sys.stdout.write(drawing())
        return 0
    if len(argv) != 2 or argv[0] != "--update":
        sys.stderr.write("usage: python -m fluffy.errors.drawing [--update PAGE.md]\n")
        return 2
    path = Path(argv[1])
    page = path.read_text(encoding="utf-8")
    try:
        old = drawn_in(page)
    except ValueError:
        sys.stderr.write(f"ERROR: {path} has no {BEGIN.splitlines()[0]} ... {END} section\n")
        return 1
    start = page.index(BEGIN) + len(BEGIN)
    path.write_text(page[:start] + drawing() + page[start + len(old) :], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
