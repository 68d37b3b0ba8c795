"""A build whose reused cache image vanishes mid-build (a concurrent prune) is retried once."""

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


@pytest.mark.parametrize("message", ["No such image: sha256:b3d8", "sha256:b3d8: image not known"])
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
