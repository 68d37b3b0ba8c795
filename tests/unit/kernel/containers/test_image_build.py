"""A build whose reused cache image vanishes mid-build (a concurrent prune) is retried once;
a failed build's clean-up removes its own steps, never another build's in progress."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from fluffy.errors import ImageBuildFailed
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore

pytestmark = pytest.mark.unit


class _Api:
    """Answers each ``build`` with the next scripted stream."""

    def __init__(self, streams: list[list[dict[str, Any]]]) -> None:
        self.streams = streams
        self.builds = 0

    def build(self, **_kwargs: Any) -> Iterator[dict[str, Any]]:
        self.builds += 1
        return iter(self.streams.pop(0))


def _store(api: _Api) -> ImageStore:
    return ImageStore(cast(Engine, SimpleNamespace(client=SimpleNamespace(api=api))))


def _build(store: ImageStore, lines: list[str]) -> str:
    return store.build(
        Path("/nonexistent"),
        "fluffy/env-x:1",
        buildargs={},
        labels={},
        on_line=lines.append,
        on_step=lambda *_: None,
    )


OK: list[dict[str, Any]] = [{"stream": "Step 1/1 : FROM base\n"}, {"aux": {"ID": "sha256:new"}}]
GONE: list[dict[str, Any]] = [
    {"stream": "Step 1/2 : FROM base\n"},
    {"error": "No such image: sha256:b3d8"},
]


VANISHED = [
    "No such image: sha256:b3d8",
    "sha256:b3d8: image not known",
    "failed to get digest sha256:465e: open /var/lib/docker/image/overlay2/imagedb/content/"
    "sha256/465e: no such file or directory",
]


@pytest.mark.parametrize("message", VANISHED)
def test_a_build_whose_cached_image_vanished_is_built_again(message: str) -> None:
    api = _Api([[{"error": message}], OK])
    lines: list[str] = []
    assert _build(_store(api), lines) == "sha256:new"
    assert api.builds == 2
    assert any("removed meanwhile" in line for line in lines)


def test_a_build_that_fails_twice_reports_the_engines_error() -> None:
    api = _Api([GONE, GONE])
    with pytest.raises(ImageBuildFailed, match="No such image") as info:
        _build(_store(api), [])
    assert api.builds == 2
    assert "Step 1/2" in info.value.why


def test_any_other_build_error_is_not_retried() -> None:
    api = _Api([[{"error": "The command '/bin/sh -c pip install' returned a non-zero code: 1"}]])
    with pytest.raises(ImageBuildFailed, match="non-zero code"):
        _build(_store(api), [])
    assert api.builds == 1


class _Images(_Api):
    """Also lists untagged images and removes them."""

    def __init__(self, streams: list[list[dict[str, Any]]], dangling: list[str]) -> None:
        super().__init__(streams)
        self.dangling = dangling
        self.removed: list[str] = []

    def images(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        assert filters == {"dangling": True, "label": "org.fluffy.image"}
        return [{"Id": f"sha256:{image}"} for image in self.dangling]

    def remove_image(self, image: str) -> None:
        self.removed.append(image)


@pytest.mark.parametrize(
    "steps",
    [
        [" ---> Using cache", " ---> dddd99990000", " ---> Running in 0c0ffee00000",
         " ---> aaaa11112222", " ---> Running in 0c0ffee11111",
         " ---> bbbb33334444"],  # Docker's legacy builder
        ["--> Using cache dddd99990000" + "0" * 52, "--> aaaa1111222",
         "--> bbbb3333444"],  # Podman
    ],
)  # fmt: skip
def test_a_failed_build_removes_its_own_steps_not_another_builds(steps: list[str]) -> None:
    stream: list[dict[str, Any]] = [{"stream": "".join(f"{s}\n" for s in steps)}]
    other = "cccc5555666677778888" + "0" * 44  # another process's build, in progress
    reused = "dddd99990000" + "0" * 52  # a step of another build this one reused
    mine = ["aaaa11112222" + "0" * 52, "bbbb33334444" + "0" * 52]
    api = _Images([[*stream, {"error": "RUN failed"}]], dangling=[other, reused, *mine])
    store = _store(api)
    with pytest.raises(ImageBuildFailed):
        _build(store, [])
    store.prune_dangling("org.fluffy.image")
    assert api.removed == mine
    assert "0c0ffee00000" not in store.steps  # a step's container, not an image
