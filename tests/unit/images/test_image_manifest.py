"""The image manifest survives two builds writing it at once (the test suite's two
workers each build, and a person may run `fluffy images build` meanwhile)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from fluffy.images.builder import ImageStatus, manifest_path, write_manifest
from fluffy.kernel.containers.engine import Engine

pytestmark = pytest.mark.unit


def test_builds_writing_the_manifest_at_once_never_fail_and_leave_it_whole(
    fluffy_home: Path,
) -> None:
    engine = cast(Engine, SimpleNamespace(name="docker", info=SimpleNamespace(url="unix://x")))
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        status = ImageStatus(name, f"fluffy/{name}:1", "1", "sha256:1", "current")
        for _ in range(200):
            try:
                write_manifest(engine, [status])
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("kernel", "code-executor")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    data: dict[str, Any] = json.loads(manifest_path().read_text())
    assert data["engine"] == "docker" and set(data["images"]) <= {"kernel", "code-executor"}
    assert [p.name for p in manifest_path().parent.iterdir()] == ["images.json"]  # no temp
