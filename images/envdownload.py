"""The host's part of a project environment: files moved, never run.

``pip download --only-binary=:all:`` fetches wheels (a wheel is unpacked, never executed,
at install time) for requirements that :mod:`fluffy.kernel.project.reqlines` has parsed and
re-rendered: they reach pip in a requirements file, each line checked again here
(:func:`~fluffy.kernel.project.reqlines.check_line`), never as arguments, so nothing the
repository wrote can be a URL, a path or an option.

Wheels are trusted by content, not by name:

* a file a lock (or a ``--hash``) records hashes for must have one of them;
* the repository's own ``.fluffy/wheels/`` are used for that repository only (copied into
  this build, never into a shared folder), and never for the tools the evidence rests on
  (pytest, its plugin manager, coverage), which come from the index;
* nothing is cached across projects by file name: pip's own HTTP cache (by URL, from the
  index) saves the downloads.
"""

from __future__ import annotations

import configparser
import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from fluffy.errors import EnvironmentFailed, WheelHashMismatch
from fluffy.images.wheelhouse import target_args
from fluffy.kernel.project.reqlines import check_line, shown

#: Distributions the test evidence rests on: never the repository's own build of them.
RESERVED = frozenset({"pytest", "pluggy", "coverage", "pytest-cov"})
#: What those install at the top of site-packages (a wheel of another name may carry them).
RESERVED_TOP = frozenset({"pytest", "_pytest", "pluggy", "coverage", "pytest_cov", "py.py"})
_NO_DIST = re.compile(
    r"(?:No matching distribution found for|Could not find a version that satisfies the "
    r"requirement)\s+(\S+)"
)
MAX_OWN_WHEEL = 256 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def own_wheels(project: Path, dest: Path, notes: list[str]) -> dict[str, str]:
    """Copy the repository's ``.fluffy/wheels/*.whl`` (regular files with a wheel's name)
    into ``dest``; sha256 -> file name of each one copied."""
    dest.mkdir(parents=True, exist_ok=True)
    folder = project / ".fluffy" / "wheels"
    if folder.is_symlink() or not folder.is_dir() or (project / ".fluffy").is_symlink():
        return {}
    copied: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not path.is_file() or not path.name.endswith(".whl"):
            continue
        try:
            name = canonicalize_name(parse_wheel_filename(path.name)[0])
        except InvalidWheelFilename:
            notes.append(f".fluffy/wheels/{shown(path.name)}: not a wheel's file name; not used")
            continue
        if name in RESERVED:
            notes.append(f".fluffy/wheels/{shown(path.name)}: {name} comes from the package "
                         "index (the test evidence rests on it); the repository's copy is "
                         "not used")  # fmt: skip
            continue
        if path.stat().st_size > MAX_OWN_WHEEL:
            notes.append(f".fluffy/wheels/{shown(path.name)}: larger than 256 MiB; not used")
            continue
        reserved = carries_reserved(path)
        if reserved is not None:
            notes.append(f".fluffy/wheels/{shown(path.name)}: {reserved}; not used")
            continue
        shutil.copyfile(path, dest / path.name)
        copied[sha256_file(dest / path.name)] = path.name
    return copied


