"""Fixtures the engine tests share."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import connect_engine


@pytest.fixture(scope="module")
def built_on() -> Callable[[str], None]:
    """Build fluffy's images on an engine once per module (unchanged ones are kept)."""
    from fluffy.images.builder import build_images

    built: set[str] = set()

    def ensure(runtime: str) -> None:
        if runtime not in built:
            with connect_engine(runtime) as connected:
                build_images(connected)
            built.add(runtime)

    return ensure
