"""Small records the host writes into the kernel's state folder and the kernel reads.

Each is one JSON object holding one list of strings (the approved test commands'
digests, the secret files the person lets tests read).  Only the host writes them; the
kernel's user reads them whatever the host's umask (the bootstrap may have handed the
state folder to that user, and `fluffy start` may write as root).  A record that is
missing or garbled reads as empty: nothing approved, nothing allowed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def read_strings(state: Path, name: str, key: str) -> frozenset[str]:
    """The strings under ``key`` in the record ``name`` (none when unreadable)."""
    try:
        data = json.loads((state / name).read_text())
    except (OSError, ValueError):
        return frozenset()
    found = data.get(key) if isinstance(data, dict) else None
    if not isinstance(found, list):
        return frozenset()
    return frozenset(value for value in found if isinstance(value, str))


def write_strings(state: Path, name: str, key: str, values: Iterable[str]) -> None:
    """Replace the record ``name`` with ``values`` under ``key`` (atomically, sorted)."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = state / (name + ".tmp")
    tmp.write_text(json.dumps({key: sorted(set(values))}))
    tmp.chmod(0o644)  # no secret in it; only the host writes it
    tmp.replace(state / name)
