"""Build fluffy's images, skipping every image whose content-hash tag already exists.

``build_images`` is what ``fluffy images build`` and ``scripts/setup`` run.  For each
image, parents first: compute the tag from the inputs (no engine work but one
inspect), and only if that tag is missing stage a build context (Dockerfile folder,
the shared install stage in front of the Dockerfile, lock, wheels, fluffy's source) and
build it.  The result is recorded in
``$FLUFFY_HOME/state/images.json`` for the kernel and ``fluffy doctor``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from fluffy.errors import FluffyError, ImageNotFound
from fluffy.images.base import base_image_ref, ensure_base_image
from fluffy.images.hashing import HASH_SCHEME, content_hash, context_files
from fluffy.images.spec import (
    IMAGES,
    LABEL_HASH,
    LABEL_IMAGE,
    NODE_LOCK,
    REPOSITORY_PREFIX,
    ImageSpec,
    build_order,
)
from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore
from fluffy.paths import state_dir


class Reporter(Protocol):
    """How the builder tells its caller what it is doing."""

    def message(self, text: str) -> None: ...

    def image_started(self, spec: ImageSpec, ref: str) -> None: ...

    def step(self, spec: ImageSpec, index: int, total: int, text: str) -> None: ...

    def line(self, spec: ImageSpec, text: str) -> None: ...

    def image_done(self, status: ImageStatus) -> None: ...


@dataclass
class ImageStatus:
    """One image's outcome: present already, built now, or missing (plan only)."""

    name: str
    ref: str
    content_hash: str
    image_id: str
    state: str  # "current" | "built" | "missing" | "stale"
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class SilentReporter:
    def message(self, text: str) -> None:
        pass

    def image_started(self, spec: ImageSpec, ref: str) -> None:
        pass

    def step(self, spec: ImageSpec, index: int, total: int, text: str) -> None:
        pass

    def line(self, spec: ImageSpec, text: str) -> None:
        pass

    def image_done(self, status: ImageStatus) -> None:
        pass


def manifest_path() -> Path:
    return state_dir() / "images.json"


def _tagged(
    order: Sequence[ImageSpec], base_id: str, arch: str
) -> Iterator[tuple[ImageSpec, str, str, str | None]]:
    """(spec, tag, ref, parent ref) for each image, parents first: the one tag rule."""
    refs: dict[str, str] = {}
    for spec in order:
        parent_ref = refs[spec.parent] if spec.parent else None
        identity = parent_ref or f"{base_image_ref()}@{base_id}"
        tag = content_hash(spec, parent_identity=identity, arch=arch)
        ref = refs[spec.name] = f"{spec.repository}:{tag}"
        yield spec, tag, ref, parent_ref


def plan_images(
    engine: Engine, names: list[str] | None = None, *, specs: Sequence[ImageSpec] = IMAGES
) -> list[ImageStatus]:
    """Which images are current, stale or missing, without building anything.

    Raises :class:`ImageNotFound` when the base image itself is missing.
    """
    store = ImageStore(engine)
    base_id = store.image_id(base_image_ref())
    if base_id is None:
        raise ImageNotFound(
            f"the base image {base_image_ref()} is not present",
            why="fluffy's images are built FROM it; it is pulled, or made with debootstrap",
        )
    result: list[ImageStatus] = []
    order = build_order(names, specs)
    for spec, tag, ref, _ in _tagged(order, base_id, linux_arch(engine.info.arch)):
        image_id = store.image_id(ref)
        state = "current" if image_id else "missing"
        if image_id is None and store.list_by_label(f"{LABEL_IMAGE}={spec.name}"):
            state = "stale"
        result.append(ImageStatus(spec.name, ref, tag, image_id or "", state))
    return result


def dockerfile(spec: ImageSpec) -> str:
    """The Dockerfile ``spec`` is built from: its own, behind the shared install stage
    (images/stages/install.Dockerfile) if it carries fluffy.  Both are hashed."""
    own = (spec.directory / "Dockerfile").read_text()
    if spec.install_stage is None:
        return own
    return spec.install_stage.read_text().rstrip("\n") + "\n\n" + own


