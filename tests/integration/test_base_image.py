"""The base image, and the offline way of making it (the tested path: no registry here)."""

from __future__ import annotations

import contextlib
import os
import shutil

from conftest import run_in_image, unavailable

from fluffy.errors import FluffyError
from fluffy.images.base import base_image_ref, debootstrap_import
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.images import ImageStore

TEST_REF = "fluffy-test/debootstrap:bookworm"


def test_base_image_is_present(engine: Engine, images: dict[str, str]) -> None:
    assert ImageStore(engine).image_id(base_image_ref())


def test_debootstrap_makes_a_base_image_that_runs(engine: Engine, fluffy_home: object) -> None:
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        unavailable(
            "debootstrap needs root and the debootstrap package (scripts/setup installs it)"
        )
    store = ImageStore(engine)
    try:
        debootstrap_import(engine, TEST_REF, log=lambda _msg: None)
        labels = store.inspect(TEST_REF)["Config"]["Labels"]
        assert labels["org.fluffy.base-source"].startswith("debootstrap bookworm")
        code, out, _ = run_in_image(engine, TEST_REF, ["cat", "/etc/debian_version"])
        assert code == 0
        assert out.strip().startswith("12.")
    finally:
        with contextlib.suppress(FluffyError):
            store.remove(TEST_REF)
