"""Which test environment a project's ``test.run`` uses (the kernel's side).

The host builds environments (``fluffy env build``, :mod:`fluffy.images.environment`)
and records each one as ``<state>/envs/<key>/env.json``.  The kernel never builds: for a
test run it computes the key of the project's dependency files *as they are now* and
uses that record's image.  Missing that, it uses the project's newest environment and
says it is out of date (the tests still run; the CLI rebuilds at the next task), or,
with none at all, fluffy's code-executor image with the project's import roots on
``sys.path``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import asdict, fields

from fluffy.kernel.project.deps import collect_requirements, env_inputs, env_key
from fluffy.kernel.project.layout import Language, detect_layout
from fluffy.kernel.project.nodeenv import DEFAULT_NODE, node_inputs
from fluffy.kernel.project.nodeversion import choose_node

#: Bump when the environment's layout changes (every project rebuilds once).
ENV_SCHEME = 2
#: The interpreter of fluffy's images (images/spec.py IMAGE_PYTHON).
ENV_PYTHON = "3.11"
ENV_ROOT = "/opt/fluffy/env"


class EnvRecord(msgspec.Struct, frozen=True):
    key: str
    image: str
    created_at: float
    inputs: dict[str, str]
    requirements: list[str] = msgspec.field(default_factory=list)
    sources: list[str] = msgspec.field(default_factory=list)
    skipped: list[str] = msgspec.field(default_factory=list)
    #: lines of the project's files never fetched (URL, VCS, path, option), with file:line
    refused: list[str] = msgspec.field(default_factory=list)
    #: releases with no wheel, built from their sdists offline in a container
    built_from_source: list[str] = msgspec.field(default_factory=list)
    packages: dict[str, str] = msgspec.field(default_factory=dict)
    modules: list[str] = msgspec.field(default_factory=list)
    generated: list[str] = msgspec.field(default_factory=list)
    project_installed: bool = False
    warnings: list[str] = msgspec.field(default_factory=list)
    python: str = ""
    build_s: float = 0.0
    #: a JavaScript project's: the Node version (e.g. "v24.19.0")
    node: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def record_path(state: Path, key: str) -> Path:
    return state / "envs" / key / "env.json"


def load_record(state: Path, key: str) -> EnvRecord | None:
    try:
        return EnvRecord.from_dict(json.loads(record_path(state, key).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save_record(state: Path, record: EnvRecord, owner: tuple[int, int] | None) -> None:
    """Write ``record`` where :func:`load_record` reads it (one atomic rename), its folder
    given to ``owner`` (the project's owner, when the build ran as root)."""
    path = record_path(state, record.key)
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(asdict(record), indent=1, sort_keys=True))
    tmp_path.replace(path)
    if owner is not None and os.geteuid() == 0:
        for found in [path.parent.parent, *path.parent.parent.rglob("*")]:
            os.lchown(found, *owner)


def all_records(state: Path) -> list[EnvRecord]:
    """Every environment recorded for the project, newest first."""
    found = []
    folder = state / "envs"
    for child in folder.iterdir() if folder.is_dir() else []:
        record = load_record(state, child.name)
        if record is not None:
            found.append(record)
    return sorted(found, key=lambda r: r.created_at, reverse=True)


class EnvChoice(msgspec.Struct, frozen=True):
    """The environment a test run gets, and what the user and the model are told."""

    record: EnvRecord | None
    key: str | None  # the key the project's files ask for (None: no environment needed)
    current: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        record = self.record
        return {
            "needed": self.key is not None,
            "key": self.key,
            "current": self.current,
            "image": record.image if record else None,
            "packages": len(record.packages) if record else 0,
            "project_installed": record.project_installed if record else False,
            "sources": record.sources if record else [],
            "warnings": record.warnings if record else [],
            "refused": record.refused if record else [],
            "built_from_source": record.built_from_source if record else [],
            "note": self.note,
        }


def needs_environment(project: Path) -> bool:
    """Whether the project's tests need an environment image: a JavaScript project
    (Node), or a Python project that declares requirements."""
    if detect_layout(project).language == "javascript":
        return True
    return collect_requirements(project).wanted()


def node_key(project: Path, base_image: str, major: int) -> tuple[str, dict[str, str]]:
    """A JavaScript project's environment key (Node ``major``) and the files' hashes: the
    one formula ``fluffy env`` builds by and ``test.run`` looks up by."""
    inputs = node_inputs(project)
    return env_key(inputs, base_image, f"node{major}", ENV_SCHEME), inputs


def wanted_key(
    project: Path, base_image: str, language: Language | None = None
) -> tuple[str, dict[str, str]] | None:
    """The key of the environment the project's files ask for, and the files' hashes;
    None when it needs none (a Python project with no requirements).  A JavaScript
    project always has one: Node is not in fluffy's code-executor image.  ``language``:
    the project's, when the caller knows its layout (else it is detected)."""
    if (language or detect_layout(project).language) == "javascript":
        # none of fluffy's majors: no build can have made this key (the build says why)
        return node_key(project, base_image, choose_node(project).major or DEFAULT_NODE)
    if collect_requirements(project).wanted():
        inputs, runtime = env_inputs(project), ENV_PYTHON
    else:
        return None
    return env_key(inputs, base_image, runtime, ENV_SCHEME), inputs


def choose(
    project: Path, state: Path, base_image: str, language: Language | None = None
) -> EnvChoice:
    """The environment for the project's dependency files as they are now."""
    wanted = wanted_key(project, base_image, language)
    if wanted is None:
        return EnvChoice(None, None, True)
    key, inputs = wanted
    record = load_record(state, key)
    if record is not None:
        return EnvChoice(record, key, True)
    older = all_records(state)
    if older:
        changed = sorted(set(older[0].inputs.items()) ^ set(inputs.items()))
        files = sorted({rel for rel, _ in changed}) or ["fluffy's images"]
        return EnvChoice(
            older[0],
            key,
            False,
            note="the test environment predates the change to "
            f"{', '.join(files[:4])}; it is rebuilt at the next task "
            "(or run `fluffy env build`)",
        )
    return EnvChoice(
        None,
        key,
        False,
        note="the project's test environment is not built yet, so its dependencies are "
        "missing in the test sandbox; run `fluffy env build` (fluffy builds it before "
        "each task)",
    )


def third_party_modules(choice: EnvChoice, project: Path) -> set[str]:
    """Top-level modules that belong to installed or declared distributions."""
    names = set(choice.record.modules) if choice.record else set()
    for name in collect_requirements(project).names:
        names.add(name.replace("-", "_"))
    return names
