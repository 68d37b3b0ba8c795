"""The install scripts of a Node environment's packages, run in the image build.

npm runs a package's ``preinstall``, ``install`` and ``postinstall`` scripts when it
installs it, and some packages need them (a generated file, a binary put in place).
fluffy never runs them on the host (ADR-072).  Here, in the image build -- network none,
no folder of the host, as the sandbox user 10001 with write access to that package's own
folder only -- each runs once, dependencies before dependents, within a time limit.  One
that fails is reported, never fatal: the tests say what it lacked.  A package that would
build a native addon (a ``binding.gyp`` and no install script: npm would run
``node-gyp rebuild``) is named, not built: the image has no compiler.

Standard library only (it runs with the image's own Python).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HOOKS = ("preinstall", "install", "postinstall")
TIMEOUT_S = 300
MAX_SCRIPTS = 200
SANDBOX_USER = 10001


def script_order(plan: dict[str, Any], folder: Callable[[str], Path]) -> list[tuple[str, Path]]:
    """(package key, its folder) in the order npm would run their scripts: dependencies
    before dependents.  ``folder`` gives a package's folder from its install path (tree)
    or its key (isolated)."""
    if plan["layout"] == "tree":
        deepest_first = sorted(plan["placed"].items(), key=lambda kv: (-kv[0].count("/"), kv[0]))
        return [(key, folder(rel)) for rel, key in deepest_first]
    packages: dict[str, dict[str, Any]] = plan["packages"]
    order: list[str] = []
    seen: set[str] = set()
    for root in sorted(packages):
        if root in seen:
            continue
        seen.add(root)
        stack: list[tuple[str, Iterator[str]]] = [
            (root, iter(sorted(packages[root]["deps"].values())))
        ]
        while stack:
            key, deps = stack[-1]
            following = next((d for d in deps if d in packages and d not in seen), None)
            if following is None:
                stack.pop()
                order.append(key)
            else:
                seen.add(following)
                stack.append((following, iter(sorted(packages[following]["deps"].values()))))
    return [(key, folder(key)) for key in order]


def _own(root: Path, uid: int) -> None:
    """The package's folder (never what its links lead to) to ``uid``."""
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, uid)


def _scripts(folder: Path) -> dict[str, str]:
    try:
        scripts = json.loads((folder / "package.json").read_text()).get("scripts")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(scripts, dict):
        return {}
    return {h: scripts[h] for h in HOOKS if isinstance(scripts.get(h), str) and scripts[h]}


def run_scripts(order: list[tuple[str, Path]], modules: Path, node_bin: Path) -> list[str]:
    """Run each package's install scripts; one line per script run or not run."""
    said: list[str] = []
    ran = 0
    for key, folder in order:
        scripts = _scripts(folder)
        if not scripts:
            if (folder / "binding.gyp").is_file():
                said.append(f"{key}: builds a native addon (binding.gyp), which needs a "
                            "compiler the image does not have; not built")  # fmt: skip
            continue
        if ran >= MAX_SCRIPTS:
            said.append(f"more than {MAX_SCRIPTS} install scripts: the rest were not run")
            break
        _own(folder, SANDBOX_USER)
        try:
            for hook, command in scripts.items():
                ran += 1
                said.append(f"{key}: {hook} {_run(key, folder, hook, command, modules, node_bin)}")
        finally:
            _own(folder, 0)
    return said


def bin_path(folder: Path, modules: Path) -> list[Path]:
    """The ``.bin`` folders a package's scripts find commands in, nearest first, as npm
    puts them on the PATH: the package's own ``node_modules/.bin``, then that of every
    ``node_modules`` folder above it up to ``modules``."""
    found = [folder / "node_modules" / ".bin"]
    here = folder
    while here != modules and here.is_relative_to(modules):
        here = here.parent
        if here.name == "node_modules":
            found.append(here / ".bin")
    return list(dict.fromkeys(found))


def _run(key: str, folder: Path, hook: str, command: str, modules: Path, node_bin: Path) -> str:
    name, _, version = key.rpartition("@")
    commands = ":".join(str(path) for path in bin_path(folder, modules))
    env = {
        # Node's and the system's commands first: a package's never shadows them
        "PATH": f"{node_bin}:/usr/local/bin:/usr/bin:/bin:{commands}",
        "HOME": "/tmp",  # noqa: S108 - the build's own /tmp
        "npm_lifecycle_event": hook,
        "npm_package_name": name,
        "npm_package_version": version,
        "npm_config_user_agent": "fluffy (install scripts in the image build)",
    }
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command], cwd=folder, env=env, user=SANDBOX_USER,
            group=SANDBOX_USER, extra_groups=[] if os.geteuid() == 0 else None,
            capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"did not finish within {TIMEOUT_S} s (stopped)"
    except OSError as exc:
        return f"could not start: {exc}"
    if done.returncode == 0:
        return "ran"
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
    return f"failed (exit {done.returncode}): {tail[0][:200]}"
