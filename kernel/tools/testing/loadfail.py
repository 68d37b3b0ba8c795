"""A JavaScript test file that could not be loaded, read from its runner's output.

mocha loads every test file before its reporter starts: when one cannot be loaded it
prints the error and writes no report at all.  A model's first test of a module it is
about to write is exactly that (``require('../lib/slug')`` of a file not there yet), so
such a run is taken as a failing run of that one file, an ``error`` case named by the
file like a collection error of pytest's, and the workflow's red verdict judges it
(:mod:`fluffy.kernel.workflow.jsmissing`: red only when the module is a path in the
project where no file exists).

Only Node's own two sentences for a module that is not found are read, and only when
the importer they name is a test file of the project::

    Error [ERR_MODULE_NOT_FOUND]: Cannot find module '/workspace/lib/slug.mjs' imported
        from /workspace/test/slug.test.mjs                                         (ESM)
    Error: Cannot find module '../lib/slug'
    Require stack:
    - /workspace/test/slug.test.js                                                 (CommonJS)

Anything else stays the runner's error, answered with its output.  The output is the
sandbox's (code under test can print these words): the case only ever makes a run
fail, and red still needs the tree to lack the module.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fluffy.junit import TestCase

_WORKSPACE = "/workspace/"
_ESM = re.compile(r"Cannot find module '([^'\n]{1,300})' imported from (\S{1,300})")
_CJS = re.compile(
    r"Error: Cannot find module '([^'\n]{1,300})'\r?\nRequire stack:\r?\n- (\S{1,300})"
)


def load_failure(output: str, is_test: Callable[[str], bool]) -> TestCase | None:
    """The test file whose load failed, as a failing case of that file (None: the output
    does not say so, or the importer is not one of the run's test files: ``is_test``
    answers for the normalised project path)."""
    for pattern in (_ESM, _CJS):
        found = pattern.search(output)
        if found is None:
            continue
        module, importer = found.groups()
        path = importer.removeprefix("file://")
        if not path.startswith(_WORKSPACE):
            return None
        rel = path.removeprefix(_WORKSPACE)
        if not is_test(rel):  # the run's own test files: no other path is one
            return None
        return TestCase(
            id=rel,
            file=rel,
            outcome="error",
            assertion=False,
            message=f"Cannot find module '{module}' imported from {_WORKSPACE}{rel}",
            origin=rel,
        )
    return None
