"""Files copied out of an image the repository's code helped make, bounded.

An environment image and an sdist's build image hold what the repository's own build
wrote (the build's report, a wheel): read through a container that is created and never
started, as a tar archive of at most ``limit`` bytes, unpacked with tarfile's ``data``
filter (no absolute paths, no links out, no devices).
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.errors import engine_call

#: More than any report or wheel fluffy reads (a wheel from .fluffy/wheels/: 256 MiB).
MAX_COPY_BYTES = 512 * 1024 * 1024


def copy_from_image(
    engine: Engine, image: str, path: str, dest: Path, *, limit: int = MAX_COPY_BYTES
) -> None:
    """Unpack ``path`` of ``image`` (an id or a reference) into ``dest``."""
    api = engine.client.api
    with engine_call(f"read {path} of {image}"):
        container = api.create_container(image, command=["true"], network_disabled=True)
    try:
        with tempfile.TemporaryFile() as archive:
            with engine_call(f"copy {path} out of {image}"):
                stream, _ = api.get_archive(container["Id"], path)
                size = 0
                for chunk in stream:
                    size += len(chunk)
                    if size > limit:
                        raise EnvironmentFailed(
                            f"{path} in {image} is larger than {limit // 2**20} MiB",
                            why="what a project's build leaves for fluffy to read is small; "
                            "this one is not, so it is not read",
                            fix="Look at what the project's build writes; pin a release "
                            "with a wheel, or build one yourself into .fluffy/wheels/.",
                        )
                    archive.write(chunk)
            archive.seek(0)
            try:
                with tarfile.open(fileobj=archive) as tar:
                    tar.extractall(dest, filter="data")
            except tarfile.TarError as exc:  # a link or a path out, a device, a bad archive
                raise EnvironmentFailed(
                    f"{path} in {image} holds what fluffy does not unpack",
                    why=str(exc)[:300],
                    fix="Look at what the project's build writes; build the environment "
                    "again (`fluffy env build`) once it writes plain files.",
                ) from exc
    finally:
        with engine_call("remove the container the files were read from"):
            api.remove_container(container["Id"], force=True)
