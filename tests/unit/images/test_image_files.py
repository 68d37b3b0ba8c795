"""Files read out of an image a repository's build helped make are bounded and
unpacked safely (images.imagefiles)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import EnvironmentFailed
from fluffy.images.imagefiles import copy_from_image


class _Api:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.removed = chunks, []

    def create_container(self, image: str, **_: Any) -> dict[str, str]:
        return {"Id": "c-" + image}

    def get_archive(self, container: str, path: str) -> tuple[Any, dict[str, Any]]:
        return iter(self.chunks), {}

    def remove_container(self, container: str, force: bool) -> None:
        self.removed.append(container)


def _engine(api: _Api) -> Any:
    return SimpleNamespace(client=SimpleNamespace(api=api))


def _tar(members: dict[str, bytes], link: tuple[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return buffer.getvalue()


def test_an_archive_larger_than_the_limit_is_refused_and_the_container_removed(
    tmp_path: Path,
) -> None:
    api = _Api([b"x" * 1024] * 5)
    with pytest.raises(EnvironmentFailed, match="larger than"):
        copy_from_image(_engine(api), "img", "/wheel-out", tmp_path, limit=4096)
    assert api.removed == ["c-img"] and list(tmp_path.iterdir()) == []


def test_files_are_unpacked_and_a_link_out_is_refused(tmp_path: Path) -> None:
    api = _Api([_tar({"wheel-out/x-1-py3-none-any.whl": b"PK"})])
    copy_from_image(_engine(api), "img", "/wheel-out", tmp_path / "ok")
    assert (tmp_path / "ok" / "wheel-out" / "x-1-py3-none-any.whl").read_bytes() == b"PK"
    api = _Api([_tar({}, link=("report/l", "/etc"))])
    with pytest.raises(EnvironmentFailed, match="holds what fluffy does not unpack"):
        copy_from_image(_engine(api), "img", "/report", tmp_path / "bad")
    assert api.removed == ["c-img"]
