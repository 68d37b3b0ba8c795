"""The base image every fluffy image is built FROM.

Order of attempts for ``debian:bookworm-slim`` (or ``FLUFFY_BASE_IMAGE``):

1. it is already in the engine: use it;
2. the engine can pull it: pull it (the normal case on a user's machine);
3. otherwise (no registry, as on fluffy's CI) make it offline: ``debootstrap
   --variant=minbase`` into a cache folder, then import the tree under the same
   name, so the Dockerfiles build ``FROM`` it unchanged.

Step 3 needs root and debootstrap (Debian/Ubuntu: ``apt-get install debootstrap``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from fluffy.errors import BaseImageUnavailable, FluffyError
from fluffy.images.spec import DEFAULT_BASE_IMAGE
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore
from fluffy.paths import cache_dir

DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Files the official slim image also leaves out; they only cost space.
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")


def base_image_ref() -> str:
    return os.environ.get("FLUFFY_BASE_IMAGE") or DEFAULT_BASE_IMAGE


def ensure_base_image(engine: Engine, log: Callable[[str], None] = print) -> str:
    """Make sure the base image exists; return its image ID."""
    ref = base_image_ref()
    store = ImageStore(engine)
    image_id = store.image_id(ref)
    if image_id:
        return image_id
    log(f"base image {ref} is not present; trying to pull it")
    try:
        store.pull(ref)
        problem = "" if store.image_id(ref) else "the engine reported no image"
    except FluffyError as exc:
        problem = exc.what.rsplit(": ", 1)[-1][:120]
    if problem:
        log(f"cannot pull {ref} ({problem})")
        if not copy_from_other_engine(engine, ref, log):
            log("building it offline")
            debootstrap_import(engine, ref, log)
    image_id = store.image_id(ref)
    if not image_id:
        raise BaseImageUnavailable(
            f"base image {ref} is still missing after import",
            why="the debootstrap import ended without the engine listing the image",
            fix="Run `fluffy images build` again; if it persists, check the engine's storage "
            "(`docker info`).",
        )
    return image_id


def copy_from_other_engine(engine: Engine, ref: str, log: Callable[[str], None]) -> bool:
    """Copy ``ref`` from the other engine on this machine (Docker <-> Podman), if it has it."""
    from fluffy.kernel.containers.engine import connect

    other = "podman" if engine.name == "docker" else "docker"
    try:
        source = connect({**os.environ, "FLUFFY_RUNTIME": other}, timeout=30)
    except FluffyError:
        return False
    with source, tempfile.TemporaryFile() as buffer:
        if not ImageStore(source).image_id(ref):
            return False
        log(f"copying {ref} from {other}")
        ImageStore(source).save(ref, buffer)
        buffer.seek(0)
        ImageStore(engine).load(buffer)
    return True


def _suite_of(ref: str) -> str:
    tag = ref.rsplit(":", 1)[-1] if ":" in ref else "bookworm"
    return tag.split("-", 1)[0]


def debootstrap_import(engine: Engine, ref: str, log: Callable[[str], None] = print) -> None:
    """Build a minimal Debian root filesystem and import it as ``ref``."""
    suite = _suite_of(ref)
    tool = shutil.which("debootstrap")
    if tool is None or os.geteuid() != 0:
        raise BaseImageUnavailable(
            f"cannot make the base image {ref}: no registry answers and "
            + ("debootstrap is not installed" if tool is None else "debootstrap needs root"),
            why="every fluffy image is built FROM a Debian base, which must come from a "
            "registry or be built here",
            fix="Run `scripts/setup` as root (it installs debootstrap), or load the image "
            f"yourself: `docker load < {suite}-slim.tar`, or set FLUFFY_BASE_IMAGE to an "
            "image you have.",
        )
    mirror = os.environ.get("FLUFFY_DEBIAN_MIRROR", DEFAULT_MIRROR)
    work = cache_dir() / "rootfs"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix=f"{suite}-") as tmp:
        root = Path(tmp, "root")
        log(f"debootstrap --variant=minbase {suite} (about 30 s to a few minutes)")
        proc = subprocess.run(
            [tool, "--variant=minbase", suite, str(root), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BaseImageUnavailable(
                f"debootstrap of {suite} failed with status {proc.returncode}",
                why=(proc.stdout + proc.stderr).strip()[-1500:],
                fix=f"Check that {mirror} is reachable (or set FLUFFY_DEBIAN_MIRROR), then retry.",
            )
        for rel in _PRUNE:
            target = root / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    elif child.name != "lock":
                        child.unlink()
        archive = Path(tmp, "rootfs.tar")
        log("packing the root filesystem")
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."], check=True
        )
        log(f"importing it as {ref}")
        ImageStore(engine).import_rootfs(archive, ref, source=f"debootstrap {suite} {mirror}")
