"""npm packages downloaded on the host: archives moved, never unpacked or run here.

Each package of a lock (:mod:`fluffy.kernel.project.npmlock`) is fetched by name and
version from one registry -- ``https://registry.npmjs.org``, or the person's
``FLUFFY_NPM_REGISTRY`` (never a URL the repository wrote) -- and kept only when its bytes
match the lock's ``integrity``.  Archives are cached by that integrity under fluffy's
cache folder, so a second build, of this project or another, downloads nothing.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import shutil
import ssl
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.project.npmlock import NodePackage
from fluffy.paths import cache_dir

DEFAULT_REGISTRY = "https://registry.npmjs.org"
REGISTRY_VARIABLE = "FLUFFY_NPM_REGISTRY"
MAX_ARCHIVE_BYTES = 256 * 1024 * 1024
MAX_TOTAL_BYTES = 4 * 1024 * 1024 * 1024
TIMEOUT_S = 60
#: Connections at once (npm's own default is about as many); each is kept alive.
WORKERS = 6
ATTEMPTS = 3
HEADERS = {"User-Agent": "fluffy (npm archives)", "Accept": "application/octet-stream"}


def registry() -> str:
    """The registry packages come from (the person's setting, else npm's)."""
    chosen = os.environ.get(REGISTRY_VARIABLE, "").strip() or DEFAULT_REGISTRY
    try:
        parts = urllib.parse.urlsplit(chosen)
        local = parts.hostname in ("127.0.0.1", "::1", "localhost")
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, local, port_ok = urllib.parse.urlsplit(""), False, False
    secure = parts.scheme == "https" or (parts.scheme == "http" and local)
    if not secure or not parts.hostname or parts.username or parts.query or not port_ok:
        raise EnvironmentFailed(
            f"{REGISTRY_VARIABLE}={chosen[:100]} is not an https URL of a registry",
            why="packages are fetched over HTTPS (plain HTTP only from this machine), from "
            "a registry's address with no user name or query",
            fix=f"Set {REGISTRY_VARIABLE} to your registry's https:// address, or unset it.",
        )
    return chosen.rstrip("/")


def archive_name(integrity: str) -> str:
    """The file an archive is kept as: its checked digest, in hex."""
    algorithm, _, digest = integrity.partition("-")
    return f"{algorithm}-{base64.b64decode(digest).hex()}.tgz"


def matches(data: bytes, integrity: str) -> bool:
    algorithm, _, digest = integrity.partition("-")
    return hashlib.new(algorithm, data).digest() == base64.b64decode(digest)


class _Registry:
    """Keep-alive connections to the registry, one per worker thread: TLS is set up once
    per worker, not once per archive, and a registry or proxy that slows down many new
    connections at once is not met with them.  A proxy the person's environment names
    (``https_proxy``, as urllib reads it) is tunnelled through."""

    def __init__(self, base: str) -> None:
        parts = urllib.parse.urlsplit(base)
        self.base, self.https = base, parts.scheme == "https"
        self.host, self.port = parts.hostname or "", parts.port
        self.prefix = parts.path.rstrip("/")
        self.context = ssl.create_default_context() if self.https else None
        proxy = urllib.request.getproxies().get(parts.scheme)
        bypass = proxy is None or urllib.request.proxy_bypass(self.host)
        self.proxy = None if bypass else urllib.parse.urlsplit(str(proxy))
        self.local = threading.local()
        self.opened: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()

    def close(self) -> None:
        """Close every worker's connection (the workers are done)."""
        with self.lock:
            for connection in self.opened:
                connection.close()
            self.opened.clear()

    def _connection(self) -> http.client.HTTPConnection:
        found: http.client.HTTPConnection | None = getattr(self.local, "connection", None)
        if found is not None:
            return found
        host, port = self.host, self.port
        if self.proxy is not None:
            host, port = self.proxy.hostname or "", self.proxy.port
        made: http.client.HTTPConnection = (
            http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=self.context)
            if self.https
            else http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
        )
        if self.proxy is not None:
            made.set_tunnel(self.host, self.port)
        self.local.connection = made
        with self.lock:
            self.opened.append(made)
        return made

    def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of ``GET path``; a dropped connection or a 5xx/429 is retried."""
        for attempt in range(ATTEMPTS):
            connection = self._connection()
            try:
                connection.request("GET", self.prefix + path, headers=HEADERS)
                answer = connection.getresponse()
                data = answer.read(MAX_ARCHIVE_BYTES + 1)
                if answer.will_close or len(data) > MAX_ARCHIVE_BYTES:
                    self._drop(connection)
                if answer.status in (429, 500, 502, 503, 504) and attempt + 1 < ATTEMPTS:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                return answer.status, data
            except (OSError, http.client.HTTPException):
                self._drop(connection)
                if attempt + 1 == ATTEMPTS:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        self.local.connection = None


def _download(package: NodePackage, registry_: _Registry) -> bytes:
    path = package.tarball("")
    url = registry_.base + path
    try:
        status, data = registry_.get(path)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise EnvironmentFailed(
            f"{package.key} cannot be downloaded from the registry",
            why=f"{url}: {str(exc)[:300] or type(exc).__name__}",
            fix="Check this machine's network, proxy and CA certificates, then run "
            "`fluffy env build` again.",
        ) from None
    if status != 200:
        raise EnvironmentFailed(
            f"{package.key} cannot be downloaded from the registry",
            why=f"{url} answered HTTP {status}",
            fix="Check that the lock's versions are published (or set "
            f"{REGISTRY_VARIABLE} to the registry that has them).",
        )
    if len(data) > MAX_ARCHIVE_BYTES:
        raise EnvironmentFailed(
            f"{package.key}'s archive is larger than {MAX_ARCHIVE_BYTES // 2**20} MiB",
            why="fluffy takes no single package archive larger than that",
            fix="Leave such a package out of the test dependencies.",
        )
    return data


def _one(package: NodePackage, registry_: _Registry, store: Path) -> tuple[str, int]:
    name = archive_name(package.integrity)
    kept = store / name
    if kept.is_file():
        return name, 0
    data = _download(package, registry_)
    if not matches(data, package.integrity):
        raise EnvironmentFailed(
            f"{package.key}'s archive does not match the integrity your lock records",
            why=f"{package.tarball(registry_.base)} served {len(data)} bytes with another "
            f"{package.integrity.partition('-')[0]} digest",
            fix="If the release really changed, regenerate the lock; otherwise your "
            "registry or a proxy serves a changed file.",
        )
    with tempfile.NamedTemporaryFile(dir=store, delete=False, prefix=".part-") as handle:
        handle.write(data)
    Path(handle.name).replace(kept)
    return name, len(data)


def fetch_archives(
    packages: Iterable[NodePackage], dest: Path, say: Callable[[str], None]
) -> dict[str, str]:
    """Every package's archive into ``dest`` (checked, from the cache when there), each
    archive once however many packages share it; package key -> file name in ``dest``.
    The first failure stops the rest; so does passing 4 GiB downloaded."""
    store = cache_dir() / "npm"
    store.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    wanted = list(packages)
    unique = list({p.integrity: p for p in wanted}.values())
    client = _Registry(registry())
    pool = ThreadPoolExecutor(WORKERS)
    downloaded, fresh = 0, 0
    try:
        for future in as_completed([pool.submit(_one, p, client, store) for p in unique]):
            size = future.result()[1]  # the first failure raises here
            downloaded, fresh = downloaded + size, fresh + (1 if size else 0)
            if downloaded > MAX_TOTAL_BYTES:
                raise EnvironmentFailed(
                    f"the packages are larger than {MAX_TOTAL_BYTES // 2**30} GiB in all",
                    why="fluffy stops downloading there: a test environment of that size "
                    "is more likely a mistake (or a hostile lock) than a need",
                    fix="Trim the project's dependencies.",
                )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        client.close()
    say(f"{len(unique)} package archive(s): {fresh} downloaded "
        f"({downloaded / 2**20:.1f} MiB), {len(unique) - fresh} from the cache")  # fmt: skip
    files: dict[str, str] = {}
    for package in wanted:
        name = archive_name(package.integrity)
        target = dest / name
        if not target.exists():
            try:
                os.link(store / name, target)
            except OSError:
                shutil.copyfile(store / name, target)
        files[package.key] = name
    return files