def _stage_context(spec: ImageSpec, dest: Path, arch: str, reporter: Reporter) -> None:
    for rel, src in context_files(spec).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    (dest / "Dockerfile").write_text(dockerfile(spec))
    if spec.lock_path is not None:
        wheels = ensure_wheelhouse(spec.lock_path, arch, reporter.message)
        (dest / "wheels").mkdir()
        for wheel in wheels.glob("*.whl"):
            try:
                os.link(wheel, dest / "wheels" / wheel.name)
            except OSError:
                shutil.copy2(wheel, dest / "wheels" / wheel.name)


def build_images(
    engine: Engine,
    names: list[str] | None = None,
    *,
    force: bool = False,
    reporter: Reporter | None = None,
    specs: Sequence[ImageSpec] = IMAGES,
) -> list[ImageStatus]:
    """Make every requested image (and its parents) current; return their status."""
    reporter = reporter or SilentReporter()
    store = ImageStore(engine)
    base_id = ensure_base_image(engine, reporter.message)
    arch = linux_arch(engine.info.arch)
    if names is None:  # Node for JavaScript projects' environments: fetched once, up front
        ensure_wheelhouse(NODE_LOCK, arch, reporter.message)
    results: list[ImageStatus] = []
    built_any = False
    for spec, tag, ref, parent_ref in _tagged(build_order(names, specs), base_id, arch):
        image_id = None if force else store.image_id(ref)
        if image_id:
            status = ImageStatus(spec.name, ref, tag, image_id, "current")
            reporter.image_done(status)
            results.append(status)
            continue
        reporter.image_started(spec, ref)
        started = time.monotonic()
        buildargs = {"PARENT_IMAGE": parent_ref} if parent_ref else {"BASE_IMAGE": base_image_ref()}
        labels = {LABEL_IMAGE: spec.name, LABEL_HASH: tag, "org.fluffy.hash-scheme": HASH_SCHEME}
        with tempfile.TemporaryDirectory(prefix=f"fluffy-build-{spec.name}-") as tmp:
            context = Path(tmp)
            _stage_context(spec, context, arch, reporter)
            try:
                image_id = store.build(
                    context,
                    ref,
                    buildargs=buildargs,
                    labels=labels,
                    on_line=functools.partial(reporter.line, spec),
                    on_step=functools.partial(reporter.step, spec),
                )
            except FluffyError as exc:
                store.prune_dangling(LABEL_IMAGE)  # the failed build's steps
                raise exc.with_context(f"image {spec.name}") from exc.__cause__
        built_any = True
        status = ImageStatus(
            spec.name, ref, tag, image_id, "built", round(time.monotonic() - started, 1)
        )
        reporter.image_done(status)
        results.append(status)
    if built_any:
        store.prune_dangling(LABEL_IMAGE)  # the untagged "install" stages of multi-stage builds
    write_manifest(engine, results)
    return results


def prune_images(engine: Engine, *, specs: Sequence[ImageSpec] = IMAGES) -> list[str]:
    """Remove fluffy images that are not current (old content hashes) and stray ones
    (:mod:`fluffy.images.hygiene`), and the environments of projects that no longer exist;
    return what was removed."""
    from fluffy.images.hygiene import remove_orphans, remove_strays

    current = {status.ref for status in plan_images(engine, specs=specs)}
    store = ImageStore(engine)
    removed: list[str] = []
    ours = {spec.name for spec in specs}  # an environment goes with its project (orphans)
    for image in store.list_by_label(LABEL_IMAGE):
        if (image.get("Labels") or {}).get(LABEL_IMAGE) not in ours:
            continue
        for ref in image.get("RepoTags") or []:
            if ref.startswith(f"{REPOSITORY_PREFIX}/") and ref not in current:
                store.remove(ref)
                removed.append(ref)
    store.prune_dangling(LABEL_IMAGE, everyone=True)
    return removed + remove_strays(engine) + remove_orphans(engine)


def write_manifest(engine: Engine, results: list[ImageStatus]) -> None:
    """Record the current tags (merged with what an earlier, partial build recorded)."""
    path = manifest_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
    data.setdefault("images", {})
    data["engine"] = engine.name
    data["engine_url"] = engine.info.url
    for status in results:
        data["images"][status.name] = {
            "ref": status.ref,
            "id": status.image_id,
            "content_hash": status.content_hash,
        }
    # a name of its own: two builds at once (two test workers) each replace the file whole
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".images.", suffix=".tmp")
    with os.fdopen(fd, "w") as tmp:
        tmp.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    written = Path(name)
    written.chmod(0o644)
    written.replace(path)
