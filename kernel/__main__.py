"""Entry point of the kernel image: ``python3 -m fluffy.kernel <command>``.

``self-check`` verifies, inside the image, that the kernel runs unprivileged and that
every runtime dependency imports; it prints one JSON object.  ``serve`` is the kernel
process bootstrap starts in the L1 container (``fluffy kernel serve``).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sqlite3
import sys

from fluffy._version import __version__

#: Import names of the kernel's runtime dependencies (images/requirements/kernel.in).
RUNTIME_IMPORTS = (
    "pydantic",
    "msgspec",
    "yaml",
    "pathspec",
    "aiosqlite",
    "docker",
    "podman",
    "rich",
    "prompt_toolkit",
)


def self_check() -> dict[str, object]:
    versions: dict[str, str] = {}
    missing: list[str] = []
    for name in RUNTIME_IMPORTS:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name}: {exc}")
            continue
        versions[name] = str(getattr(module, "__version__", getattr(module, "VERSION", "?")))
    try:  # `fluffy audit log --session/--decision` filter with SQLite's JSON functions
        sqlite_json = sqlite3.connect(":memory:").execute("SELECT json_valid('[1]')").fetchone()
    except sqlite3.Error:
        sqlite_json = None
    return {
        "fluffy": __version__,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlite_json": sqlite_json == (1,),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "imports": versions,
        "missing": missing,
        "ok": not missing and os.getuid() != 0,
    }


def _serve(args: list[str]) -> int:
    """``serve``: the same kernel as ``fluffy kernel serve``, without the CLI's imports.

    The bootstrap runs it in L1, where the kernel image has no image sources: the
    sandboxes' images are the ones it names (FLUFFY_IMAGES) or the newest by label.  On
    a host, ``fluffy kernel serve`` also checks that they are current for the sources.
    """
    import argparse
    import gc
    import logging
    from pathlib import Path

    gc.disable()  # the imports too (fluffy.kernel.process_tuning; serve_main collects again)
    # no pydantic plugins: the kernel loads no code named by installed packages' entry
    # points, and its first model skips the scan of every package's metadata (~6 ms)
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    from fluffy.errors import FluffyError
    from fluffy.kernel.serve import main as serve_main

    parser = argparse.ArgumentParser(prog="python3 -m fluffy.kernel serve")
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument("--state-dir", required=True, help="the kernel's state folder")
    parser.add_argument("--project", help="the project directory")
    given = parser.parse_args(args)
    project = Path(given.project).resolve() if given.project else None
    try:
        code = serve_main(Path(given.socket).absolute(), Path(given.state_dir).absolute(), project)
    except FluffyError as error:  # the design's display (fluffy/cli/render.py's, plain)
        shown = (("ERROR", error.what), ("Reason", error.why), ("Fix", error.fix),
                 ("Context", error.context))  # fmt: skip
        for label, text in shown:
            if text:
                print(f"{label}: {text}", file=sys.stderr)
        print(f"({error.code})", file=sys.stderr)
        return 3  # the CLI's EXIT_ERROR
    except KeyboardInterrupt:  # before the kernel's own signal handlers are in place
        print("interrupted", file=sys.stderr)
        return 130
    # stopped cleanly: its log closed and flushed, its backup taken.  The interpreter's
    # own teardown (every module and object freed, ~100 ms) is all a stop would wait for
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["self-check"]:
        report = self_check()
        print(json.dumps(report, sort_keys=True))
        return 0 if report["ok"] else 1
    if args[:1] == ["serve"]:  # what bootstrap runs in the L1 container
        return _serve(args[1:])
    print(
        "usage: python3 -m fluffy.kernel self-check | serve --socket S --state-dir D",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
