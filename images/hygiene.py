"""Stray fluffy images: what a build left behind that carries fluffy's labels.

The kernel takes an image only by an exact tag (``fluffy/<name>:<content hash>`` equal to
the image's own hash label; :func:`fluffy.kernel.tools.sandbox.sandboxes.exact_tags`), so a stray
can no longer be mistaken for a sandbox image; it still costs disk and confuses a person
reading ``docker images``.  A stray is

* an untagged image with a fluffy label (a failed build's last step, an image whose tag
  moved on): the engine lists it as ``<none>:<none>``;
* a tagged image with a fluffy label whose tag is not one fluffy makes for it (the
  environment naming before project-scoped repositories, a tag added by hand, a build
  step image left by a crashed ``fluffy env build``).

``fluffy doctor`` names them; ``fluffy images prune`` removes them.  It also removes an
*orphaned* environment: a project's environment image whose project folder (its
``org.fluffy.project-path`` label) no longer exists on this machine.  Such an image is
fluffy's own and well tagged, so never a stray, but nothing can use it again: a clone
deleted, a temporary folder gone (every test suite run leaves dozens).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.errors import EngineError
from fluffy.images.spec import (
    ENV_IMAGE_NAME,
    IMAGES,
    LABEL_HASH,
    LABEL_IMAGE,
    LABEL_PROJECT,
    LABEL_SITE,
    build_site,
)
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore

_HEX = r"[0-9a-f]{12,64}"
#: name label -> the tags fluffy gives such an image (besides fluffy/<name>:<hash label>)
_OTHER_TAGS = {
    "project-env": re.compile(rf"^fluffy/env-[0-9a-f]{{12}}:{_HEX}$"),
    "mcp-server": re.compile(rf"^fluffy/mcp-server:{_HEX}$"),
}
_NONE = ("<none>:<none>", "<none>")


@dataclass(frozen=True)
class Stray:
    image_id: str
    tags: tuple[str, ...]  # the tags that are not fluffy's (empty: untagged)
    name: str  # its org.fluffy.image label
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.image_id[:19], "tags": list(self.tags), "name": self.name,
                "why": self.why}  # fmt: skip


def _bare(tag: str) -> str:
    return tag.removeprefix("docker.io/").removeprefix("localhost/")


def _fluffys(tag: str, name: str, labels: dict[str, Any]) -> bool:
    bare = _bare(tag)
    if name in _OTHER_TAGS:
        return bool(_OTHER_TAGS[name].match(bare))
    digest = labels.get(LABEL_HASH)
    own = {spec.name for spec in IMAGES}
    return name in own and isinstance(digest, str) and bare == f"fluffy/{name}:{digest}"


def find_strays(engine: Engine) -> list[Stray]:
    """Every stray fluffy image on ``engine`` (see the module docstring)."""
    strays: list[Stray] = []
    for image in ImageStore(engine).list_by_label(LABEL_IMAGE):
        labels = image.get("Labels") or {}
        name = str(labels.get(LABEL_IMAGE) or "")
        tags = [t for t in image.get("RepoTags") or [] if isinstance(t, str) and t not in _NONE]
        if not tags:
            why = "untagged: a build step or an image whose tag moved on"
            strays.append(Stray(str(image.get("Id", "")), (), name, why))
            continue
        foreign = tuple(t for t in tags if not _fluffys(t, name, labels))
        if foreign:
            why = f"tagged {', '.join(foreign)}, which is not a tag fluffy gives a {name!r} image"
            strays.append(Stray(str(image.get("Id", "")), foreign, name, why))
    return strays


def _gone(folder: str) -> bool:
    """Whether ``folder`` is known not to exist (a folder we may not read is not gone)."""
    path = Path(folder)
    if not path.is_absolute():
        return False
    try:
        path.stat()
    except OSError as exc:
        return exc.errno in (errno.ENOENT, errno.ENOTDIR)
    except ValueError:  # a NUL in the label: not a path of this host
        return False
    return False


def find_orphans(engine: Engine) -> list[Stray]:
    """Every environment image on ``engine`` whose project folder no longer exists, among
    those built here (:func:`build_site`: where the folder's absence means something).
    Only fluffy's own tags of it are named (an image built FROM it carries its labels)."""
    site = build_site()
    if site is None:
        return []
    orphans: list[Stray] = []
    for image in ImageStore(engine).list_by_label(f"{LABEL_SITE}={site}"):
        labels = image.get("Labels") or {}
        folder = labels.get(LABEL_PROJECT)
        if labels.get(LABEL_IMAGE) != ENV_IMAGE_NAME or not isinstance(folder, str):
            continue
        tags = tuple(
            t for t in image.get("RepoTags") or []
            if isinstance(t, str) and _fluffys(t, ENV_IMAGE_NAME, labels)
        )  # fmt: skip
        if not tags or not _gone(folder):
            continue
        why = f"the environment of {folder}, which no longer exists"
        orphans.append(Stray(str(image.get("Id", "")), tags, ENV_IMAGE_NAME, why))
    return orphans


def remove_strays(engine: Engine) -> list[str]:
    """Remove every stray (untagged images by id, foreign tags by name); what was removed.
    An image still used by a container is left (the engine refuses) and not reported."""
    return _remove(engine, find_strays(engine))


def remove_orphans(engine: Engine) -> list[str]:
    """Remove every orphaned environment (:func:`find_orphans`); what was removed.  One
    still used by a container is left."""
    return _remove(engine, find_orphans(engine))


def _remove(engine: Engine, found: list[Stray]) -> list[str]:
    store = ImageStore(engine)
    removed: list[str] = []
    for stray in found:
        for ref in stray.tags or (stray.image_id,):
            try:
                store.remove(ref)
            except EngineError:
                continue
            removed.append(ref if stray.tags else f"<untagged {stray.image_id[:19]}>")
    return removed
