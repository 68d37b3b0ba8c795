"""The kernel's container manager: opened on first use, sibling sandboxes, orphans removed.

In L1 the kernel sees the project, its state and its socket folder at /fluffy/...; the
engine resolves bind mounts on the *host*, so every path handed to it is translated
with the FLUFFY_HOST_* variables bootstrap passes in (sandboxes are siblings of L1,
never nested).  Every sandbox carries the project's label; at start-up the kernel
removes the sandboxes of its project that an earlier (killed) kernel left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fluffy.errors import FluffyError, ImageNotFound
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.containers.config import LABEL_HASH, LABEL_IMAGE, TEMPLATE_IMAGES
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.containers.manager import ContainerManager, Observer

log = logging.getLogger("fluffy.kernel.sandboxes")

INSIDE = Path("/fluffy")
HOST_VARS = {
    "project": "FLUFFY_HOST_PROJECT",
    "state": "FLUFFY_HOST_STATE",
    "run": "FLUFFY_HOST_RUN",
}


def host_path_mapper(
    env: Mapping[str, str], project: Path | None, state_dir: Path
) -> Callable[[Path], Path]:
    """kernel path -> the host path the engine must see (identity outside L1)."""
    pairs: list[tuple[Path, Path]] = []
    kernel_paths = {"project": project, "state": state_dir, "run": None}
    for name, var in HOST_VARS.items():
        host = env.get(var)
        inside = kernel_paths.get(name) or INSIDE / name
        if host:
            pairs.append((Path(inside), Path(host)))

    def translate(path: Path) -> Path:
        for inside, host in pairs:
            with contextlib.suppress(ValueError):
                return host / path.relative_to(inside)
        return path

    return translate


def engine_env(env: Mapping[str, str]) -> dict[str, str]:
    """L1's FLUFFY_ENGINE / FLUFFY_ENGINE_SOCKET as the variables engine.connect reads."""
    out = dict(env)
    kind, socket = env.get("FLUFFY_ENGINE"), env.get("FLUFFY_ENGINE_SOCKET")
    if kind and socket and not env.get("FLUFFY_RUNTIME"):
        out["FLUFFY_RUNTIME"] = kind
        out["CONTAINER_HOST" if kind == "podman" else "DOCKER_HOST"] = f"unix://{socket}"
    return out


#: Chooses each template's image on ``engine`` (template -> image ref).  On a host with
#: fluffy's image sources, the caller passes images/templates.py's ``template_images``,
#: which refuses images that are not current for the sources (content hashes recomputed).
ImageChooser = Callable[[Engine], dict[str, str]]


#: The sandbox images the host named for this kernel (``<state>/images.json``: name -> ref),
#: written by the CLI from its image manifest as it starts the kernel.
PINNED_IMAGES = "images.json"


def pinned_images(state_dir: Path) -> dict[str, str]:
    """The host's choice of sandbox images ({} when it named none)."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        data = json.loads((state_dir / PINNED_IMAGES).read_text())
        return {str(k): str(v) for k, v in data.items()}
    return {}


def exact_tags(image: dict[str, Any], name: str) -> list[str]:
    """The tags of a listed image that name it exactly: ``fluffy/<name>:<content hash>``
    where the hash is the image's own content-hash label.  An untagged image (Docker lists
    ``<none>:<none>``) or a step of another build that inherited the label never does."""
    labels = image.get("Labels") or {}
    digest = labels.get(LABEL_HASH) if labels.get(LABEL_IMAGE) == name else None
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{12,64}", digest):
        return []
    want = f"fluffy/{name}:{digest}"
    return [t for t in image.get("RepoTags") or []
            if isinstance(t, str) and t.removeprefix("docker.io/").removeprefix("localhost/")
            == want]  # fmt: skip


def sandbox_images(
    engine: Engine,
    env: Mapping[str, str],
    chooser: ImageChooser | None = None,
    pinned: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Sandbox template -> image ref: ``chooser``'s, or else (in L1, where the kernel
    image carries no Dockerfiles) the refs named by FLUFFY_IMAGES or ``pinned`` (name ->
    ref: the host's image manifest, :data:`PINNED_IMAGES`), or the newest image of each
    name whose tag is exactly its content hash (:func:`exact_tags`).
    """
    from fluffy.kernel.containers.images import ImageStore

    if chooser is not None:
        return chooser(engine)
    given: dict[str, str] = dict(pinned or {})
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        given.update(
            {str(k): str(v) for k, v in json.loads(env.get("FLUFFY_IMAGES") or "{}").items()}
        )
    store = ImageStore(engine)
    images: dict[str, str] = {}
    for template, name in TEMPLATE_IMAGES.items():
        if name not in given:
            found = [(i, t) for i in store.list_by_label(f"{LABEL_IMAGE}={name}")
                     for t in exact_tags(i, name)]  # fmt: skip
            if not found:
                raise ImageNotFound(
                    f"no {name} image for the {template} sandbox",
                    why="only an image tagged with its own content hash is used",
                    fix="Run `fluffy images build` on the host.",
                )
            given[name] = max(found, key=lambda pair: int(pair[0].get("Created") or 0))[1]
        images[template] = given[name]
    return images


