from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fluffy.errors import ConfigError
from fluffy.images.builder import dockerfile
from fluffy.images.spec import (
    IMAGES,
    IMAGES_DIR,
    INSTALL_STAGE,
    REQUIREMENTS_DIR,
    build_order,
    get_spec,
    spec_for_template,
)

ROOT = Path(__file__).resolve().parents[3]


def _names(lines: str) -> set[str]:
    names = set()
    for line in lines.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_kernel_requirements_equal_the_package_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.sub(r"\s+", "", dep) for dep in project["dependencies"]}
    kernel_in = {
        re.sub(r"\s+", "", line)
        for line in (REQUIREMENTS_DIR / "kernel.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert kernel_in == declared


@pytest.mark.parametrize("spec", [s for s in IMAGES if s.lock], ids=lambda s: s.name)
def test_each_lock_pins_everything_its_input_names(spec) -> None:  # type: ignore[no-untyped-def]
    lock = spec.lock_path.read_text()
    wanted = _names((REQUIREMENTS_DIR / f"{spec.lock}.in").read_text())
    pinned = {}
    for line in lock.splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{spec.lock}.lock: {line!r} is not pinned with =="
            pinned[name] = version
    assert wanted <= set(pinned), wanted - set(pinned)


@pytest.mark.parametrize("spec", IMAGES, ids=lambda s: s.name)
def test_dockerfiles_are_classic_builder_and_end_unprivileged(spec) -> None:  # type: ignore[no-untyped-def]
    text = dockerfile(spec)  # as built: the shared install stage in front, if any
    assert "--mount" not in text and "# syntax" not in text  # no BuildKit-only features
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] == "10001:10001"
    if spec.parent:
        assert "FROM ${PARENT_IMAGE}" in text
    else:
        assert "FROM ${BASE_IMAGE}" in text and "ARG BASE_IMAGE=debian:bookworm-slim" in text


def test_build_order_puts_parents_first() -> None:
    order = [s.name for s in build_order(["code-executor"])]
    assert order == ["python-base", "code-executor"]
    full = [s.name for s in build_order()]
    assert full[0] == "python-base" and set(full) == {s.name for s in IMAGES}


def test_templates_map_to_images() -> None:
    assert spec_for_template("code-executor").name == "code-executor"
    assert spec_for_template("integration-test").name == "code-executor"
    assert spec_for_template("ai-provider").name == "ai-provider"
    assert spec_for_template("policy-sandbox").name == "policy-sandbox"
    with pytest.raises(ConfigError):
        spec_for_template("gpu")


def test_unknown_image_name_lists_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        get_spec("nope")
    assert "kernel" in info.value.fix


def test_the_install_stage_is_written_once() -> None:
    stage = IMAGES_DIR / INSTALL_STAGE
    dockerfiles = [IMAGES_DIR / spec.name / "Dockerfile" for spec in IMAGES]
    installing = [p for p in [stage, *dockerfiles] if "pip install" in p.read_text()]
    assert installing == [stage]
    for spec in IMAGES:
        built = dockerfile(spec)
        own = (spec.directory / "Dockerfile").read_text()
        if spec.with_fluffy:
            assert built.count(" AS install") == 1 and built.endswith(own)
            assert "COPY --from=install /opt/fluffy /opt/fluffy" in own
        else:
            assert built == own
