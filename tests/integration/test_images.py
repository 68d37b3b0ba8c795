"""The locally built images, used for real."""

from __future__ import annotations

import contextlib
import json
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_in_image

from fluffy.errors import FluffyError
from fluffy.images import builder
from fluffy.images.builder import build_images, plan_images
from fluffy.images.hygiene import find_orphans, remove_orphans
from fluffy.images.spec import (
    ENV_IMAGE_NAME,
    IMAGES_DIR,
    LABEL_HASH,
    LABEL_IMAGE,
    LABEL_PROJECT,
    ImageSpec,
    get_spec,
    site_label,
)
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore

L2 = ("ai-provider", "code-executor", "policy-sandbox")

FACTS = r"""
import errno, json, os, sys
out = {"python": list(sys.version_info[:2]), "uid": os.getuid(), "gid": os.getgid()}
import msgspec, fluffy, fluffy.sandboxes
out["fluffy"] = fluffy.__version__
try:
    open("/opt/fluffy/venv/pwned", "w")
    out["write_runtime"] = "allowed"
except OSError as exc:
    out["write_runtime"] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""


def _run(engine: Engine, image: str, *command: str) -> tuple[int, str, str]:
    return run_in_image(engine, image, list(command))


def test_every_image_is_current(engine: Engine, images: dict[str, str]) -> None:
    plan = plan_images(engine)
    assert {s.name: s.state for s in plan} == {name: "current" for name in images}
    assert {s.name: s.ref for s in plan} == images


def test_building_again_builds_nothing(
    engine: Engine, images: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {s.name: s.image_id for s in plan_images(engine)}

    def no_build(*args: object, **kwargs: object) -> str:
        raise AssertionError("an unchanged image was rebuilt")

    monkeypatch.setattr(ImageStore, "build", no_build)
    results = build_images(engine)
    assert {r.name: r.state for r in results} == {name: "current" for name in images}
    assert {r.name: r.image_id for r in results} == before


@pytest.mark.parametrize("name", sorted(set(L2) | {"kernel", "python-base"}))
def test_images_carry_their_labels(engine: Engine, images: dict[str, str], name: str) -> None:
    labels = ImageStore(engine).inspect(images[name])["Config"]["Labels"]
    assert labels[LABEL_IMAGE] == name
    assert images[name].endswith(":" + labels[LABEL_HASH])


@pytest.mark.parametrize("name", L2)
def test_l2_images_run_fluffy_unprivileged_on_a_read_only_runtime(
    engine: Engine, images: dict[str, str], name: str
) -> None:
    code, out, err = _run(engine, images[name], "python3", "-c", FACTS)
    assert code == 0, err
    facts = json.loads(out)
    assert facts["python"] == [3, 11]
    assert (facts["uid"], facts["gid"]) == (10001, 10001)
    assert facts["write_runtime"] == "EROFS"


@pytest.mark.parametrize(
    "command",
    [
        ("git", "--version"),
        ("python3", "-m", "pytest", "--version"),
        ("python3", "-m", "coverage", "--version"),
    ],
    ids=["git", "pytest", "coverage"],
)
def test_code_executor_has_its_tools(
    engine: Engine, images: dict[str, str], command: tuple[str, ...]
) -> None:
    code, out, err = _run(engine, images["code-executor"], *command)
    assert code == 0, err
    assert (out + err).strip()


def test_ai_provider_has_its_adapters(engine: Engine, images: dict[str, str]) -> None:
    # the adapters and the in-process tunnel (no socat: strict seccomp forbids processes)
    code, out, err = _run(
        engine,
        images["ai-provider"],
        "python3",
        "-c",
        "import httpx, fluffy.sandboxes.ai_host, fluffy.ipc.ai_types; print('ok')",
    )
    assert code == 0 and out.strip() == "ok", err


def test_kernel_image_self_check(engine: Engine, images: dict[str, str]) -> None:
    # The kernel image's entrypoint is `python3 -m fluffy.kernel`.
    code, out, err = _run(engine, images["kernel"], "self-check")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] is True and report["missing"] == []
    assert report["uid"] == 10001
    assert {"pydantic", "msgspec", "aiosqlite", "docker", "podman"} <= set(report["imports"])
    assert report["sqlite_json"] is True, report["sqlite"]  # audit log filters use it


@pytest.fixture()
def probe_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "images"
    shutil.copytree(IMAGES_DIR / "python-base", tree / "python-base")
    (tree / "test-probe").mkdir()
    (tree / "test-probe" / "Dockerfile").write_text(
        "ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE}\nRUN echo one > /home/fluffy/version\n"
    )
    return tree


def test_a_changed_input_builds_a_new_tag_and_only_that_image(
    engine: Engine, images: dict[str, str], probe_tree: Path, fluffy_home: Path
) -> None:
    specs = (
        replace(get_spec("python-base"), source_dir=probe_tree),
        ImageSpec(
            name="test-probe", description="test", parent="python-base", source_dir=probe_tree
        ),
    )
    store = ImageStore(engine)
    made: list[str] = []
    try:
        first = {r.name: r for r in build_images(engine, specs=specs)}
        made.append(first["test-probe"].ref)
        assert first["python-base"].state == "current"  # same content as the real one
        assert first["python-base"].ref == images["python-base"]
        assert first["test-probe"].state == "built"
        again = {r.name: r for r in build_images(engine, specs=specs)}
        assert again["test-probe"].state == "current"
        assert again["test-probe"].ref == first["test-probe"].ref

        dockerfile = probe_tree / "test-probe" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text().replace("one", "two"))
        changed = {r.name: r for r in build_images(engine, specs=specs)}
        made.append(changed["test-probe"].ref)
        assert changed["test-probe"].state == "built"
        assert changed["test-probe"].ref != first["test-probe"].ref
        code, out, _ = _run(engine, changed["test-probe"].ref, "cat", "/home/fluffy/version")
        assert (code, out.strip()) == (0, "two")
        manifest = json.loads(builder.manifest_path().read_text())
        assert manifest["images"]["test-probe"]["ref"] == changed["test-probe"].ref
    finally:
        for ref in made:
            with contextlib.suppress(FluffyError):
                store.remove(ref)


def test_a_failing_step_is_a_build_error_with_its_output(
    engine: Engine, images: dict[str, str], probe_tree: Path, fluffy_home: Path
) -> None:
    (probe_tree / "test-probe" / "Dockerfile").write_text(
        "ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE}\nRUN echo about to fail && exit 3\n"
    )
    specs = (
        replace(get_spec("python-base"), source_dir=probe_tree),
        ImageSpec(
            name="test-probe", description="test", parent="python-base", source_dir=probe_tree
        ),
    )
    with pytest.raises(FluffyError) as info:
        build_images(engine, specs=specs)
    assert info.value.code == "image.build_failed"
    assert "image test-probe" in info.value.what
    assert "about to fail" in info.value.why


def test_prune_removes_the_environment_of_a_project_folder_that_is_gone(
    engine: Engine, images: dict[str, str], tmp_path: Path
) -> None:
    """What an engine test run leaves behind by the dozen: environments of deleted folders."""
    store = ImageStore(engine)
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {images['python-base']}\n")
    made: dict[str, str] = {}
    try:
        for name in ("live", "gone"):
            (tmp_path / name).mkdir()
            tag = f"fluffy/env-{uuid.uuid4().hex[:12]}:" + "ab" * 8
            store.build(context, tag, buildargs={},
                        labels={LABEL_IMAGE: ENV_IMAGE_NAME, LABEL_PROJECT: str(tmp_path / name),
                                **site_label()},
                        on_line=lambda _: None, on_step=lambda *_: None)  # fmt: skip
            made[name] = tag
        (tmp_path / "gone").rmdir()
        assert any(made["gone"] in o.tags[0] for o in find_orphans(engine))
        removed = remove_orphans(engine)
        assert any(made["gone"] in ref for ref in removed)
        assert not any(made["live"] in ref for ref in removed)
        assert store.image_id(made["live"]) and store.image_id(made["gone"]) is None
    finally:
        for ref in made.values():
            with contextlib.suppress(FluffyError):
                store.remove(ref)
