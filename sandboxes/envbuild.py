"""Build a project's test environment inside an image build (offline, network none).

``python -m fluffy.sandboxes.envbuild /build`` runs in the ``RUN`` step of a project
environment image (``FROM`` fluffy's code-executor image).  ``/build`` holds what the
host prepared: ``wheels/`` (every wheel needed, downloaded on the host), ``plan.json``
(requirements, constraints, whether to install the project, its import roots) and
``project/`` (the project's files, for its own install).  Nothing is fetched: pip runs
with ``--no-index`` only.

1. a virtual environment at ``/opt/fluffy/env`` with the requirements (and pytest and
   coverage, which the test tool needs);
2. the project itself, editable, from ``/workspace`` -- the folder the test sandbox
   mounts the project's view at, so the installed project *is* the view.  Files the
   install writes into the tree (a ``_version.py`` from hatch-vcs or setuptools-scm, an
   ``.egg-info``) are kept under ``/opt/fluffy/env/generated/`` for the kernel to lay into
   the view; the user's project never gets them.  If the project cannot be installed, its
   import roots go on ``sys.path`` through a ``.pth`` file and the report says why;
3. ``/opt/fluffy/env/report/env.json``: installed distributions, the top-level modules
   they provide, the generated files, warnings.

Standard library only (it runs with the image's own Python before anything else).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ENV = Path("/opt/fluffy/env")
WORKSPACE = Path("/workspace")
REPORT = ENV / "report"
_MISSING = re.compile(r"No matching distribution found for ([^\s(]+)")
SKIP_DIRS = {"__pycache__", ".git", "build", ".eggs", ".pytest_cache", ".mypy_cache"}


def _run(command: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return proc.returncode, (proc.stdout + proc.stderr)[-6000:]


def _tree(root: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in files:
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            found[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _pip(*args: str) -> list[str]:
    return [str(ENV / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args]


def _fail(step: str, output: str) -> None:
    print(f"FLUFFY-ENV-ERROR {json.dumps({'step': step, 'output': output})}", flush=True)
    sys.exit(1)


def install_requirements(build: Path, plan: dict[str, Any]) -> None:
    offline = ["--no-index", "--find-links", str(build / "wheels")]
    code, out = _run(["python3", "-m", "venv", str(ENV)])
    if code:
        _fail("venv", out)
    if plan.get("requirements"):
        (build / "requirements.txt").write_text("\n".join(plan["requirements"]) + "\n")
        (build / "constraints.txt").write_text("\n".join(plan.get("constraints", [])) + "\n")
        code, out = _run(
            _pip(
                "install",
                "--no-cache-dir",
                *offline,
                "-r",
                str(build / "requirements.txt"),
                "-c",
                str(build / "constraints.txt"),
            )
        )
        if code:
            _fail("requirements", out)


def install_project(build: Path, plan: dict[str, Any], report: dict[str, Any]) -> None:
    """The project, editable from /workspace; else its import roots on sys.path."""
    site = Path(
        subprocess.check_output(
            [
                str(ENV / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            text=True,
        ).strip()
    )
    roots = [
        str(WORKSPACE if r in ("", ".") else WORKSPACE / r) for r in plan.get("import_roots", [])
    ]
    if WORKSPACE.exists():
        shutil.rmtree(WORKSPACE)
    shutil.copytree(build / "project", WORKSPACE, symlinks=True)
    before = _tree(WORKSPACE)
    installed = False
    if plan.get("install_project"):
        code, out = _run(
            _pip("install", "--no-cache-dir", "--no-index", "--find-links", str(build / "wheels"),
                 "--no-deps", "-e", str(WORKSPACE)),
            env={
                "SETUPTOOLS_SCM_PRETEND_VERSION": plan.get("version", "0.0.0"),
                "PDM_BUILD_SCM_VERSION": plan.get("version", "0.0.0"),
            },
        )  # fmt: skip
        installed = code == 0
        missing = sorted(set(_MISSING.findall(out)))
        if missing:
            report["missing_build"] = missing  # the backend asked for more: the host fetches
        if not installed:
            report["warnings"].append(
                "the project itself could not be installed; its import roots are on sys.path "
                "instead (importlib.metadata does not know it). pip said: " + out[-1500:]
            )
    # the import roots always work, installed or not (a new package appears at once)
    (site / "fluffy-project.pth").write_text("".join(f"{root}\n" for root in roots))
    after = _tree(WORKSPACE)
    generated = sorted(rel for rel, sha in after.items() if before.get(rel) != sha)
    target = ENV / "generated"
    for rel in generated:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(WORKSPACE / rel, dest)
    report["generated"] = generated
    report["project_installed"] = installed
    shutil.rmtree(WORKSPACE)
    WORKSPACE.mkdir()
    os.chown(WORKSPACE, 10001, 10001)


def describe(report: dict[str, Any]) -> None:
    """Installed distributions and the top-level modules they provide."""
    code = (
        "import importlib.metadata as m, json;"
        "d={x.metadata['Name']: x.version for x in m.distributions()};"
        "t=sorted(m.packages_distributions());"
        "print(json.dumps({'packages': d, 'modules': t}))"
    )
    out = subprocess.check_output([str(ENV / "bin" / "python"), "-c", code], text=True)
    seen = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    # the environment's python runs the project's .pth files: take only these two keys
    report["packages"] = {str(k): str(v) for k, v in dict(seen.get("packages", {})).items()}
    report["modules"] = [str(m) for m in list(seen.get("modules", []))]
    report["python"] = subprocess.check_output(
        [str(ENV / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
        text=True,
    ).strip()


def main(argv: list[str]) -> int:
    build = Path(argv[1] if len(argv) > 1 else "/build")
    os.chdir("/")  # /workspace (the image's working directory) is replaced below
    plan = json.loads((build / "plan.json").read_text())
    report: dict[str, Any] = {"warnings": [], "generated": [], "project_installed": False}
    install_requirements(build, plan)
    install_project(build, plan, report)
    describe(report)
    REPORT.mkdir(parents=True, exist_ok=True)
    (REPORT / "env.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    for rel in report["generated"]:
        dest = REPORT / "generated" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ENV / "generated" / rel, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
