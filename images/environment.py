"""A project's test environment: its dependencies installed offline into an image.

Sandboxes have no network, so what a project's tests need is resolved and downloaded on
the host (wheels only: nothing of a package runs on the host) and installed into an
image ``FROM`` fluffy's code-executor image, with the build's network off
(:mod:`fluffy.sandboxes.envbuild` does the installing).  The image is cached by a key over
its inputs (the dependency files, the code-executor image, the interpreter, this
builder's scheme), so a second build of the same inputs is a lookup; a changed input
gives a new key.  The record ``<state>/envs/<key>/env.json`` tells the kernel which image
to run ``test.run`` in and which files the install generated in the tree
(``generated/``) for it to lay into the test sandbox's view.

A requirement without a wheel for the image's platform stops the build with an error
naming the package and the ways out (another version, a wheel in ``.fluffy/wheels/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fluffy.errors import EnvironmentFailed, FluffyError, PackageUnavailable
from fluffy.images.spec import IMAGE_PYTHON, LABEL_IMAGE, REQUIREMENTS_DIR
from fluffy.images.wheelhouse import linux_arch, target_args
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.errors import engine_call
from fluffy.kernel.containers.images import ImageStore
from fluffy.kernel.project.deps import Requirements, collect_requirements, env_inputs, env_key
from fluffy.kernel.project.envstate import (
    ENV_SCHEME,
    EnvRecord,
    all_records,
    load_record,
    record_path,
)
from fluffy.kernel.project.layout import detect_layout
from fluffy.kernel.project.viewfiles import walk_project
from fluffy.paths import cache_dir

ENV_REPOSITORY = "fluffy/project-env"
ENV_IMAGE_NAME = "project-env"
LABEL_PROJECT = "org.fluffy.project-path"
#: Files of the project copied into the build for its own install, at most.
MAX_PROJECT_BYTES = 512 * 1024 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024
DOCKERFILE = """\
# A project's test environment (fluffy env build): FROM fluffy's code-executor image,
# its requirements installed offline from wheels the host downloaded.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
USER root
COPY . /build/
RUN /opt/fluffy/venv/bin/python -m fluffy.sandboxes.envbuild /build && rm -rf /build
USER 10001:10001
WORKDIR /workspace
"""
_NO_DIST = re.compile(
    r"(?:No matching distribution found for|Could not find a version that satisfies the "
    r"requirement)\s+([^\s(]+)"
)

Say = Callable[[str], None]


@dataclass
class EnvPlan:
    """What an environment is built from, and its name."""

    project: Path
    key: str
    base_image: str
    requirements: Requirements
    inputs: dict[str, str]
    import_roots: list[str]
    extra: list[str] = field(default_factory=list)  # pytest / coverage when not asked for

    @property
    def image(self) -> str:
        return f"{ENV_REPOSITORY}:{self.key}"


def _pinned(name: str) -> str | None:
    """fluffy's own pin of a package in the code-executor lock (pytest, coverage)."""
    lock = REQUIREMENTS_DIR / "code-executor.lock"
    for line in lock.read_text().splitlines():
        if line.split("==")[0].strip() == name and "==" in line:
            return line.strip()
    return None


def plan_environment(project: Path, base_image: str) -> EnvPlan | None:
    """The plan for ``project``'s environment, or None when it needs none (no
    requirements and nothing to install: the code-executor image serves it)."""
    reqs = collect_requirements(project)
    if not reqs.wanted():
        return None
    inputs = env_inputs(project)
    names = reqs.names | {canonicalize_name(c.split("==")[0]) for c in reqs.constraints}
    extra = []
    for tool in ("pytest", "coverage"):
        if tool not in names:
            extra.append(_pinned(tool) or tool)
        elif tool not in reqs.names:
            extra.append(tool)  # pinned by the lock
    layout = detect_layout(project)
    return EnvPlan(
        project=project,
        key=env_key(inputs, base_image, IMAGE_PYTHON, ENV_SCHEME),
        base_image=base_image,
        requirements=reqs,
        inputs=inputs,
        import_roots=list(layout.import_roots()),
        extra=extra,
    )


# -- downloading on the host ------------------------------------------------------------
def _unavailable(stderr: str, what: str) -> FluffyError:
    found = _NO_DIST.search(stderr)
    if found is None:
        return EnvironmentFailed(
            f"cannot download the {what}",
            why="`pip download` failed on this host: " + stderr.strip()[-1500:],
            fix="Check that `pip download` works here (index, proxy, CA certificates), then "
            "run `fluffy env build` again.",
        )
    named = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", found.group(1).strip("'\""))
    name = named.group(0) if named else found.group(1)
    return PackageUnavailable(
        f"no wheel of {name} for CPython {IMAGE_PYTHON} on Linux",
        why=f"{name} (a {what}) is published only as source, or not for this platform; "
        "fluffy does not build packages on your machine (that would run their code "
        "outside any sandbox)",
        fix=f"Pin a version of {name} that has wheels, or build one yourself (`pip wheel "
        f"{name} -w .fluffy/wheels/`) and put it in .fluffy/wheels/, then run `fluffy env "
        "build` again.",
    )


