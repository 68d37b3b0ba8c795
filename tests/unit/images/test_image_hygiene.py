"""Only an image tagged with exactly its content hash is ever a sandbox image (issue 31).

A failed environment build left an untagged step image that inherited the code-executor
label; Docker 20.10 lists it as ``<none>:<none>`` and the kernel in L1 took it as its
code-executor image.  Here: the kernel's choice by label, and ``fluffy doctor``'s list of
stray images, over engine listings shaped as Docker and Podman give them.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import ImageNotFound
from fluffy.images.hygiene import find_strays
from fluffy.kernel.tools.sandbox.sandboxes import exact_tags, sandbox_images


def _listed(tags: list[str], name: str = "code-executor", digest: str = "ab" * 8,
            created: int = 1) -> dict[str, Any]:  # fmt: skip
    return {"Id": f"sha256:{created:064x}", "RepoTags": tags, "Created": created,
            "Labels": {"org.fluffy.image": name, "org.fluffy.content-hash": digest}}  # fmt: skip


class _Api:
    def __init__(self, images: list[dict[str, Any]]) -> None:
        self._images = images

    def images(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        label = str(filters.get("label", ""))
        key, _, value = label.partition("=")
        return [i for i in self._images
                if key in i["Labels"] and (not value or i["Labels"][key] == value)]  # fmt: skip


def _engine(images: list[dict[str, Any]]) -> Any:
    return SimpleNamespace(client=SimpleNamespace(api=_Api(images)))


def test_an_untagged_or_mistagged_image_is_never_taken_for_a_sandbox_image() -> None:
    good = _listed(["fluffy/code-executor:" + "ab" * 8], created=1)
    step = _listed(["<none>:<none>"], created=9)  # a failed env build's step: newest
    retag = _listed(["fluffy/code-executor:" + "cd" * 8], created=8)  # tag != its label
    podman = _listed(["localhost/fluffy/code-executor:" + "ab" * 8])
    assert exact_tags(step, "code-executor") == [] and exact_tags(retag, "code-executor") == []
    assert exact_tags(podman, "code-executor") == ["localhost/fluffy/code-executor:" + "ab" * 8]
    others = [_listed([f"fluffy/{n}:" + "ab" * 8], name=n)
              for n in ("ai-provider", "policy-sandbox")]  # fmt: skip
    chosen = sandbox_images(_engine([good, step, retag, *others]), {})
    assert chosen["code-executor"] == "fluffy/code-executor:" + "ab" * 8
    with pytest.raises(ImageNotFound, match="no code-executor image"):
        sandbox_images(_engine([step, retag, *others]), {})
    named = {"code-executor": "fluffy/code-executor:" + "ef" * 8}  # the bootstrap's manifest
    assert sandbox_images(_engine([step, *others]), {"FLUFFY_IMAGES": json.dumps(named)})[
        "code-executor"] == named["code-executor"]  # fmt: skip


def test_doctor_names_stray_fluffy_images() -> None:
    from fluffy.images.spec import IMAGES

    digest = "ab" * 8
    fine = [_listed([f"fluffy/{spec.name}:{digest}"], name=spec.name) for spec in IMAGES]
    fine.append(_listed(["fluffy/env-0123456789ab:" + "12" * 8], name="project-env"))
    fine.append(_listed(["localhost/fluffy/mcp-server:" + "34" * 12], name="mcp-server"))
    strays = [
        _listed(["<none>:<none>"], created=2),
        _listed([], name="build-stage", created=3),
        _listed(["fluffy/project-env:" + "56" * 8], name="project-env", created=4),
        _listed(["fluffy/sdist-build:" + "78" * 12], name="build-stage", created=5),
        _listed(["mine/code-executor:latest"], created=6),
    ]
    found = find_strays(_engine([*fine, *strays]))
    assert sorted(s.image_id for s in found) == sorted(s["Id"] for s in strays)
    assert all(s.why for s in found)


def test_the_host_pins_the_images_it_built_for_the_kernel(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fluffy` names its own builds for L1 (a newer build of another checkout or version,
    exact tag and all, is not taken), and the kernel reads them from its state folder."""
    from fluffy.cli import lifecycle
    from fluffy.kernel.tools.sandbox import sandboxes

    assert lifecycle.PINNED_IMAGES == sandboxes.PINNED_IMAGES
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    state = tmp_path / "state"
    lifecycle.pin_images(state)  # no manifest: nothing pinned
    assert sandboxes.pinned_images(state) == {}
    manifest = tmp_path / "home" / "state" / "images.json"
    manifest.parent.mkdir(parents=True)
    mine = "fluffy/code-executor:" + "ab" * 8
    manifest.write_text(json.dumps({"images": {"code-executor": {"ref": mine}}}))
    lifecycle.pin_images(state)
    assert sandboxes.pinned_images(state) == {"code-executor": mine}
    newer = _listed(["fluffy/code-executor:" + "cd" * 8], digest="cd" * 8, created=99)
    others = [
        _listed([f"fluffy/{n}:" + "ab" * 8], name=n) for n in ("ai-provider", "policy-sandbox")
    ]
    chosen = sandbox_images(_engine([newer, *others]), {}, None, sandboxes.pinned_images(state))
    assert chosen["code-executor"] == mine
