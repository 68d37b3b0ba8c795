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
from fluffy.images.hygiene import find_orphans, find_strays, remove_orphans
from fluffy.kernel.tools.sandbox.sandboxes import exact_tags, sandbox_images


def _listed(tags: list[str], name: str = "code-executor", digest: str = "ab" * 8,
            created: int = 1) -> dict[str, Any]:  # fmt: skip
    return {"Id": f"sha256:{created:064x}", "RepoTags": tags, "Created": created,
            "Labels": {"org.fluffy.image": name, "org.fluffy.content-hash": digest}}  # fmt: skip


class _Api:
    def __init__(self, images: list[dict[str, Any]]) -> None:
        self._images = images
        self.removed: list[str] = []

    def remove_image(self, ref: str) -> None:
        self.removed.append(ref)

    def images(self, filters: dict[str, Any]) -> list[dict[str, Any]]:  # by one label
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


def _env(folder: str | None, n: int, site: str | None = "here",
         tags: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    image = _listed(tags or [f"fluffy/env-{n:012x}:" + "12" * 8], name="project-env", created=n)
    if folder is not None:
        image["Labels"]["org.fluffy.project-path"] = folder
    if site is not None:
        image["Labels"]["org.fluffy.build-site"] = site
    return image


def test_an_environment_whose_project_folder_is_gone_is_an_orphan(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every engine test run leaves the environments of its temporary projects: `fluffy
    images prune` removes those, never one of a folder that exists or may exist, nor one
    built where other files are seen (a container given the engine's socket)."""
    from fluffy.images import hygiene

    monkeypatch.setattr(hygiene, "build_site", lambda: "here")
    live, gone = tmp_path / "live", tmp_path / "gone"
    live.mkdir()
    (tmp_path / "file").write_text("")
    images = [
        _env(str(live), 1),
        _env(str(gone), 2),  # deleted: an orphan
        _env(str(tmp_path / "file" / "below"), 3),  # a file where a folder was: ENOTDIR
        _env("relative/path", 4),  # not a path this host can judge
        _env(None, 5),  # an older build without the label
        _listed(["fluffy/code-executor:" + "ab" * 8], created=6),
        _env(str(gone), 7, site="a container with the engine's socket"),
        _env(str(gone), 8, site=None),  # built before sites were labelled
        _env("/nul\x00in/label", 9),  # not a path: kept, no crash
        # built FROM an orphan by hand: it inherits the labels, only fluffy's tag goes
        _env(str(gone), 10, tags=["mycorp/ci-base:1.0", "fluffy/env-00000000000a:" + "34" * 8]),
        _env(str(gone), 11, tags=["mycorp/only-mine:2"]),  # nothing of fluffy's: left
    ]
    engine = _engine(images)
    found = find_orphans(engine)
    assert sorted(s.image_id for s in found) == [images[i]["Id"] for i in (1, 2, 9)]
    assert all(str(gone) in s.why or "below" in s.why for s in found)
    strays = {s.image_id for s in find_strays(engine)}  # well tagged: doctor names it apart
    assert not strays & {images[1]["Id"], images[2]["Id"]}
    removed = [images[1]["RepoTags"][0], images[2]["RepoTags"][0], images[9]["RepoTags"][1]]
    assert remove_orphans(engine) == removed
    assert engine.client.api.removed == removed
    monkeypatch.setattr(hygiene, "build_site", lambda: None)  # nowhere known: judge none
    assert find_orphans(engine) == []


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
