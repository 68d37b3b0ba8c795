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

Nothing of the repository runs on this host (ADR-055): requirements are parsed as data
(lines fluffy does not fetch are named, with file and line, and left out), the host
downloads wheels only (:mod:`fluffy.images.envdownload`), a release with no wheel is
built from its source archive offline in a container (:mod:`fluffy.images.sdists`), and
the project's own install runs in the image build.  Each project's image has its own
repository (``fluffy/env-<project id>``): one checkout cannot re-tag another's.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from fluffy.bootstrap.supervisor import project_id
from fluffy.errors import EnvironmentFailed, FluffyError
from fluffy.images.envreport import read_report, remove_links
from fluffy.images.envstage import Say, Stager, project_version, write_plan
from fluffy.images.imagefiles import copy_from_image
from fluffy.images.nodeenv import NodePlan, build_node_environment, plan_node_environment
from fluffy.images.sdists import STAGE_LABELS
from fluffy.images.spec import (
    ENV_IMAGE_NAME,
    IMAGE_PYTHON,
    LABEL_IMAGE,
    LABEL_PROJECT,
    REQUIREMENTS_DIR,
    site_label,
)
from fluffy.images.wheelhouse import linux_arch
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore
from fluffy.kernel.project.deps import Requirements, collect_requirements, env_inputs, env_key
from fluffy.kernel.project.envstate import (
    ENV_SCHEME,
    EnvRecord,
    all_records,
    load_record,
    record_path,
    save_record,
)
from fluffy.kernel.project.layout import detect_layout
from fluffy.kernel.project.reqlines import Refusal, requirement_line
from fluffy.kernel.project.testsecrets import SecretFiles

ENV_REPOSITORY = "fluffy/env"
DOCKERFILE = f"""\
# A project's test environment (fluffy env build): FROM fluffy's code-executor image,
# its requirements installed offline from wheels the host downloaded.
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
{STAGE_LABELS}
USER root
COPY . /build/
RUN /opt/fluffy/venv/bin/python -m fluffy.sandboxes.envbuild /build && rm -rf /build
USER 10001:10001
WORKDIR /workspace
"""


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
        return env_image(self.project, self.key)


def env_image(project: Path, key: str) -> str:
    """The project's environment image: a repository of its own (by the project's id)."""
    return f"{ENV_REPOSITORY}-{project_id(str(project))}:{key}"


def _pinned(name: str) -> str | None:
    """fluffy's own pin of a package in the code-executor lock (pytest, coverage)."""
    lock = REQUIREMENTS_DIR / "code-executor.lock"
    for line in lock.read_text().splitlines():
        if line.split("==")[0].strip() == name and "==" in line:
            return line.strip()
    return None


def plan_environment(project: Path, base_image: str) -> EnvPlan | NodePlan | None:
    """The plan for ``project``'s environment, or None when it needs none (no
    requirements and nothing to install: the code-executor image serves it).  A
    JavaScript project's is a :class:`~fluffy.images.nodeenv.NodePlan`."""
    layout = detect_layout(project)
    if layout.language == "javascript":
        return plan_node_environment(project, base_image)
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
    return EnvPlan(
        project=project,
        key=env_key(inputs, base_image, IMAGE_PYTHON, ENV_SCHEME),
        base_image=base_image,
        requirements=reqs,
        inputs=inputs,
        import_roots=list(layout.import_roots()),
        extra=extra,
    )


# -- the build context (files only; see fluffy.images.envstage) -------------------------
def _stage(plan: EnvPlan, context: Path, stager: Stager, say: Say, state: Path) -> None:
    reqs = plan.requirements
    lines = [*reqs.requirements, *plan.extra]
    for refusal in reqs.refused:
        say(f"not fetched: {refusal}")
    stager.take_own(plan.project)
    say(f"downloading {len(lines)} requirement(s) and what they need (host, wheels only)")
    stager.fetch(lines, reqs.constraints, "requirement")
    if reqs.installable and reqs.build_requires:
        build = [*reqs.build_requires, *_backend_extras(reqs.build_requires)]
        stager.fetch(build, [], "build requirement")
    # the person's secret files stay out, as from test runs: the install is the project's code
    secrets = SecretFiles(plan.project, state).hidden()
    stager.copy_project(plan.project, context / "project", secrets)
    write_plan(context, {
        "requirements": lines,
        "constraints": reqs.constraints,
        "install_project": reqs.installable,
        "import_roots": plan.import_roots,
        "version": project_version(plan.project),
    })  # fmt: skip
    (context / "Dockerfile").write_text(DOCKERFILE)


def _extract_report(engine: Engine, image: str, dest: Path) -> dict[str, Any]:
    """Copy the image's /opt/fluffy/env/report out (env.json, generated/)."""
    copy_from_image(engine, image, "/opt/fluffy/env/report", dest)
    report = dest / "report"
    remove_links(report)  # the repository's install wrote it: untrusted (images.envreport)
    data = read_report(report)
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


def _missing_build(report: dict[str, Any], refused: list[Refusal]) -> list[str]:
    """What the project's backend asked for at install time (read in the build, so
    untrusted), parsed like every other requirement."""
    wanted = [str(m) for m in report.get("missing_build") or []][:20]
    kept = [requirement_line(m, "the project's build backend", refused) for m in wanted]
    return [k for k in kept if k is not None]


def build_environment(
    engine: Engine,
    plan: EnvPlan | NodePlan,
    state: Path,
    *,
    say: Say = lambda _text: None,
    on_line: Callable[[str], None] = lambda _line: None,
    owner: tuple[int, int] | None = None,
) -> EnvRecord:
    """Download, build the image (network off), record it under ``state``."""
    if isinstance(plan, NodePlan):
        return build_node_environment(engine, plan, state, say=say, on_line=on_line,
                                      owner=owner)  # fmt: skip
    started = time.monotonic()
    store = ImageStore(engine)
    folder = record_path(state, plan.key).parent
    refused = list(plan.requirements.refused)
    with tempfile.TemporaryDirectory(prefix="fluffy-env-") as tmp:
        context = Path(tmp)
        stager = Stager(engine, plan.base_image, state, context, linux_arch(engine.info.arch),
                        plan.requirements.hashes, say)  # fmt: skip
        _stage(plan, context, stager, say, state)
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
                        **site_label(),
                        "org.fluffy.env-key": plan.key,
                    },
                    on_line=on_line,
                    on_step=lambda *_: None,
                    network_mode="none",
                )
            except FluffyError as exc:
                store.prune_dangling(LABEL_IMAGE)  # the failed build's steps
                raise _build_error(exc) from exc
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            report = _extract_report(engine, plan.image, folder)
            missing = _missing_build(report, refused)
            if not missing or round_ == 2:
                break
            say(f"the project's build backend also needs {', '.join(missing)}: fetching")
            stager.fetch(missing, [], "build requirement")
    record = EnvRecord(
        key=plan.key,
        image=plan.image,
        created_at=time.time(),
        inputs=plan.inputs,
        requirements=[*plan.requirements.requirements, *plan.extra],
        sources=plan.requirements.sources,
        skipped=plan.requirements.skipped,
        refused=[str(r) for r in refused],
        built_from_source=stager.built_from_source(),
        packages=report.get("packages", {}),
        modules=report.get("modules", []),
        generated=report.get("generated", []),
        project_installed=bool(report.get("project_installed")),
        warnings=[*stager.notes, *report.get("warnings", [])],
        python=str(report.get("python", "")),
        build_s=round(time.monotonic() - started, 1),
    )
    save_record(state, record, owner)
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
