"""Natural red in JavaScript and TypeScript: a test failing on code the project lacks.

A model's first red test often imports or calls what it is about to write.  vitest,
jest and node's runner say so in words like these::

    Cannot find module '../src/slug' imported from '/workspace/test/slug.test.ts'
    The requested module '../src/a.mjs' does not provide an export named 'slugify'
    (0 , __vite_ssr_import_1__.slugify) is not a function
    (0 , index_1.slugify) is not a function          (TypeScript's CommonJS: ts-jest)
    slugify is not defined

As in Python (:mod:`fluffy.kernel.workflow.missing`), the message is never believed
alone: the *tree* the run saw (the project plus the session's staged changes) is
checked.  A module counts only when it is a path inside the project (``./``, ``../``,
``/workspace/...``) at which no file exists, tried with the extensions and ``index``
files Node, TypeScript and bundlers resolve (``./a.js`` is also ``./a.ts``); a package
name (``lodash``) is an environment problem, never red.  A symbol counts only when no
code file of the project (outside its tests) has the word at all -- a declaration, an
export, even a comment saying it: anything the checker cannot rule out is *not* red.
A TypeScript compile error (``TS2305: ... has no exported member``) is not red either.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from typing import Protocol

from fluffy.kernel.project.nodelayout import CODE_EXTS

MAX_SOURCE_BYTES = 2 * 1024 * 1024
MAX_SCAN_FILES = 3000
_IDENT = r"[A-Za-z_$][\w$]*"
#: What a runner puts before the error's own words: its class, a code, vite's plugin name.
_LEAD = r"(?:(?:\w*Error|Error \[\w+\]|\[[\w:-]+\]):? )*"
_MODULE = (
    re.compile(
        rf"^{_LEAD}Cannot find module ['\"]([^'\"]{{1,300}})['\"]"
        r"(?: (?:imported )?from ['\"]?([^'\"\s]{1,300}))?"
    ),
    re.compile(
        rf"^{_LEAD}Failed to load url (\S{{1,300}}) \(resolved id: [^)]*\)(?: in (\S{{1,300}}))?"
    ),
)
#: The binding a compiler names an imported module by: vite's and vitest's; babel's and
#: swc's (``_index``); TypeScript's CommonJS output (``index_1``, ``foo_bar_2``: the
#: module's name and a count); esbuild's (``import_index``).
_VITE = r"(?:__vite_ssr_import_\d+__|__vi_import_\d+__)"
_BINDING = rf"(?:{_VITE}|_{_IDENT}|[A-Za-z$][\w$]*_\d+|import_{_IDENT})"
_SYMBOL = (
    re.compile(
        rf"^{_LEAD}The requested module \S+ does not provide an export named ['\"]({_IDENT})['\"]"
    ),
    re.compile(rf"^{_LEAD}No matching export in \"[^\"]+\" for import \"({_IDENT})\""),
    re.compile(rf"^{_LEAD}['\"]({_IDENT})['\"] is not exported by"),
    # an import binding a compiler wrote, called ((0 , __vite_ssr_import_1__.x), babel's
    # and swc's (0 , _src.x), TypeScript's (0, index_1.x), esbuild's (0, import_src.x),
    # __vi_import_0__.x) or constructed (new index_1.X), or a bare name: never a member of
    # some object (fs.readFileSynk)
    re.compile(
        rf"^(?:\w*Error: )?(?:\(0 ?, ?{_BINDING}\.({_IDENT})\)|{_VITE}\.({_IDENT})|({_IDENT})) "
        r"is not a (?:function|constructor)\b"
    ),
    re.compile(rf"^(?:TypeError: )?{_BINDING}\.({_IDENT}) is not a constructor\b"),
    re.compile(rf"^(?:ReferenceError: )?({_IDENT}) is not defined$"),
)
#: Names a runtime or a test framework provides: "not defined" means a setup is missing
#: (vitest's globals, jsdom, CommonJS in an ES module), not the project's code.
GLOBALS = frozenset(
    {
        "describe",
        "it",
        "test",
        "expect",
        "vi",
        "jest",
        "beforeEach",
        "afterEach",
        "beforeAll",
        "afterAll",
        "suite",
        "bench",
        "assert",
        "window",
        "document",
        "navigator",
        "location",
        "localStorage",
        "sessionStorage",
        "globalThis",
        "self",
        "global",
        "process",
        "Buffer",
        "require",
        "module",
        "exports",
        "__dirname",
        "__filename",
        "fetch",
        "Request",
        "Response",
        "Headers",
        "URL",
        "URLSearchParams",
        "structuredClone",
        "TextEncoder",
        "TextDecoder",
        "setImmediate",
        "HTMLElement",
        "Element",
        "Node",
        "Event",
        "CustomEvent",
        "React",
        "h",
        "jsx",
    }
)
#: Where build output goes: a test importing it waits for a build, not for code.
BUILD_FOLDERS = ("dist", "build", "out", "lib-esm", "coverage", ".next", ".nuxt", ".output")
_TEST_FILE = re.compile(r"(^|/)(__tests__|__mocks__)/|\.(test|spec)\.[cm]?[jt]sx?$")
_SUFFIXES = tuple(f".{ext}" for ext in CODE_EXTS)
_JS_TO_TS = {".js": (".ts", ".tsx"), ".mjs": (".mts",), ".cjs": (".cts",), ".jsx": (".tsx",)}


class CodeTree(Protocol):
    """The view a run saw: the project with the session's staged changes."""

    def read(self, rel: str) -> bytes | None: ...

    def is_dir(self, rel: str) -> bool: ...

    def files(self, folder: str, suffixes: tuple[str, ...], limit: int) -> list[str]: ...