def carries_reserved(wheel: Path) -> str | None:
    """Why a wheel may not be used beside the evidence tools: it installs one of their
    top-level modules, a ``.pth`` (code Python runs at start-up), a file into the
    interpreter's own folders or a command the tests run through; None: it does not."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return _reserved_in(archive)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError,
            configparser.Error):  # fmt: skip
        return "not a readable wheel"


def _reserved_in(archive: zipfile.ZipFile) -> str | None:
    for name in archive.namelist():
        parts = name.split("/")
        top = parts[0]
        if top.endswith(".data") and len(parts) > 2:
            scheme, inner = parts[1], parts[2:]
            if scheme in ("purelib", "platlib"):
                top = inner[0]
            elif scheme == "data" and inner[0] not in _DATA_FOLDERS:
                # relative to the environment's prefix: lib/python3.X/site-packages/x.pth,
                # bin/python, pyvenv.cfg
                return f"it installs {'/'.join(inner)} into the interpreter's own folders"
            elif scheme == "scripts" and _command(inner[-1]):
                return f"it installs the command {inner[-1]}, which runs the tests"
        if top.endswith(".dist-info") and parts[-1] == "entry_points.txt":
            command = _commands_named(archive.read(name).decode("utf-8", "replace"))
            if command is not None:
                return f"it installs the command {command}, which runs the tests"
        if top in RESERVED_TOP:
            return f"it carries {top}, which the test evidence rests on"
        if top.endswith(".pth"):
            return f"it carries {top}, which Python runs at start-up"
    return None


#: Where a wheel's data files may go (relative to the environment's prefix): documents,
#: configuration and headers, never the interpreter's own folders.
_DATA_FOLDERS = frozenset({"share", "etc", "include", "man"})


def _commands_named(text: str) -> str | None:
    """The first console or GUI script in an ``entry_points.txt`` (an INI file) that would
    take the place of a command the tests run through (``python3 = evil:main``)."""
    parser = configparser.ConfigParser(
        interpolation=None, delimiters=("=",), strict=False, allow_no_value=True
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep names as written
    parser.read_string(text)
    for section in ("console_scripts", "gui_scripts"):
        if parser.has_section(section):
            for name in parser.options(section):
                if _command(name):
                    return name
    return None


def _command(name: str) -> bool:
    """A command the test evidence runs through (an interpreter, pytest, a coverage tool)."""
    lowered = name.lower()
    return lowered.startswith(("python", "pytest", "py.test", "coverage", "pip"))


def _missing(output: str) -> Requirement | None:
    found = _NO_DIST.search(output)
    if found is None:
        return None
    try:
        return Requirement(found.group(1).strip("'\""))
    except InvalidRequirement:
        return None


def pip_download(
    lines: list[str],
    constraints: list[str],
    dest: Path,
    find_links: list[Path],
    arch: str,
    what: str,
) -> Requirement | None:
    """Download wheels for ``lines`` into ``dest``; the requirement that has no wheel
    (None: all downloaded).  Any other failure raises :class:`EnvironmentFailed`."""
    folder = dest.parent / f".pip-input-{what.replace(' ', '-')}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / "requirements.txt").write_text("".join(f"{check_line(x)}\n" for x in lines))
        (folder / "constraints.txt").write_text("".join(f"{check_line(x)}\n" for x in constraints))
    except (InvalidRequirement, ValueError) as exc:
        raise EnvironmentFailed(f"refusing a {what} line", why=str(exc)) from exc
    command = [
        sys.executable, "-P", "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        *target_args(arch), "--dest", str(dest),
        *(f"--find-links={p}" for p in find_links),
        "-r", str(folder / "requirements.txt"), "-c", str(folder / "constraints.txt"),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False, cwd=folder)
    if proc.returncode == 0:
        return None
    output = proc.stderr + proc.stdout
    missing = _missing(output)
    if missing is not None:
        return missing
    raise EnvironmentFailed(
        f"cannot download the {what}s",
        why="`pip download` failed on this host: " + output.strip()[-1500:],
        fix="Check that `pip download` works here (index, proxy, CA certificates), then "
        "run `fluffy env build` again.",
    )


def check_hashes(folder: Path, hashes: dict[str, set[str]], trusted: set[str]) -> None:
    """Every wheel in ``folder`` whose release a lock records hashes for has one of them
    (``trusted``: the repository's own wheels and wheels built here from a checked sdist)."""
    for wheel in sorted(folder.glob("*.whl")):
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            raise EnvironmentFailed(f"{shown(wheel.name)} is not a wheel's name") from None
        allowed = hashes.get(f"{canonicalize_name(name)}=={version}")
        digest = sha256_file(wheel)
        if allowed and digest not in allowed and digest not in trusted:
            raise WheelHashMismatch(
                f"{wheel.name} does not match the hashes your lock file records",
                why=f"its sha256 is {digest}; the lock allows {', '.join(sorted(allowed))[:600]}",
                fix="If the release really changed, regenerate the lock with its tool; "
                "otherwise your index or a proxy serves a changed file.",
            )
