"""Wheels for the images, downloaded on the host.

HTTPS from inside a build container may not be trusted (docs/environment.md: the host's
CA is not the container's), so pip never runs against an index inside an image.
The host downloads the exact wheels a lock pins, for the image's platform (which is
not the host's on macOS), into a cache folder keyed by the lock and platform; the
Dockerfile installs them with ``pip install --no-index``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from fluffy.errors import WheelhouseError
from fluffy.images.spec import IMAGE_PYTHON
from fluffy.paths import cache_dir

_ARCH_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}
#: glibc of the base image (bookworm: 2.36); every manylinux tag up to it is accepted.
_GLIBC_MINOR = 36


def linux_arch(engine_arch: str) -> str:
    try:
        return _ARCH_ALIASES[engine_arch]
    except KeyError:
        raise WheelhouseError(
            f"unsupported image architecture {engine_arch!r}",
            why="fluffy's images are built for x86_64 or aarch64 Linux",
            fix="Use an engine on an x86_64 or arm64 machine.",
        ) from None


def platform_args(arch: str) -> list[str]:
    """pip's ``--platform`` options for a manylinux target (pip does not expand them)."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(_GLIBC_MINOR, 16, -1)]
    tags.append(f"manylinux2014_{arch}")
    if arch == "x86_64":
        tags += [f"manylinux_2_{minor}_{arch}" for minor in (12, 5)]
        tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    args = []
    for tag in tags:
        args += ["--platform", tag]
    return args


def target_args(arch: str) -> list[str]:
    version = IMAGE_PYTHON.replace(".", "")
    return [
        "--only-binary=:all:",
        *platform_args(arch),
        "--python-version",
        IMAGE_PYTHON,
        "--implementation",
        "cp",
        "--abi",
        f"cp{version}",
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]


def wheelhouse_dir(lock: Path, arch: str) -> Path:
    key = hashlib.sha256(lock.read_bytes() + f"|{arch}|{IMAGE_PYTHON}".encode()).hexdigest()
    return cache_dir() / "wheelhouse" / f"{lock.stem}-{key[:16]}"


def ensure_wheelhouse(
    lock: Path, arch: str, log: Callable[[str], None] = lambda _msg: None
) -> Path:
    """The folder holding every wheel ``lock`` pins for ``arch``; downloads if missing."""
    target = wheelhouse_dir(lock, arch)
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"downloading wheels for {lock.stem} ({arch}) on the host")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tmp-") as tmp:
        cmd = [
            sys.executable,
            "-P",  # never the current folder's modules (a project's own `pip/`)
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            *target_args(arch),
            "--dest",
            tmp,
            "--requirement",
            str(lock),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
        if proc.returncode != 0:
            raise WheelhouseError(
                f"cannot download the wheels pinned in {lock.name}",
                why=f"`pip download` exited {proc.returncode}: {proc.stderr.strip()[-1500:]}",
            )
        Path(tmp, ".complete").write_text(
            "\n".join(sorted(p.name for p in Path(tmp).iterdir())) + "\n"
        )
        if target.exists():
            shutil.rmtree(target)
        Path(tmp).rename(target)
        Path(tmp).mkdir()  # TemporaryDirectory cleans up the (now empty) path
    return target
