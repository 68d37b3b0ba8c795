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

``fluffy doctor`` names them; ``fluffy images prune`` removes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fluffy.errors import EngineError
from fluffy.images.spec import IMAGES, LABEL_HASH, LABEL_IMAGE
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


def remove_strays(engine: Engine) -> list[str]:
    """Remove every stray (untagged images by id, foreign tags by name); what was removed.
    An image still used by a container is left (the engine refuses) and not reported."""
    store = ImageStore(engine)
    removed: list[str] = []
    for stray in find_strays(engine):
        for ref in stray.tags or (stray.image_id,):
            try:
                store.remove(ref)
            except EngineError:
                continue
            removed.append(ref if stray.tags else f"<untagged {stray.image_id[:19]}>")
    return removed
