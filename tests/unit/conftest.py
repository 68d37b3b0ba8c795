"""Fixtures shared by unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.unit.mcp_support import local_manager  # noqa: F401 - a fixture of MCP tests


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """A real HTTP client (the provider adapter tests talk to fake servers on loopback)."""
    with httpx.Client() as c:
        yield c
