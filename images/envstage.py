"""The build context of a project environment, made on the host from files only.

``wheels/`` gets every wheel the requirements need: downloaded from the package index
(:func:`~fluffy.images.envdownload.pip_download`), the repository's own (for it alone),
and releases with no wheel built from their sdists offline in a container
(:class:`~fluffy.images.sdists.SourceBuilder`).  ``project/`` gets the project's files for
its own install, which runs in the image build; ``plan.json`` tells it what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fluffy.errors import EnvironmentFailed
from fluffy.images.envdownload import check_hashes, own_wheels, pip_download, sha256_file
from fluffy.images.pyindex import Index, PipSettings
from fluffy.images.sdists import SourceBuilder, built_dir
from fluffy.images.spec import IMAGE_PYTHON
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.project.viewfiles import walk_project

#: Files of the project copied into the build for its own install, at most.
MAX_PROJECT_BYTES = 512 * 1024 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Releases built from source in one environment build, at most.
MAX_SOURCE_BUILDS = 12

Say = Callable[[str], None]


def project_version(project: Path) -> str:
    """The version a VCS-versioned project would report (its last tag), else 0.0.0.
    git runs with the repository's command-running settings switched off."""
    try:
        out = subprocess.run(
            ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
             "-c", f"safe.directory={project}", "-C", str(project), "describe", "--tags",
             "--abbrev=0"],
            capture_output=True, text=True, timeout=10, check=False, cwd="/",
        ).stdout.strip()  # fmt: skip
        return str(Version(out.lstrip("vV")))
    except (OSError, subprocess.SubprocessError, InvalidVersion):
        return "0.0.0"


class Stager:
    """Fills one build context for ``project`` (see the module docstring)."""

    def __init__(self, engine: Engine, base_image: str, state: Path, context: Path,
                 arch: str, hashes: dict[str, set[str]], say: Say) -> None:  # fmt: skip
        self.engine, self.base_image, self.arch, self.say = engine, base_image, arch, say
        self.hashes = hashes
        self.wheels = context / "wheels"
        self.own = context / "own-wheels"
        self.built = context / "built-wheels"
        for folder in (self.wheels, self.own, self.built):
            folder.mkdir(parents=True, exist_ok=True)
        self.notes: list[str] = []
        self.trusted: set[str] = set()
        self._state = state
        self._builder: SourceBuilder | None = None

    @property
    def links(self) -> list[Path]:
        return [self.own, self.built]

    def builder(self) -> SourceBuilder:
        if self._builder is None:
            self._builder = SourceBuilder(
                self.engine, self.base_image, Index(PipSettings.read()),
                built_dir(self._state), self._build_requirements, self.hashes,
            )  # fmt: skip
        return self._builder

    def take_own(self, project: Path) -> None:
        self.trusted |= set(own_wheels(project, self.own, self.notes))

    def fetch(self, lines: list[str], constraints: list[str], what: str) -> None:
        """Wheels for ``lines`` into ``wheels/``, building from source what has none."""
        tried: set[str] = set()
        for _ in range(MAX_SOURCE_BUILDS + 1):
            missing = pip_download(lines, constraints, self.wheels, self.links, self.arch, what)
            if missing is None:
                check_hashes(self.wheels, self.hashes, self.trusted)
                return
            name = canonicalize_name(missing.name)
            if name in tried:
                raise EnvironmentFailed(
                    f"{missing} was built from source but still cannot be installed",
                    why="the wheel built from its source archive does not fit the requirement",
                    fix=f"Pin a version of {missing.name} with a wheel, or put one in "
                    ".fluffy/wheels/.",
                )
            tried.add(name)
            self._from_source(missing, constraints)
        raise EnvironmentFailed(
            f"more than {MAX_SOURCE_BUILDS} requirements have no wheel",
            fix="Pin releases that publish wheels, or put wheels in .fluffy/wheels/.",
        )

    def _from_source(self, missing: Requirement, constraints: list[str]) -> None:
        self.say(f"{missing.name} has no wheel: building it from source in a container")
        made = self.builder().build(missing, constraints, IMAGE_PYTHON)
        wheel = built_dir(self._state) / made.sha256 / made.wheel
        shutil.copyfile(wheel, self.built / made.wheel)
        self.trusted.add(sha256_file(self.built / made.wheel))

    def _build_requirements(self, lines: list[str], dest: Path) -> None:
        """An sdist's own build requirements: wheels only (one level, no recursion)."""
        missing = pip_download(lines, [], dest, self.links, self.arch, "build requirement")
        if missing is not None:
            raise EnvironmentFailed(
                f"a build requirement, {missing}, has no wheel",
                fix=f"Put a wheel of {missing.name} in .fluffy/wheels/.",
            )
        check_hashes(dest, self.hashes, self.trusted)

    def built_from_source(self) -> list[str]:
        return [] if self._builder is None else [str(b) for b in self._builder.built]

    def copy_project(
        self, project: Path, dest: Path, hide: Callable[[str], bool] = lambda rel: False
    ) -> None:
        """The project's files for its own install, without those ``hide`` names."""
        copied = 0
        for entry in walk_project(project):
            if entry.size > MAX_FILE_BYTES or hide(entry.rel):
                continue
            copied += entry.size
            if copied > MAX_PROJECT_BYTES:
                raise EnvironmentFailed(
                    f"the project is larger than {MAX_PROJECT_BYTES // 2**20} MiB",
                    why="its files are copied into the environment's build for its own install",
                    fix="Leave large data out of the project folder, or add them to "
                    ".gitignore-like folders fluffy skips (.venv, node_modules, build).",
                )
            target = dest / entry.rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.link is not None:  # a link stays a link: never the host's file behind it
                target.symlink_to(entry.link)
                continue
            try:
                fd = os.open(project / entry.rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # replaced by a link or a fifo since the walk: not copied
            with os.fdopen(fd, "rb") as source, target.open("wb") as out:
                if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                    continue
                shutil.copyfileobj(source, out)
        dest.mkdir(exist_ok=True)


def write_plan(context: Path, document: dict[str, Any]) -> None:
    (context / "plan.json").write_text(json.dumps(document, indent=1))
