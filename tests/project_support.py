"""Users' projects of every shape, and a package index on loopback for their dependencies.

Tests may not reach PyPI, so the fixtures' dependencies are small wheels made here
(valid wheels: METADATA, WHEEL, RECORD) plus fluffy's own pinned pytest and coverage from
the code-executor wheelhouse, served as a PEP 503 "simple" index on 127.0.0.1.  The
projects install themselves with an in-tree PEP 517/660 build backend (no backend to
download) that, like hatch-vcs, writes a ``_version.py`` into the tree while building.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import os
import re
import shutil
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    dest: Path, name: str, version: str, files: dict[str, str], requires: list[str] = ()
) -> Path:  # type: ignore[assignment]
    """A pure-Python wheel ``name-version-py3-none-any.whl`` in ``dest``."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    content = {**files, f"{dist}.dist-info/METADATA": meta,
               f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: fluffy-tests\n"
               "Root-Is-Purelib: true\nTag: py3-none-any\n"}  # fmt: skip
    path = dest / f"{dist}-py3-none-any.whl"
    record = [_record_line(n, t.encode()) for n, t in content.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as archive:
        for rel, text in content.items():
            archive.writestr(rel, text)
        archive.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def make_sdist(dest: Path, name: str, version: str) -> Path:
    """A source-only distribution (no wheel): the environment must refuse it by name."""
    path = dest / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        data = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
        info = tarfile.TarInfo(f"{name}-{version}/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def fixture_wheels(dest: Path, wheelhouse: Path) -> None:
    """Every distribution the fixture projects ask for (and pytest, coverage)."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheelhouse.glob("*.whl"):  # pytest, coverage and what they need
        shutil.copy2(wheel, dest / wheel.name)
    for version in ("1.0", "2.0"):
        make_wheel(dest, "fixturedep", version, {"fixturedep.py": f"VERSION = {version!r}\n"})
    make_wheel(dest, "fixturelib", "1.0", {"fixturelib.py": "def double(x):\n    return 2 * x\n"},
               ["fixturedep"])  # fmt: skip
    make_wheel(dest, "fixturetest", "1.0", {"fixturetest/__init__.py": "FROZEN = 'yes'\n"})
    make_wheel(dest, "fixturegroup", "1.0", {"fixturegroup.py": "GROUP = True\n"})
    make_wheel(dest, "fixturereq", "1.0", {"fixturereq.py": "REQ = True\n"})
    make_sdist(dest, "fixturesrc", "1.0")


class _Index(SimpleHTTPRequestHandler):
    """``/simple/<name>/`` lists the files of that project; files are served as they are."""

    def log_message(self, *args: object) -> None:
        return

    def do_GET(self) -> None:
        found = re.fullmatch(r"/simple/([^/]+)/?", self.path)
        if found is None:
            super().do_GET()
            return
        wanted = re.sub(r"[-_.]+", "-", found.group(1)).lower()
        links = []
        for item in sorted(os.listdir(self.directory)):
            project = re.split(r"-\d", item, maxsplit=1)[0]
            if re.sub(r"[-_.]+", "-", project).lower() == wanted:
                links.append(f'<a href="/{html.escape(item)}">{html.escape(item)}</a><br>')
        body = ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()
        self.send_response(200 if links else 404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def local_index(folder: Path) -> Iterator[str]:
    """A simple index of ``folder`` on 127.0.0.1; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Index, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def pip_env(index_url: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for host-side downloads from ``index_url`` only."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("PIP_")}
    env.update(PIP_INDEX_URL=index_url, PIP_CONFIG_FILE=os.devnull, PIP_DEFAULT_TIMEOUT="30")
    return env


BACKEND = '''\
"""A tiny in-tree PEP 517/660 build backend (like hatch-vcs, it writes _version.py)."""
import base64, hashlib, os, zipfile

NAME, PACKAGE, ROOT = "{name}", "{package}", "{root}"


def _version():
    return os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION", "0.0.0")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _wheel(directory, files):
    dist = f"{{NAME}}-{{_version()}}"
    files = dict(files)
    meta = f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{_version()}}\\n"
    files[f"{{dist}}.dist-info/METADATA"] = meta
    tag = "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    files[f"{{dist}}.dist-info/WHEEL"] = tag
    record = []
    for name, text in files.items():
        raw = hashlib.sha256(text.encode()).digest()
        digest = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        record.append(f"{{name}},sha256={{digest}},{{len(text.encode())}}")
    record.append(f"{{dist}}.dist-info/RECORD,,")
    filename = f"{{dist}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, filename), "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{{dist}}.dist-info/RECORD", "\\n".join(record) + "\\n")
    return filename


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.path.join(ROOT, PACKAGE, "_version.py"), "w") as handle:
        handle.write(f"__version__ = {{_version()!r}}\\n")
    return _wheel(wheel_directory, {{f"_{{NAME}}.pth": os.path.abspath(ROOT) + "\\n"}})


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {{}})
'''


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TESTS_GREEN = (
    "from {module} import double_it\n\n\ndef test_double():\n    assert double_it(2) == 4\n"
)


def shape(root: Path, kind: str) -> dict[str, str]:
    """Make a project of ``kind`` at ``root`` (a git repository with one commit); what a
    session adds: the module its new test imports, and where the code goes."""
    calc = "def double_it(x):\n    return 2 * x\n"
    if kind == "src":  # runtime dependency, test extra, in-tree backend, generated file
        _write(root, {
            "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "fixture_backend"\n'
            'backend-path = ["_backend"]\n[project]\nname = "calc"\ndynamic = ["version"]\n'
            'dependencies = ["fixturelib"]\n[project.optional-dependencies]\ntests = '
            '["fixturetest"]\n[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n',
            "_backend/fixture_backend.py": BACKEND.format(name="calc", package="calc", root="src"),
            "src/calc/__init__.py": "from ._version import __version__\n" + calc,
            "tests/test_calc.py": "import fixturelib, fixturetest\nfrom importlib.metadata import "
            "version\nfrom calc import __version__, double_it\n\n\ndef test_env():\n"
            "    assert fixturelib.double(2) == double_it(2) and fixturetest.FROZEN == 'yes'\n"
            "    assert version('calc') == __version__\n",
            ".gitignore": "src/calc/_version.py\n",
        })  # fmt: skip
        where = {"module": "calc.extra", "code": "src/calc/extra.py"}
    elif kind == "flat":  # a dependency group, no build system
        _write(root, {
            "pyproject.toml": '[project]\nname = "flatpkg"\nversion = "1"\n[dependency-groups]\n'
            'test = ["fixturegroup"]\n',
            "flatpkg/__init__.py": calc,
            "tests/test_flat.py": "import fixturegroup\nfrom flatpkg import double_it\n\n\n"
            "def test_flat():\n    assert fixturegroup.GROUP and double_it(1) == 2\n",
        })  # fmt: skip
        where = {"module": "flatpkg.extra", "code": "flatpkg/extra.py"}
    elif kind == "requirements":  # requirements files, a single module
        _write(root, {
            "requirements.txt": "fixturereq\n", "requirements-dev.txt": "-r requirements.txt\n"
            "fixturelib\n", "calc.py": calc,
            "test_calc.py": "import fixturelib, fixturereq\nfrom calc import double_it\n\n\n"
            "def test_req():\n    assert fixturereq.REQ and fixturelib.double(1) == double_it(1)\n",
        })  # fmt: skip
        where = {"module": "extra", "code": "extra.py"}
    elif kind == "lock":  # uv.lock pins fixturedep 1.0 while 2.0 is the newest
        _write(root, {
            "pyproject.toml": '[project]\nname = "locked"\nversion = "1"\ndependencies = '
            '["fixturedep"]\n',
            "uv.lock": 'version = 1\n[[package]]\nname = "fixturedep"\nversion = "1.0"\n'
            'source = { registry = "https://pypi.org/simple" }\n[[package]]\nname = "locked"\n'
            'version = "1"\nsource = { editable = "." }\n',
            "src/locked/__init__.py": calc,
            "tests/test_lock.py": "import fixturedep\nfrom locked import double_it\n\n\n"
            "def test_lock():\n    assert fixturedep.VERSION == '1.0' and double_it(2) == 4\n",
        })  # fmt: skip
        where = {"module": "locked.extra", "code": "src/locked/extra.py"}
    elif kind == "plain":  # no dependencies at all
        _write(root, {"calc.py": calc, "tests/test_calc.py": TESTS_GREEN.format(module="calc")})
        where = {"module": "extra", "code": "extra.py"}
    else:
        raise ValueError(kind)
    env = {**os.environ, **GIT}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env, capture_output=True)
    return where


CODE = "def triple(x):\n    return 3 * x\n"


def session_steps(where: dict[str, str]) -> list[dict[str, object]]:
    """A model's natural TDD session: a test importing the code it is about to write (red),
    the code (green), the commit."""
    module, code = where["module"], where["code"]
    test = f"from {module} import triple\n\n\ndef test_triple():\n    assert triple(3) == 9\n"
    test_path = "tests/test_extra.py" if "/" in code or module != "extra" else "test_extra.py"
    return [
        {"tool": "plan.complete", "args": {"summary": "triple, test first"}},
        {"tool": "fs.write", "args": {"path": test_path, "content": test}},
        {"tool": "test.run", "args": {"paths": [test_path]}, "expect": {"state": "code_writing"}},
        {"tool": "fs.write", "args": {"path": code, "content": CODE}},
        {"tool": "test.run", "args": {}, "expect": {"state": "committing"}},
        {"tool": "git.commit", "args": {"message": "Add triple"}, "expect": {"state": "idle"}},
    ]


#: A ``conftest.py`` whose report hook turns every failure into a pass: the forgery a
#: cloned repository (or a model) ships to make wrong code "green".
REWRITES_FAILURES = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
"""
