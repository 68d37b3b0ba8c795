"""``python3 -m fluffy.bootstrap run --project DIR``: supervise the project's L1 kernel.

Reads the environment (``FLUFFY_HOME``, ``FLUFFY_RUNTIME``, ``FLUFFY_KERNEL_IMAGE``) and
one config file, ``$FLUFFY_HOME/bootstrap.json``, without validating them (the kernel
validates); failures print one JSON object (code, what, why, fix) and exit 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import fluffy.errors as errors
from fluffy.bootstrap.engine import as_dict, detect
from fluffy.bootstrap.supervisor import Supervisor


def settings(home: Path) -> dict[str, str]:
    config: dict[str, str] = {}
    try:
        loaded = json.loads((home / "bootstrap.json").read_text())
        config = {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    env = {k: v for k, v in os.environ.items() if k.startswith(("FLUFFY_", "DOCKER_HOST"))}
    if "runtime" in config and "FLUFFY_RUNTIME" not in env:
        env["FLUFFY_RUNTIME"] = config["runtime"]
    if "kernel_image" in config and "FLUFFY_KERNEL_IMAGE" not in env:
        env["FLUFFY_KERNEL_IMAGE"] = config["kernel_image"]
    return env


def kernel_image(home: Path, env: dict[str, str]) -> str:
    if env.get("FLUFFY_KERNEL_IMAGE"):
        return env["FLUFFY_KERNEL_IMAGE"]
    try:
        return str(
            json.loads((home / "state" / "images.json").read_text())["images"]["kernel"]["ref"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        raise errors.ImageNotFound(
            "the kernel image is not built",
            why=f"{home}/state/images.json names none (images are built per fluffy home)",
            fix="Run `fluffy images build` with this FLUFFY_HOME (scripts/setup does it).",
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m fluffy.bootstrap")
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--project", required=True)
    args = parser.parse_args(argv)
    home = Path(os.environ.get("FLUFFY_HOME") or Path.home() / ".fluffy").expanduser()
    try:
        env = settings(home)
        project = str(Path(args.project).resolve())
        if not Path(project).is_dir():
            raise errors.ConfigError(f"project {project} is not a directory", why="", fix="")
        Supervisor(detect(env), project, home, kernel_image(home, env)).run()
    except errors.FluffyError as error:
        print(json.dumps({"ok": False, "error": as_dict(error)}), file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
