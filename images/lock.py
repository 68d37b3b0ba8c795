"""Regenerate the images' pinned locks: ``python -m fluffy.images.lock``.

Each ``requirements/<name>.in`` lists what an image needs; the lock pins the whole
resolved set (``name==version``) for CPython 3.11 on manylinux, resolved by pip itself
(``pip install --dry-run --report``).  Locks are committed: images are reproducible and
their content hash changes only when a lock does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from fluffy.images.spec import IMAGE_PYTHON, REQUIREMENTS_DIR
from fluffy.images.wheelhouse import target_args

HEADER = (
    "# Pinned by `python -m fluffy.images.lock` from {src} for CPython {py}, manylinux.\n"
    "# Do not edit: change {src} and run the command again.\n"
)


def resolve(requirements_in: Path, arch: str = "x86_64") -> list[tuple[str, str]]:
    """(name, version) of every package pip would install for ``requirements_in``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        cmd = [
            sys.executable,
            "-P",  # never the current folder's modules (a project's own `pip/`)
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report),
            *target_args(arch),
            "--target",
            str(Path(tmp, "target")),
            "--requirement",
            str(requirements_in),
        ]
        subprocess.run(cmd, check=True)
        data = json.loads(report.read_text())
    pins = {
        (item["metadata"]["name"].lower().replace("_", "-"), item["metadata"]["version"])
        for item in data["install"]
    }
    return sorted(pins)


def render(requirements_in: Path, pins: list[tuple[str, str]]) -> str:
    body = "".join(f"{name}=={version}\n" for name, version in pins)
    return HEADER.format(src=requirements_in.name, py=IMAGE_PYTHON) + body


def main() -> int:
    for source in sorted(REQUIREMENTS_DIR.glob("*.in")):
        lock = source.with_suffix(".lock")
        lock.write_text(render(source, resolve(source)))
        print(f"wrote {lock}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
