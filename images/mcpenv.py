"""An MCP server's image: its packages installed offline, its folder copied in.

Like a project's test environment (ADR-029): the host downloads wheels only (`pip
download --only-binary=:all:` for the image's platform; no package code runs on the
host), and an image ``FROM`` fluffy's code-executor image installs them with `pip
--no-index` into a venv of the server's own (``/opt/mcp/venv``, first on the server's
PATH) during a build whose network is off.  A ``--path`` folder is copied to
``/opt/mcp/server`` (plain files only), read-only like the rest of the image's root.
The image is named by a key over its inputs (the base image, every wheel's hash, the
folder's files, this scheme): adding the same server again is a lookup.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from fluffy.errors import FluffyError, McpServerInvalid, PackageUnavailable
from fluffy.images.envdownload import pip_download
from fluffy.images.sdists import STAGE_LABELS
from fluffy.images.spec import LABEL_IMAGE
from fluffy.images.wheelhouse import linux_arch
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore
from fluffy.kernel.project.reqlines import Refusal, requirement_line

MCP_REPOSITORY = "fluffy/mcp-server"
MCP_IMAGE_NAME = "mcp-server"
SCHEME = "mcp-image-2"  # 2: build steps labelled build-stage
SERVER_DIR = "/opt/mcp/server"
MAX_FOLDER_BYTES = 64 * 1024 * 1024
MAX_FOLDER_FILES = 5000
SKIPPED = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache"})
DOCKERFILE = f"""\
# An MCP server's sandbox image (fluffy mcp add): FROM fluffy's code-executor image, the
# server's packages installed offline into its own venv from wheels the host downloaded.
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
{STAGE_LABELS}
USER root
COPY . /build/
RUN python3 -m venv /opt/mcp/venv \\
 && if [ -s /build/requirements.txt ]; then /opt/mcp/venv/bin/pip install --no-index \\
      --no-cache-dir --disable-pip-version-check --find-links /build/wheels \\
      --requirement /build/requirements.txt; fi \\
 && mkdir -p /opt/mcp/server && cp -R /build/server/. /opt/mcp/server/ \\
 && chmod -R a+rX,go-w /opt/mcp && rm -rf /build
USER 10001:10001
WORKDIR /opt/mcp/server
"""

Say = Callable[[str], None]


@dataclass
class ServerImage:
    image: str
    packages: dict[str, str] = field(default_factory=dict)
    built: bool = False


def _copy_folder(source: Path, dest: Path) -> str:
    """Copy the server's folder (plain files; links and specials refused); its digest."""
    if not source.is_dir():
        raise McpServerInvalid(
            f"--path {source} is not a folder",
            fix="Pass the folder that holds the server's code.",
        )
    digest = hashlib.sha256()
    total = count = 0
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part in SKIPPED for part in rel.parts):
            continue
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise McpServerInvalid(
                f"{path} is a link or a special file",
                why="a server's folder is copied into its image as plain files only",
                fix="Replace the link with the file it points to, or remove it.",
            )
        if path.is_dir():
            continue
        total += path.stat().st_size
        count += 1
        if total > MAX_FOLDER_BYTES or count > MAX_FOLDER_FILES:
            raise McpServerInvalid(
                f"--path {source} holds more than {MAX_FOLDER_BYTES // 2**20} MiB or "
                f"{MAX_FOLDER_FILES} files",
                fix="Point --path at the server's own code, not a whole checkout.",
            )
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        digest.update(f"{rel.as_posix()}\0".encode())
        digest.update(hashlib.sha256(target.read_bytes()).digest())
    return digest.hexdigest()


def _packages(wheels: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename:
            continue
        found[str(name)] = str(version)
    return found


def _fetch(pip: list[str], wheels: Path, arch: str) -> None:
    lines: list[str] = []
    for spec in pip:
        refused: list[Refusal] = []
        line = requirement_line(spec, "--pip", refused)
        if line is None:
            raise McpServerInvalid(
                f"--pip {spec!r} is not a package requirement",
                why="packages come from the index as wheels, named like `mcp-server-time` "
                "or `mcp-server-time==2026.10.19` (no options, URLs or paths)",
                fix="Name the package (and a version), or put the code in a folder and use --path.",
            )
        lines.append(line)
    try:
        missing = pip_download(lines, [], wheels, [], arch, "MCP server package")
        if missing is not None:
            raise PackageUnavailable(
                f"no wheel of {missing} for CPython 3.11 on Linux",
                why="an MCP server's packages are installed from wheels only",
            )
    except FluffyError as exc:
        raise McpServerInvalid(
            f"cannot install the server's packages: {exc.what}",
            why=exc.why,
            fix="Check the package names and versions (`pip download NAME` on this host); "
            "packages must have wheels for CPython 3.11 on Linux. Nothing was recorded.",
        ) from exc


def ensure_server_image(
    engine: Engine,
    base_image: str,
    *,
    pip: list[str],
    path: Path | None,
    say: Say = lambda _text: None,
    on_line: Callable[[str], None] = lambda _line: None,
) -> ServerImage:
    """The image for a server of these packages and this folder (built if missing)."""
    store = ImageStore(engine)
    base_id = store.image_id(base_image)
    if not base_id:
        raise McpServerInvalid(
            f"the base image {base_image} is missing",
            fix="Run `fluffy images build`, then add the server again.",
        )
    arch = linux_arch(engine.info.arch)
    with tempfile.TemporaryDirectory(prefix="fluffy-mcp-") as tmp:
        context = Path(tmp)
        wheels, server = context / "wheels", context / "server"
        wheels.mkdir()
        server.mkdir()
        if pip:
            say(f"downloading {', '.join(pip)} and what they need (host, wheels only)")
            _fetch(pip, wheels, arch)
        packages = _packages(wheels)
        folder = _copy_folder(path, server) if path is not None else ""
        key = hashlib.sha256(f"{SCHEME}\0{base_id}\0{folder}\0".encode())
        for wheel in sorted(wheels.glob("*.whl")):
            key.update(wheel.name.encode() + hashlib.sha256(wheel.read_bytes()).digest())
        image = f"{MCP_REPOSITORY}:{key.hexdigest()[:24]}"
        if store.image_id(image):
            return ServerImage(image, packages, built=False)
        pins = [f"{name}=={version}" for name, version in sorted(packages.items())]
        (context / "requirements.txt").write_text("".join(f"{p}\n" for p in pins))
        (context / "Dockerfile").write_text(DOCKERFILE)
        say(f"building {image} (offline)")
        try:
            store.build(
                context,
                image,
                buildargs={"BASE_IMAGE": base_image},
                labels={LABEL_IMAGE: MCP_IMAGE_NAME},
                on_line=on_line,
                on_step=lambda *_: None,
                network_mode="none",
            )
        except FluffyError as exc:
            raise McpServerInvalid(
                f"cannot build the server's image: {exc.what}",
                why=exc.why,
                fix="Check that the packages install together (`pip install` them in a "
                "fresh venv on this host). Nothing was recorded.",
            ) from exc
    return ServerImage(image, packages, built=True)
