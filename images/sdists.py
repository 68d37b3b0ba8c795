"""A release with no wheel, built from its sdist offline in a container, never here.

:mod:`fluffy.images.pyindex` fetches the archive as bytes (sha256 checked against the
index and against the project's lock when it records one); its ``[build-system]
requires`` are read from the archive's ``pyproject.toml`` as data and downloaded as
wheels like every other requirement.  The wheel is then built by ``pip wheel --no-index``
in an image build ``FROM`` fluffy's code-executor image, network off, as the unprivileged
user 10001, and copied out.  Built wheels are kept per project, by the sdist's sha256
(:func:`built_dir`): one project's build can never be another's dependency.
"""

from __future__ import annotations

import secrets
import shutil
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from fluffy.errors import EnvironmentFailed, FluffyError, PackageUnavailable
from fluffy.images.envdownload import carries_reserved
from fluffy.images.imagefiles import copy_from_image
from fluffy.images.pyindex import Index, SourceFile, choose
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.errors import engine_call
from fluffy.kernel.containers.images import ImageStore
from fluffy.kernel.project.reqlines import Refusal, requirement_line

#: What an sdist without ``[build-system]`` is built with (PEP 517's fallback).
LEGACY_BUILD = ["setuptools>=40.8.0", "wheel"]
MAX_PYPROJECT = 1024 * 1024
#: Labels of every image a build leaves behind (intermediate steps included): never one
#: of fluffy's names, so no step of a build can be taken for a sandbox image.
STAGE_LABELS = 'LABEL org.fluffy.image="build-stage" org.fluffy.content-hash=""'
DOCKERFILE = f"""\
# A wheel built from an sdist (fluffy env build): offline, as the unprivileged user.
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
{STAGE_LABELS}
USER root
RUN mkdir -m 0755 /wheel-out && chown 10001:10001 /wheel-out
COPY . /build/
USER 10001:10001
RUN HOME=/tmp /opt/fluffy/venv/bin/python -m pip wheel --disable-pip-version-check \\
      --no-cache-dir --no-index --find-links /build/wheels --no-deps -w /wheel-out \\
      /build/sdist/*
"""

Download = Callable[[list[str], Path], None]


@dataclass(frozen=True)
class Built:
    """A wheel made from source: for ``fluffy env build`` to say what and from where."""

    name: str
    version: str
    sdist: str
    sha256: str
    wheel: str

    def __str__(self) -> str:
        return (f"{self.name} {self.version} built from its source archive {self.sdist} "
                f"(sha256 {self.sha256[:12]}…) offline in a container")  # fmt: skip


def built_dir(state: Path) -> Path:
    """The project's own wheels built from source (never shared between projects)."""
    return state / "envs" / "built"


def build_requires(archive: Path) -> list[str]:
    """The sdist's ``[build-system] requires`` (read as data; PEP 517's fallback without
    one).  A URL or option in it refuses the build."""
    text = _member(archive, "pyproject.toml")
    if text is None:
        return list(LEGACY_BUILD)
    try:
        build = tomllib.loads(text).get("build-system")
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return list(LEGACY_BUILD)
    if not isinstance(build, dict) or "requires" not in build:
        return list(LEGACY_BUILD)
    refused: list[Refusal] = []
    lines = [str(r) for r in build.get("requires") or [] if isinstance(r, str)]
    kept = [k for r in lines if (k := requirement_line(r, f"{archive.name}/pyproject.toml",
                                                       refused)) is not None]  # fmt: skip
    if refused:
        raise EnvironmentFailed(
            f"{archive.name} asks for a build requirement fluffy does not fetch",
            why="; ".join(str(r) for r in refused)[:1500],
            fix="Pin another release of it, or build its wheel yourself into .fluffy/wheels/.",
        )
    return kept


def _member(archive: Path, name: str) -> str | None:
    """``<top>/<name>`` of a .tar.gz or .zip sdist, as text (bounded), or None."""
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as bundle:
                for info in bundle.infolist():
                    if info.filename.count("/") == 1 and info.filename.endswith("/" + name):
                        if info.file_size > MAX_PYPROJECT:
                            return None
                        return bundle.read(info).decode("utf-8", "replace")
            return None
        with tarfile.open(archive) as bundle:
            for member in bundle:
                if (
                    member.isfile()
                    and member.name.count("/") == 1
                    and member.name.endswith("/" + name)
                ):
                    if member.size > MAX_PYPROJECT:
                        return None
                    handle = bundle.extractfile(member)
                    return None if handle is None else handle.read().decode("utf-8", "replace")
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError):
        return None
    return None


