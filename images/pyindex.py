"""The package index, read as data: a release's source archive, fetched as bytes.

When a requirement has no wheel for the image's platform, its sdist has to be built,
and a build runs the archive's code.  pip cannot fetch an sdist without building its
metadata (running the backend on this machine), so the host does not ask pip: it reads
the index's project page (PEP 503 HTML or PEP 691 JSON) from the indexes the person's pip
is configured with, picks the release, and downloads the archive as bytes, checked
against the index's sha256 when the index gives one.  Nothing of it runs here; the build
happens offline in a container (:mod:`fluffy.images.sdists`).
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import json
import os
import re
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import Version

from fluffy.errors import EnvironmentFailed

DEFAULT_INDEX = "https://pypi.org/simple/"
MAX_PAGE_BYTES = 32 * 1024 * 1024
MAX_SDIST_BYTES = 256 * 1024 * 1024
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_CONFIG_LINE = re.compile(r"^([^=]+?)\s*=\s*'(.*)'$")


@dataclass(frozen=True)
class SourceFile:
    """One sdist of a release on an index."""

    filename: str
    url: str
    version: Version
    sha256: str | None  # as the index gives it (None: it gives none)
    requires_python: str | None = None
    yanked: bool = False


@dataclass(frozen=True)
class PipSettings:
    """What of the person's pip configuration an index read needs."""

    indexes: tuple[str, ...]
    cert: str | None = None

    @classmethod
    def read(cls) -> PipSettings:
        """The index URLs and CA bundle pip would use here (its config and PIP_* vars)."""
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "pip", "config", "list"],
            capture_output=True, text=True, timeout=60, check=False, cwd="/",
        )  # fmt: skip
        found: dict[str, dict[str, str]] = {}
        for line in proc.stdout.splitlines():
            match = _CONFIG_LINE.match(line.strip())
            if match:
                section, _, key = match.group(1).rpartition(".")
                found.setdefault(key, {})[section] = match.group(2)

        def pick(key: str) -> str | None:
            values = found.get(key, {})
            for section in (":env:", "download", "global"):
                if section in values:
                    return values[section]
            return None

        if os.environ.get("PIP_NO_INDEX") or pick("no-index") in ("1", "true", "yes"):
            return cls((), pick("cert"))
        main = pick("index-url") or DEFAULT_INDEX
        extra = (pick("extra-index-url") or "").split()
        return cls(tuple(dict.fromkeys([main, *extra])), pick("cert"))


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


class Index:
    """Reads one or more simple indexes."""

    def __init__(self, settings: PipSettings, timeout: float = 60.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._ssl = ssl.create_default_context(cafile=settings.cert or None)

    def _open(self, url: str, limit: int, accept: str = "*/*") -> tuple[bytes, str]:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "file":
            path = Path(urllib.request.url2pathname(parts.path))
            if path.is_dir():
                path = path / "index.html"
            with path.open("rb") as handle:
                return handle.read(limit + 1)[: limit + 1], "text/html"
        if parts.scheme not in ("http", "https"):
            raise OSError(f"unsupported index URL scheme {parts.scheme!r}")
        headers = {"Accept": accept, "User-Agent": "fluffy (sdist fetch)"}
        if parts.username is not None:  # credentials in the index URL: basic auth
            user, password = (urllib.parse.unquote(x or "") for x in (parts.username,
                                                                       parts.password))  # fmt: skip
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
            host = parts.hostname or ""
            netloc = f"{host}:{parts.port}" if parts.port else host
            url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) only)
        with urllib.request.urlopen(  # noqa: S310 (the scheme is checked above)
            request, timeout=self.timeout, context=self._ssl
        ) as answer:
            return answer.read(limit + 1), answer.headers.get("Content-Type", "")

    def sources(self, name: str) -> list[SourceFile]:
        """Every sdist of ``name`` on the configured indexes (a page that cannot be read
        counts as empty: another index may have it)."""
        project = canonicalize_name(name)
        found: list[SourceFile] = []
        for index in self.settings.indexes:
            page = index.rstrip("/") + f"/{project}/"
            try:
                data, kind = self._open(page, MAX_PAGE_BYTES, ACCEPT)
            except (OSError, ValueError):
                continue
            if len(data) > MAX_PAGE_BYTES:
                continue
            found += _parse_page(page, data, kind, project)
        return found

    def fetch(self, source: SourceFile, dest: Path) -> str:
        """Download ``source`` to ``dest``; its sha256 (checked against the index's)."""
        try:
            data, _ = self._open(source.url, MAX_SDIST_BYTES)
        except (OSError, ValueError) as exc:
            raise EnvironmentFailed(
                f"cannot download {source.filename}",
                why=f"reading {source.url[:200]} failed: {exc}",
                fix="Check that your package index is reachable, then run `fluffy env build`.",
            ) from exc
        if len(data) > MAX_SDIST_BYTES:
            raise EnvironmentFailed(
                f"{source.filename} is larger than {MAX_SDIST_BYTES // 2**20} MiB",
                fix="Pin a release with a wheel, or put a wheel in .fluffy/wheels/.",
            )
        digest = hashlib.sha256(data).hexdigest()
        if source.sha256 is not None and digest != source.sha256:
            raise EnvironmentFailed(
                f"{source.filename} does not match the index's sha256",
                why=f"the index says {source.sha256}, the file downloaded is {digest}",
                fix="Try again; if it persists, the index or a proxy serves a changed file.",
            )
        dest.write_bytes(data)
        return digest


