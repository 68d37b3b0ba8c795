"""What fluffy's images are and how they relate."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fluffy.kernel.containers.config import LABEL_HASH as LABEL_HASH
from fluffy.kernel.containers.config import LABEL_IMAGE as LABEL_IMAGE
from fluffy.kernel.containers.config import TEMPLATE_IMAGES

#: The design's base.  Override with FLUFFY_BASE_IMAGE (e.g. a local mirror's copy).
DEFAULT_BASE_IMAGE = "debian:bookworm-slim"
#: The Python in the base image; wheels are downloaded for it (bookworm ships 3.11).
IMAGE_PYTHON = "3.11"
#: Repository prefix of every image fluffy builds: fluffy/<name>:<content hash>.
REPOSITORY_PREFIX = "fluffy"
#: What L2 images carry of fluffy: the in-sandbox side only, never the kernel.
SANDBOX_PARTS = (
    "__init__.py",
    "_version.py",
    "py.typed",
    "errors",
    "ipc",
    "sandboxes",
    "seccomp",
    "plugins",
    "safetext.py",  # container.run shows output as the CLI shows text
    "junit.py",  # the test tool counts a report as the kernel reads it
    "pathnames.py",  # and names files as the kernel does (junit.py, the plugin SDK's view)
    "merge3.py",  # git.commit replays a session's changes as the merge wrote them
)
#: Labels every fluffy image carries (LABEL_IMAGE, LABEL_HASH: the garbage collector and
#: doctor find them so); the kernel finds a sandbox's image by both, so they are declared
#: in kernel/containers/config.py.
#: A project environment's name label and the label naming its project folder (on the host).
ENV_IMAGE_NAME = "project-env"
LABEL_PROJECT = "org.fluffy.project-path"
#: Where that path was seen: the machine and the mount namespace of the build
#: (:func:`build_site`); only there does a missing folder mean a deleted project.
LABEL_SITE = "org.fluffy.build-site"


def build_site() -> str | None:
    """This process's machine and mount namespace, digested (None: not known here).

    Two processes that share an engine but see other files (a container given the
    engine's socket, a remote DOCKER_HOST) get different sites."""
    try:
        machine = Path("/etc/machine-id").read_text(encoding="utf-8").strip()
        namespace = Path("/proc/self/ns/mnt").stat().st_ino
    except (OSError, ValueError):
        return None
    if not machine:
        return None
    return hashlib.sha256(f"{machine}:{namespace}".encode()).hexdigest()[:16]


def site_label() -> dict[str, str]:
    """LABEL_SITE for an environment build here (none when the site is not known)."""
    site = build_site()
    return {} if site is None else {LABEL_SITE: site}


IMAGES_DIR = Path(__file__).resolve().parent
#: The install stage every image that carries fluffy shares (relative to the source dir).
INSTALL_STAGE = Path("stages") / "install.Dockerfile"
REQUIREMENTS_DIR = IMAGES_DIR / "requirements"
#: Node for JavaScript projects' environments (images/nodeenv.py): a wheel, not an image.
NODE_LOCK = REQUIREMENTS_DIR / "node-runtime.lock"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its Dockerfile folder, parent, Python lock and sandbox templates."""

    name: str
    description: str
    parent: str | None = None
    lock: str | None = None
    with_fluffy: bool = False
    #: Parts of the fluffy package the image carries (paths under fluffy/); () = all.
    fluffy_parts: tuple[str, ...] = ()
    templates: tuple[str, ...] = field(default_factory=tuple)
    #: Folder holding ``<name>/Dockerfile`` and ``requirements/<lock>.lock``.
    source_dir: Path = IMAGES_DIR

    @property
    def repository(self) -> str:
        return f"{REPOSITORY_PREFIX}/{self.name}"

    @property
    def directory(self) -> Path:
        return self.source_dir / self.name

    @property
    def lock_path(self) -> Path | None:
        return self.source_dir / "requirements" / f"{self.lock}.lock" if self.lock else None

    @property
    def install_stage(self) -> Path | None:
        """The shared stage put in front of the image's Dockerfile (images that carry
        fluffy: their Dockerfile is the final stage only), or None."""
        return self.source_dir / INSTALL_STAGE if self.with_fluffy else None


def _served_by(name: str) -> tuple[str, ...]:
    """The sandbox templates that run the image ``name`` (the kernel's TEMPLATE_IMAGES)."""
    return tuple(t for t, image in TEMPLATE_IMAGES.items() if image == name)


IMAGES: tuple[ImageSpec, ...] = (
    ImageSpec(
        name="python-base",
        description="Debian + python3 + an empty venv + the non-root user 10001 (shared parent)",
    ),
    ImageSpec(
        name="kernel",
        description="L1 kernel: fluffy and its runtime dependencies, non-root",
        parent="python-base",
        lock="kernel",
        with_fluffy=True,
    ),
    ImageSpec(
        name="ai-provider",
        description="L2 sandbox for the AI provider adapters (httpx through the kernel proxy)",
        parent="python-base",
        lock="ai-provider",
        with_fluffy=True,
        fluffy_parts=SANDBOX_PARTS,
        templates=_served_by("ai-provider"),
    ),
    ImageSpec(
        name="code-executor",
        description="L2 sandbox for tools and tests: git, pytest, coverage",
        parent="python-base",
        lock="code-executor",
        with_fluffy=True,
        fluffy_parts=SANDBOX_PARTS,
        # an MCP server's own image is built FROM this one (images/mcpenv.py)
        templates=_served_by("code-executor"),
    ),
    ImageSpec(
        name="policy-sandbox",
        description="L2 sandbox for Python policy extension rules",
        parent="python-base",
        lock="policy-sandbox",
        with_fluffy=True,
        fluffy_parts=SANDBOX_PARTS,
        templates=_served_by("policy-sandbox"),
    ),
)


def get_spec(name: str, specs: Sequence[ImageSpec] = IMAGES) -> ImageSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    from fluffy.errors import ConfigError

    raise ConfigError(
        f"unknown image {name!r}",
        why="fluffy builds only its own images",
        fix="Choose one of: " + ", ".join(spec.name for spec in specs),
    )


def spec_for_template(template: str) -> ImageSpec:
    """The image that serves a sandbox template (integration-test shares code-executor)."""
    for spec in IMAGES:
        if template in spec.templates:
            return spec
    from fluffy.errors import ConfigError

    raise ConfigError(
        f"no image serves the sandbox template {template!r}",
        fix="Use one of: " + ", ".join(t for s in IMAGES for t in s.templates),
        why="each sandbox template is served by one of fluffy's images",
    )


def build_order(
    names: list[str] | None = None, specs: Sequence[ImageSpec] = IMAGES
) -> list[ImageSpec]:
    """The requested images plus their parents, parents first."""
    wanted = {spec.name for spec in specs} if not names else set(names)
    for name in list(wanted):
        spec = get_spec(name, specs)
        while spec.parent:
            wanted.add(spec.parent)
            spec = get_spec(spec.parent, specs)
    return [spec for spec in specs if spec.name in wanted]