class SourceBuilder:
    """Builds the project's sdist-only requirements, one at a time, into its own folder."""

    def __init__(self, engine: Engine, base_image: str, index: Index, folder: Path,
                 download: Download, hashes: dict[str, set[str]]) -> None:  # fmt: skip
        self.engine, self.base_image, self.index = engine, base_image, index
        self.folder, self.download, self.hashes = folder, download, hashes
        self.built: list[Built] = []
        self._wanted = ""

    def build(self, wanted: Requirement, constraints: list[str], python: str) -> Built:
        self._wanted = canonicalize_name(wanted.name)
        source = choose(self.index.sources(wanted.name), wanted, constraints, python)
        if source is None:
            raise PackageUnavailable(
                f"no wheel and no source archive of {wanted} for CPython {python}",
                why=f"the package index has no release of {wanted.name} that fits",
                fix=f"Pin a version of {wanted.name} that exists, or put a wheel of it in "
                ".fluffy/wheels/, then run `fluffy env build` again.",
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fluffy-sdist-") as tmp:
            context = Path(tmp)
            (context / "sdist").mkdir()
            (context / "wheels").mkdir()
            archive = context / "sdist" / source.filename
            digest = self.index.fetch(source, archive)
            self._check_lock(wanted.name, source, digest)
            done = self._cached(digest)
            if done is None:
                try:
                    self.download(build_requires(archive), context / "wheels")
                except EnvironmentFailed as exc:
                    raise EnvironmentFailed(
                        f"cannot build {source.filename} from source: {exc.what}",
                        why=exc.why or "",
                        fix=f"Pin a release of {wanted.name} that has a wheel, or build one "
                        "yourself and put it in .fluffy/wheels/.",
                    ) from exc
                done = self._container_build(context, source, digest)
        name = canonicalize_name(wanted.name)
        made = Built(name, str(source.version), source.filename, digest, done.name)
        self.built.append(made)
        return made

    def _check_lock(self, name: str, source: SourceFile, digest: str) -> None:
        key = f"{canonicalize_name(name)}=={source.version}"
        allowed = self.hashes.get(key)
        if allowed and digest not in allowed:
            raise EnvironmentFailed(
                f"{source.filename} does not match the hashes your lock file records",
                why=f"sha256 {digest} is not one of {', '.join(sorted(allowed))[:400]}",
                fix="Regenerate the lock file with its tool if the release really changed.",
            )

    def _cached(self, digest: str) -> Path | None:
        folder = self.folder / digest
        wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
        return wheels[0] if len(wheels) == 1 else None

    def _container_build(self, context: Path, source: SourceFile, digest: str) -> Path:
        (context / "Dockerfile").write_text(DOCKERFILE)
        store = ImageStore(self.engine)
        tag = f"fluffy/sdist-build:{digest[:24]}-{secrets.token_hex(4)}"  # this build's
        lines: list[str] = []
        try:
            try:
                store.build(context, tag, buildargs={"BASE_IMAGE": self.base_image},
                            labels={"org.fluffy.image": "build-stage"},
                            on_line=lines.append, on_step=lambda *_: None,
                            network_mode="none")  # fmt: skip
            except FluffyError as exc:
                raise EnvironmentFailed(
                    f"building {source.filename} from source failed",
                    why=("\n".join(lines[-15:]) or exc.why or exc.what)[-1500:],
                    fix="It may need a compiler or system libraries the image lacks: pin a "
                    "release with a wheel, or build one yourself into .fluffy/wheels/.",
                ) from exc
            wheel = self._copy_out(store.image_id(tag) or tag, digest)  # its own refusals
        finally:
            with engine_call(f"remove {tag}"):
                if store.image_id(tag):
                    store.remove(tag)
            store.prune_dangling("org.fluffy.image")
        return wheel

    def _copy_out(self, image: str, digest: str) -> Path:
        target = self.folder / digest
        with tempfile.TemporaryDirectory(dir=self.folder, prefix=".tmp-") as tmp:
            copy_from_image(self.engine, image, "/wheel-out", Path(tmp))
            wheels = sorted(Path(tmp).rglob("*.whl"))
            names = [wheel.name for wheel in wheels]
            try:
                (made,) = (canonicalize_name(parse_wheel_filename(n)[0]) for n in names)
            except (ValueError, InvalidWheelFilename):
                raise EnvironmentFailed(
                    f"the source archive of {self._wanted} did not build one wheel of it",
                    why=f"its build made {len(names)} wheel file(s): {names[:5]}",
                    fix=f"Pin another release of {self._wanted}, or put a wheel in "
                    ".fluffy/wheels/.",
                ) from None
            if made != self._wanted or (why := carries_reserved(wheels[0])) is not None:
                raise EnvironmentFailed(
                    f"the source archive of {self._wanted} built {wheels[0].name}",
                    why=f"a release's build must make that release's wheel, and nothing the "
                    f"test evidence rests on ({why or 'another name'})",
                    fix=f"Pin another release of {self._wanted}, or put a wheel in "
                    ".fluffy/wheels/.",
                )
            if target.exists():
                shutil.rmtree(target)
            target.mkdir()
            shutil.move(str(wheels[0]), target / wheels[0].name)
        return target / wheels[0].name
