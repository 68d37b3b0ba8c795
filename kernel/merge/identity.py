"""Who the AI's commit names: the person, and a trailer naming fluffy and the model.

The CLI reads the person's git identity on the host (their repository's and global
configuration, as `git commit` would) and sends it with the task; a session driven
without it (a client's direct ``tool.call``) takes the repository's own ``[user]`` from
``.git/config``, read here as data, and only then fluffy's placeholder.
"""

from __future__ import annotations

import re
from pathlib import Path

from fluffy.errors import FluffyError
from fluffy.kernel.confined_files import read_existing

FALLBACK = {"name": "fluffy", "email": "fluffy@localhost"}
DEFAULT_TRAILER = "Assisted-by: fluffy"
_SECTION = re.compile(r"^\s*\[\s*([A-Za-z0-9.-]+)\s*(?:\"[^\"]*\")?\s*\]\s*$")
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*(.*?)\s*$")
#: What git refuses in an identity (and what would forge another header line).
_BAD = re.compile(r"[<>\x00-\x1f\x7f]")


def clean(name: object, email: object) -> dict[str, str] | None:
    """A usable identity, or None."""
    if not isinstance(name, str) or not isinstance(email, str):
        return None
    name, email = name.strip().strip('"'), email.strip().strip('"')
    if not name or not email or len(name) > 200 or len(email) > 254:
        return None
    if _BAD.search(name) or _BAD.search(email):
        return None
    return {"name": name, "email": email}


def repo_identity(project: Path) -> dict[str, str] | None:
    """``[user] name``/``email`` of the repository's ``.git/config`` (None: not both)."""
    try:
        data = read_existing(project, ".git/config", 1024 * 1024)
    except (OSError, FluffyError):
        return None
    if data is None:
        return None
    section, found = "", {}
    for line in data.decode("utf-8", "replace").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0]
        head = _SECTION.match(line)
        if head:
            section = head.group(1).lower()
            continue
        pair = _KEY.match(line)
        if pair and section == "user" and pair.group(1).lower() in ("name", "email"):
            found[pair.group(1).lower()] = pair.group(2)
    return clean(found.get("name"), found.get("email"))


def with_trailer(message: str, trailer: str) -> str:
    """``message`` as `git commit` leaves it, with ``trailer`` as its last line (once)."""
    body = message.rstrip()
    if not trailer or trailer in body.splitlines():
        return body + "\n"
    last = body.rsplit("\n\n", 1)[-1]
    trailers = all(re.match(r"^[A-Za-z0-9-]+: ", line) for line in last.splitlines() if line)
    joiner = "\n" if "\n\n" in body and trailers else "\n\n"
    return f"{body}{joiner}{trailer}\n"
