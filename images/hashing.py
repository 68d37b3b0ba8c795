"""Content-hash tags: an image's tag is a hash of everything that goes into it.

The hash covers every file staged into the build context (Dockerfile folder, the
shared install stage, the pinned lock, fluffy's own source when the image carries it),
the identity of the parent (the base image's ID, or the parent fluffy image's tag), the
target architecture and Python, and :data:`HASH_SCHEME`.  Wheels are not hashed: the lock
pins them.  If the hash's tag already exists, the image is current and nothing runs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fluffy.images.spec import IMAGE_PYTHON, ImageSpec
from fluffy.paths import package_root

#: Bump when the hashing rules or the staging layout change.  (The shared install stage
#: did not need it: it is a hashed context file of exactly the images it goes into.)
HASH_SCHEME = "fluffy-image-v1"
#: The shared install stage's name in a build context (spec.INSTALL_STAGE).
INSTALL_STAGE_NAME = "install.Dockerfile"
#: Length of the hex tag (64 bits: collisions are not a practical concern here).
TAG_LENGTH = 16
#: What of fluffy's package goes into images that carry fluffy.
#: (``.mjs``/``.cjs``: the JUnit reporters Node's test runners load, sandboxes/node/)
FLUFFY_SOURCE_SUFFIXES = frozenset({".py", ".typed", ".json", ".yaml", ".yml", ".mjs", ".cjs"})


def fluffy_source_files(parts: tuple[str, ...] = ()) -> dict[str, Path]:
    """fluffy's importable files, keyed by their path under ``fluffy/`` in the context.

    ``parts`` limits them to those files and folders of the package (``()``: all).
    """
    root = package_root()
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for filename in filenames:
            path = Path(dirpath, filename)
            rel = path.relative_to(root).as_posix()
            if path.suffix in FLUFFY_SOURCE_SUFFIXES and (
                not parts or rel.split("/", 1)[0] in parts
            ):
                files["fluffy/" + rel] = path
    return files


def context_files(spec: ImageSpec) -> dict[str, Path]:
    """Every file staged into ``spec``'s build context except wheels: context path -> source."""
    files: dict[str, Path] = {}
    for path in sorted(spec.directory.iterdir()):
        if path.is_file():
            files[path.name] = path
    if spec.install_stage is not None:
        files[INSTALL_STAGE_NAME] = spec.install_stage
    if spec.lock_path is not None:
        files["requirements.lock"] = spec.lock_path
    if spec.with_fluffy:
        files.update(fluffy_source_files(spec.fluffy_parts))
    return files


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def content_hash(spec: ImageSpec, *, parent_identity: str, arch: str) -> str:
    """The tag of ``spec`` built on ``parent_identity`` for ``arch``."""
    digest = hashlib.sha256()

    def feed(*parts: str) -> None:
        for part in parts:
            data = part.encode()
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)

    feed(HASH_SCHEME, spec.name, parent_identity, arch, IMAGE_PYTHON)
    for rel, path in sorted(context_files(spec).items()):
        executable = "x" if os.access(path, os.X_OK) else "-"
        feed(rel, executable, _file_digest(path))
    return digest.hexdigest()[:TAG_LENGTH]
