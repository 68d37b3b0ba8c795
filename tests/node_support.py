"""JavaScript projects for tests: npm packages made here, a registry on loopback, lock files.

``tinyfmt`` (1.0.0) exports ``pad`` and depends on ``tinycore`` (2.0.0, ``repeat``); a
project depends on ``tinyfmt`` and locks it in one of npm's, pnpm's or yarn's lock files,
each with the archives' real integrity, so fluffy's host side fetches them from
:func:`npm_registry` exactly as it would from npm's.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    data: bytes
    deps: dict[str, str]

    @property
    def integrity(self) -> str:
        return "sha512-" + base64.b64encode(hashlib.sha512(self.data).digest()).decode()

    @property
    def path(self) -> str:
        return f"/{self.name}/-/{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"


def tarball(files: dict[str, str | bytes], top: str = "package") -> bytes:
    """A package archive: ``files`` under ``top/`` (npm's own archives use ``package/``)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


#: Where an install script of the packages below would leave its mark (none may run).
SCRIPT_MARK = "/tmp/fluffy-install-script-ran"
SCRIPTS = {
    hook: f"node -e \"require('fs').writeFileSync('{SCRIPT_MARK}', '{hook}')\""
    for hook in ("preinstall", "install", "postinstall", "prepare")
}


def package(name: str, version: str, code: str, deps: dict[str, str] | None = None) -> Package:
    manifest = {"name": name, "version": version, "type": "module", "main": "index.js",
                "dependencies": deps or {}, "scripts": SCRIPTS}  # fmt: skip
    data = tarball({"package.json": json.dumps(manifest), "index.js": code})
    return Package(name, version, data, deps or {})


TINYCORE = package("tinycore", "2.0.0", "export const repeat = (s, n) => s.repeat(n);\n")
TINYFMT = package(
    "tinyfmt",
    "1.0.0",
    "import { repeat } from 'tinycore';\n"
    "export const pad = (s, n) => repeat(' ', Math.max(0, n - s.length)) + s;\n",
    {"tinycore": "^2.0.0"},
)
PACKAGES = (TINYFMT, TINYCORE)


@contextmanager
def npm_registry(
    packages: tuple[Package, ...] = PACKAGES,
    *,
    flaky: int = 0,
    ports: list[int] | None = None,
    slow_s: float = 0.0,
) -> Iterator[tuple[str, list[str]]]:
    """A registry of ``packages`` on 127.0.0.1: (its URL, the paths asked for).  The first
    ``flaky`` requests get a 503; ``ports`` collects each request's client port; each
    archive is answered after ``slow_s`` (a 404 at once)."""
    served = {p.path: p.data for p in packages}
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as registries answer

        def do_GET(self) -> None:
            nonlocal flaky
            asked.append(self.path)
            if ports is not None:
                ports.append(self.client_address[1])
            data = served.get(self.path)
            if flaky > 0:
                flaky -= 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if data is not None:
                time.sleep(slow_s)
            self.send_response(200 if data is not None else 404)
            self.send_header("Content-Length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def npm_lock() -> str:
    return json.dumps({
        "name": "calc", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
        "packages": {
            "": {"name": "calc", "version": "1.0.0", "devDependencies": {"tinyfmt": "^1.0.0"}},
            "node_modules/tinycore": {
                "version": "2.0.0", "dev": True, "integrity": TINYCORE.integrity,
                "resolved": f"https://registry.npmjs.org{TINYCORE.path}",
            },
            "node_modules/tinyfmt": {
                "version": "1.0.0", "dev": True, "integrity": TINYFMT.integrity,
                "resolved": f"https://registry.npmjs.org{TINYFMT.path}",
                "dependencies": {"tinycore": "^2.0.0"},
            },
        },
    }, indent=2)  # fmt: skip


def pnpm_lock() -> str:
    return (
        "lockfileVersion: '9.0'\n\nimporters:\n\n  .:\n    devDependencies:\n"
        "      tinyfmt:\n        specifier: ^1.0.0\n        version: 1.0.0\n\n"
        "packages:\n\n"
        f"  tinycore@2.0.0:\n    resolution: {{integrity: {TINYCORE.integrity}}}\n\n"
        f"  tinyfmt@1.0.0:\n    resolution: {{integrity: {TINYFMT.integrity}}}\n\n"
        "snapshots:\n\n  tinycore@2.0.0: {}\n\n"
        "  tinyfmt@1.0.0:\n    dependencies:\n      tinycore: 2.0.0\n"
    )


def yarn_lock() -> str:
    return (
        "# THIS IS AN AUTOGENERATED FILE. DO NOT EDIT THIS FILE DIRECTLY.\n# yarn lockfile v1\n\n\n"
        'tinycore@^2.0.0:\n  version "2.0.0"\n'
        f'  resolved "https://registry.yarnpkg.com{TINYCORE.path}#abc"\n'
        f"  integrity {TINYCORE.integrity}\n\n"
        'tinyfmt@^1.0.0:\n  version "1.0.0"\n'
        f'  resolved "https://registry.yarnpkg.com{TINYFMT.path}#def"\n'
        f"  integrity {TINYFMT.integrity}\n"
        '  dependencies:\n    tinycore "^2.0.0"\n'
    )


LOCKS = {"npm": ("package-lock.json", npm_lock), "pnpm": ("pnpm-lock.yaml", pnpm_lock),
         "yarn": ("yarn.lock", yarn_lock)}  # fmt: skip


def node_project(root: Path, manager: str) -> None:
    """A project of ES modules tested with node's runner, depending on ``tinyfmt``."""
    name, render = LOCKS[manager]
    files = {
        "package.json": json.dumps(
            {
                "name": "calc",
                "version": "1.0.0",
                "type": "module",
                "scripts": {"test": "node --test"},
                "devDependencies": {"tinyfmt": "^1.0.0"},
            },
            indent=2,
        ),
        name: render(),
        "src/calc.js": "import { pad } from 'tinyfmt';\n\n"
        "export function show(x) {\n  return pad(String(x), 3);\n}\n",
        "test/calc.test.js": "import { test } from 'node:test';\nimport assert from "
        "'node:assert/strict';\nimport { show } from '../src/calc.js';\n\n"
        "test('show pads', () => {\n  assert.equal(show(7), '  7');\n});\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