def _parse_page(page: str, data: bytes, kind: str, project: str) -> list[SourceFile]:
    entries: list[tuple[str, str, str | None, str | None, bool]] = []
    if "json" in kind:
        try:
            document = json.loads(data)
        except ValueError:
            return []
        listed = document.get("files") if isinstance(document, dict) else None
        for item in listed if isinstance(listed, list) else []:
            if not isinstance(item, dict):
                continue
            given = item.get("hashes")
            hashes: dict[str, Any] = given if isinstance(given, dict) else {}
            entries.append((str(item.get("filename", "")), str(item.get("url", "")),
                            hashes.get("sha256"), item.get("requires-python"),
                            bool(item.get("yanked"))))  # fmt: skip
    else:
        parser = _Links()
        parser.feed(data.decode("utf-8", "replace"))
        for attrs in parser.links:
            href = attrs.get("href") or ""
            url, _, fragment = href.partition("#")
            digest = fragment[7:] if fragment.startswith("sha256=") else None
            filename = urllib.parse.unquote(url.rstrip("/").rsplit("/", 1)[-1])
            entries.append((filename, url, digest, attrs.get("data-requires-python"),
                            "data-yanked" in attrs))  # fmt: skip
    out: list[SourceFile] = []
    for filename, url, digest, requires_python, yanked in entries:
        try:
            name, version = parse_sdist_filename(filename)
        except InvalidSdistFilename:
            continue
        if name != project or not url:
            continue
        sha = digest.lower() if isinstance(digest, str) and len(digest) == 64 else None
        out.append(SourceFile(filename, urllib.parse.urljoin(page, url), version, sha,
                              requires_python, yanked))  # fmt: skip
    return out


def choose(
    sources: list[SourceFile], wanted: Requirement, constraints: list[str], python: str
) -> SourceFile | None:
    """The newest sdist that ``wanted`` and every constraint on its name admit, for
    ``python``, not yanked (unless pinned exactly); prereleases only if asked for."""
    spec = SpecifierSet(str(wanted.specifier))
    name = canonicalize_name(wanted.name)
    target = {"python_version": ".".join(python.split(".")[:2]), "python_full_version": python}
    for line in constraints:
        constraint = Requirement(line)
        if canonicalize_name(constraint.name) != name:
            continue
        # a lock pins one version per Python range: only the pin for this Python applies
        if constraint.marker is None or constraint.marker.evaluate(target):
            spec &= constraint.specifier
    exact = any(s.operator in ("==", "===") for s in spec)
    best: SourceFile | None = None
    for source in sources:
        if source.yanked and not exact:
            continue
        if not spec.contains(source.version, prereleases=spec.prereleases or None):
            continue
        try:
            if source.requires_python and not SpecifierSet(source.requires_python).contains(python):
                continue
        except InvalidSpecifier:
            pass
        if best is None or source.version > best.version:
            best = source
    return best