def _download(args: list[str], dest: Path, find_links: list[Path], arch: str, what: str) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        *target_args(arch), "--dest", str(dest),
        *(f"--find-links={p}" for p in find_links), *args,
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise _unavailable(proc.stderr + proc.stdout, what)


def _version(project: Path) -> str:
    """The version a VCS-versioned project would report (its last tag), else 0.0.0."""
    try:
        out = subprocess.run(
            ["git", "-C", str(project), "describe", "--tags", "--abbrev=0"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()  # fmt: skip
        return str(Version(out.lstrip("vV")))
    except (OSError, subprocess.SubprocessError, InvalidVersion):
        return "0.0.0"


def _stage(plan: EnvPlan, context: Path, arch: str, say: Say) -> None:
    wheels = context / "wheels"
    wheels.mkdir(parents=True)
    shared = cache_dir() / "env-wheels"
    shared.mkdir(parents=True, exist_ok=True)
    links = [shared]
    own = plan.project / ".fluffy" / "wheels"
    if own.is_dir():
        links.append(own)
    reqs = plan.requirements
    lines = [*reqs.requirements, *plan.extra]
    say(f"downloading {len(lines)} requirement(s) and what they need (host, wheels only)")
    (context / "req.txt").write_text("\n".join(lines) + "\n")
    (context / "con.txt").write_text("\n".join(reqs.constraints) + "\n")
    _download(["-r", str(context / "req.txt"), "-c", str(context / "con.txt")],
              wheels, links, arch, "requirement")  # fmt: skip
    if reqs.installable and reqs.build_requires:
        build = [*reqs.build_requires, *_backend_extras(reqs.build_requires)]
        _download(build, wheels, links, arch, "build requirement")
    for wheel in wheels.glob("*.whl"):
        if not (shared / wheel.name).exists():
            shutil.copy2(wheel, shared / wheel.name)
    copied = 0
    for entry in walk_project(plan.project):
        if entry.size > MAX_FILE_BYTES:
            continue
        copied += entry.size
        if copied > MAX_PROJECT_BYTES:
            raise EnvironmentFailed(
                f"the project is larger than {MAX_PROJECT_BYTES // 2**20} MiB",
                why="its files are copied into the environment's build for its own install",
                fix="Leave large data out of the project folder, or add them to .gitignore-"
                "like folders fluffy skips (.venv, node_modules, build).",
            )
        target = context / "project" / entry.rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plan.project / entry.rel, target)
    (context / "project").mkdir(exist_ok=True)
    document = {
        "requirements": lines,
        "constraints": reqs.constraints,
        "install_project": reqs.installable,
        "import_roots": plan.import_roots,
        "version": _version(plan.project),
    }
    (context / "plan.json").write_text(json.dumps(document, indent=1))
    (context / "Dockerfile").write_text(DOCKERFILE)


def _extract_report(engine: Engine, image: str, dest: Path) -> dict[str, Any]:
    """Copy the image's /opt/fluffy/env/report out (env.json, generated/)."""
    api = engine.client.api
    with engine_call(f"read the report of {image}"):
        container = api.create_container(image, command=["true"], network_disabled=True)
    try:
        with tempfile.TemporaryFile() as archive:
            with engine_call(f"copy the report out of {image}"):
                stream, _ = api.get_archive(container["Id"], "/opt/fluffy/env/report")
                for chunk in stream:
                    archive.write(chunk)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(dest, filter="data")
    finally:
        with engine_call("remove the report container"):
            api.remove_container(container["Id"], force=True)
    report = dest / "report"
    data: dict[str, Any] = json.loads((report / "env.json").read_text())
    if (report / "generated").is_dir():
        shutil.move(str(report / "generated"), dest / "generated")
    shutil.rmtree(report)
    return data


def _build_error(exc: FluffyError) -> FluffyError:
    text = f"{exc.what}\n{exc.why}"
    marker = text.find("FLUFFY-ENV-ERROR ")
    if marker < 0:
        return EnvironmentFailed(exc.what, why=exc.why)
    step = "requirements" if '"step": "requirements"' in text else "environment"
    tail = text[marker:].split("\n", 1)[0][len("FLUFFY-ENV-ERROR ") :]
    try:
        detail = json.loads(tail)
        output = str(detail.get("output", ""))
        step = str(detail.get("step", step))
    except ValueError:
        output = tail
    compiler = "error: command 'gcc' failed" in output or "gcc: not found" in output
    return EnvironmentFailed(
        f"installing the {step} into the environment failed",
        why=output.strip()[-1500:],
        fix="A package that needs a compiler cannot be built in the image: pin a version "
        "with a wheel, or put a wheel in .fluffy/wheels/."
        if compiler
        else "Read pip's message above; fix the dependency files, then run `fluffy env build`.",
    )


#: What build backends ask for when building editable (PEP 660 ``get_requires_for_build_
#: editable``), fetched up front; anything else they ask for is fetched in a second round.
EDITABLE_REQUIRES = {"hatchling": ["editables~=0.3"], "pdm-backend": ["editables"]}


def _backend_extras(build_requires: list[str]) -> list[str]:
    names = {canonicalize_name(re.split(r"[\s;\[<>=~!]", r.strip(), maxsplit=1)[0])
             for r in build_requires}  # fmt: skip
    return [e for name, extras in EDITABLE_REQUIRES.items() if name in names for e in extras]


def build_environment(
    engine: Engine,
    plan: EnvPlan,
    state: Path,
    *,
    say: Say = lambda _text: None,
    on_line: Callable[[str], None] = lambda _line: None,
    owner: tuple[int, int] | None = None,
) -> EnvRecord:
    """Download, build the image (network off), record it under ``state``."""
    started = time.monotonic()
    arch = linux_arch(engine.info.arch)
    store = ImageStore(engine)
    folder = record_path(state, plan.key).parent
    with tempfile.TemporaryDirectory(prefix="fluffy-env-") as tmp:
        context = Path(tmp)
        _stage(plan, context, arch, say)
        for round_ in (1, 2):
            say(f"building {plan.image} (offline)")
            try:
                store.build(
                    context,
                    plan.image,
                    buildargs={"BASE_IMAGE": plan.base_image},
                    labels={
                        LABEL_IMAGE: ENV_IMAGE_NAME,
                        LABEL_PROJECT: str(plan.project),
                        "org.fluffy.env-key": plan.key,
                    },
                    on_line=on_line,
                    on_step=lambda *_: None,
                    network_mode="none",
                )
            except FluffyError as exc:
                raise _build_error(exc) from exc
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            report = _extract_report(engine, plan.image, folder)
            missing = [str(m) for m in report.get("missing_build") or []]
            if not missing or round_ == 2:
                break
            say(f"the project's build backend also needs {', '.join(missing)}: fetching")
            _download(missing, context / "wheels", [cache_dir() / "env-wheels"], arch,
                      "build requirement")  # fmt: skip
    record = EnvRecord(
        key=plan.key,
        image=plan.image,
        created_at=time.time(),
        inputs=plan.inputs,
        requirements=[*plan.requirements.requirements, *plan.extra],
        sources=plan.requirements.sources,
        skipped=plan.requirements.skipped,
        packages=report.get("packages", {}),
        modules=report.get("modules", []),
        generated=report.get("generated", []),
        project_installed=bool(report.get("project_installed")),
        warnings=report.get("warnings", []),
        python=str(report.get("python", "")),
        build_s=round(time.monotonic() - started, 1),
    )
    tmp_path = folder / "env.json.tmp"
    tmp_path.write_text(json.dumps(asdict(record), indent=1, sort_keys=True))
    tmp_path.replace(record_path(state, plan.key))
    if owner is not None and os.geteuid() == 0:
        for path in [folder.parent, folder, *folder.rglob("*")]:
            os.lchown(path, *owner)
    return record


def ensure_environment(
    engine: Engine,
    project: Path,
    state: Path,
    base_image: str,
    *,
    force: bool = False,
    say: Say = lambda _text: None,
    on_line: Callable[[str], None] = lambda _line: None,
    owner: tuple[int, int] | None = None,
) -> tuple[EnvRecord | None, bool]:
    """The project's environment for its files as they are now: (record, built now?).

    A cache hit costs the hashing of the dependency files and one image lookup."""
    plan = plan_environment(project, base_image)
    if plan is None:
        return None, False
    record = load_record(state, plan.key)
    if record is not None and not force and ImageStore(engine).image_id(record.image):
        return record, False
    return build_environment(engine, plan, state, say=say, on_line=on_line, owner=owner), True


def clear_environments(engine: Engine, state: Path) -> list[str]:
    """Remove the project's environment images and records; the refs removed."""
    removed = []
    store = ImageStore(engine)
    for record in all_records(state):
        if store.image_id(record.image):
            store.remove(record.image)
        removed.append(record.image)
    shutil.rmtree(state / "envs", ignore_errors=True)
    return removed