class JsMissingCode:
    """The tree check of JavaScript natural red for one view (see the module docstring)."""

    def __init__(self, tree: CodeTree, code_roots: Sequence[str]) -> None:
        self.tree = tree
        self.code_roots = tuple(code_roots) or (".",)
        self._words: dict[str, bool] = {}
        self._read: list[bytes | None] | None = None

    def proves(self, message: str) -> bool:
        """Whether ``message`` names code the tree lacks."""
        if re.search(r"\bTS\d{4}\b", message):
            return False  # a TypeScript compile error: not red
        for pattern in _MODULE:
            found = pattern.search(message.strip())
            if found is not None:
                return self._module_missing(found.group(1), found.group(2))
        if "in ES module scope" in message:
            return False  # CommonJS names in an ES module: a setup problem
        for pattern in _SYMBOL:
            found = pattern.search(message.strip())
            if found is not None:
                name = next(g for g in found.groups() if g)
                return name not in GLOBALS and not self._mentioned(name)
        return False

    def _module_missing(self, spec: str, importer: str | None) -> bool:
        spec = spec.removeprefix("file://")
        if spec.startswith("/"):
            rel = spec.removeprefix("/workspace/") if spec.startswith("/workspace/") else None
        elif spec.startswith(("./", "../")) and importer:
            where = importer.removeprefix("file://").removeprefix("/workspace/").strip("'\"")
            if where.startswith("/") or self.tree.read(where) is None:
                return False  # an importer outside the view, or named from another root
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(where), spec))
        else:
            return False  # a package (an environment problem), or no importer to resolve from
        if rel is None or rel.startswith("..") or rel in ("", "."):
            return False
        if rel.split("/", 1)[0] in BUILD_FOLDERS:
            return False  # build output: no code a session writes makes it appear
        return not any(self._exists(c) for c in _candidates(rel))

    def _exists(self, rel: str) -> bool:
        return self.tree.read(rel) is not None

    def _mentioned(self, word: str) -> bool:
        """Whether any code file outside the tests has ``word`` (as a whole word), or
        may have it (a file too large to read, more files than are scanned)."""
        if word not in self._words:
            pattern = re.compile(rf"(?<![\w$]){re.escape(word)}(?![\w$])".encode())
            self._words[word] = any(d is None or pattern.search(d) for d in self._sources())
        return self._words[word]

    def _sources(self) -> list[bytes | None]:
        if self._read is None:
            self._read = []
            seen: set[str] = set()
            for root in self.code_roots:
                listed = self.tree.files(root, _SUFFIXES, MAX_SCAN_FILES)
                if len(listed) >= MAX_SCAN_FILES:
                    self._read.append(None)  # more than are scanned: cannot rule out
                for rel in listed:
                    if rel in seen or _TEST_FILE.search(rel):
                        continue
                    seen.add(rel)
                    data = self.tree.read(rel)
                    self._read.append(None if data is None or len(data) > MAX_SOURCE_BYTES
                                      else data)  # fmt: skip
        return self._read


def _candidates(rel: str) -> list[str]:
    """The files an import of ``rel`` may resolve to."""
    base, ext = posixpath.splitext(rel)
    found = [rel]
    if ext in _JS_TO_TS:
        found += [base + other for other in _JS_TO_TS[ext]]
    found += [rel + suffix for suffix in (*_SUFFIXES, ".json", ".node")]
    found += [f"{rel}/index{suffix}" for suffix in _SUFFIXES]
    found.append(f"{rel}/package.json")
    return found