class KernelSandboxes:
    """Opens the manager once (engine connection, current images), thread-safe."""

    def __init__(
        self,
        state_dir: Path,
        project: Path | None,
        env: Mapping[str, str] | None = None,
        images: ImageChooser | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.images = images
        self.project = project
        self.env = dict(os.environ if env is None else env)
        self.instance = uuid.uuid4().hex[:12]
        self._manager: ContainerManager | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.orphans_removed: list[str] = []
        self.error: FluffyError | None = None
        #: told of every sandbox's life (the kernel audits it: :func:`audit_observer`)
        self.observer: Observer | None = None

    @property
    def project_label(self) -> str:
        return self.env.get("FLUFFY_PROJECT_ID") or str(self.project or self.state_dir)

    def manager(self) -> ContainerManager:
        with self._lock:
            if self._manager is None:
                from fluffy.kernel.containers.engine import connect
                from fluffy.kernel.containers.factory import open_runtime

                engine = connect(engine_env(self.env), timeout=30)
                self._manager = ContainerManager(
                    open_runtime(engine, compat=bool(self.env.get("FLUFFY_ENGINE_GATE"))),
                    sandbox_images(engine, self.env, self.images, pinned_images(self.state_dir)),
                    session_id=self.instance,
                    root=self.state_dir / "sandboxes",
                    host_path=host_path_mapper(self.env, self.project, self.state_dir),
                    labels={"org.fluffy.project": self.project_label},
                )
                self._manager.observer = self.observer
            return self._manager

    def remove_orphans(self) -> list[str]:
        """Remove this project's sandboxes that no running kernel owns (start-up)."""
        report = self.manager().remove_strays()
        for error in report.errors:
            log.warning("cannot remove an orphan sandbox: %s", error)
        self.orphans_removed = report.containers
        if self._closed:  # the kernel stopped meanwhile (close() did not wait)
            self.close()
        return report.containers

    def close(self) -> None:
        """Destroy what is active.  While the start-up sweep is still opening the
        manager (connecting, finding images) there is nothing to destroy yet: a stop
        does not wait for it, and the sweep closes what it opened (or, if the process
        ends first, the next kernel removes it as a crashed one's)."""
        self._closed = True
        if self._manager is None and self._lock.locked():
            return  # being opened: the sweep closes it when it is done
        with self._lock:  # (opened: every other holder returns at once)
            if self._manager is not None:
                self._manager.close()


def audit_observer(audit: AuditLog, loop: asyncio.AbstractEventLoop) -> Observer:
    """Record each sandbox's ``sandbox_created`` / ``sandbox_failed`` /
    ``sandbox_destroyed`` entry (the manager calls it from worker threads; the entry is
    handed to the kernel's loop, where the audit log is written)."""

    def observe(kind: str, sandbox: Sandbox, details: dict[str, str]) -> None:
        reason = f": {details.get('reason')}" if kind == "failed" else ""
        event = Event(
            f"sandbox_{kind}",
            caller="kernel",
            sandbox_id=sandbox.sandbox_id,
            input_summary=f"{sandbox.template} sandbox {sandbox.name} {kind}{reason}",
            metadata=details,
        )
        loop.call_soon_threadsafe(audit.record_nowait, event)

    return observe
