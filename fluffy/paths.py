"""Where fluffy keeps things on the host.

``FLUFFY_HOME`` (default ``~/.fluffy``) holds the user's config, state and caches::

    $FLUFFY_HOME/config.yaml        user config (the design's configuration hierarchy)
    $FLUFFY_HOME/state/             databases, image manifest
    $FLUFFY_HOME/cache/wheelhouse/  wheels downloaded on the host for the images
    $FLUFFY_HOME/cache/rootfs/      debootstrap output for the offline base image
"""

from __future__ import annotations

import os
from pathlib import Path

#: The settings file's name, in fluffy's home (the user's) and a project's .fluffy/
CONFIG_NAME = "config.yaml"


def fluffy_home() -> Path:
    env = os.environ.get("FLUFFY_HOME")
    return Path(env).expanduser() if env else Path.home() / ".fluffy"


def user_config() -> Path:
    return fluffy_home() / CONFIG_NAME


def project_config(project: Path) -> Path:
    return project / ".fluffy" / CONFIG_NAME


def project_folder(project: Path) -> Path:
    """The project's ``.fluffy`` folder, to write in: refused (:class:`ConfigError`) when
    it is a link or not a folder, as a cloned repository can ship it pointing at a file
    of the person's elsewhere."""
    from fluffy.errors import ConfigError

    folder = project / ".fluffy"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ConfigError(
            f"{folder} is a link or not a folder; nothing was written",
            why="fluffy keeps the project's policy and settings in a .fluffy folder, and a "
            "repository can ship one that points at a file of yours elsewhere",
            fix="Look at what it is; move it away, then run the command again.",
        )
    return folder


def state_dir() -> Path:
    return fluffy_home() / "state"


def cache_dir() -> Path:
    return fluffy_home() / "cache"


def package_root() -> Path:
    """The directory of the ``fluffy`` package, symlinks resolved."""
    return Path(__file__).resolve().parent


def kernel_socket() -> Path:
    """The kernel's CLI socket when none is given (``$FLUFFY_HOME/run/kernel.sock``)."""
    return fluffy_home() / "run" / "kernel.sock"


def project_socket(project: str | Path) -> Path:
    """The CLI socket of ``project``'s kernel (started by `fluffy start` or a task)."""
    from fluffy.bootstrap.supervisor import paths

    return paths(fluffy_home(), str(project))["run"] / "kernel.sock"
