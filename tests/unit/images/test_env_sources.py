"""Where a project environment's files come from: the index as data, hashes, no sharing.

A hostile repository must not make the host run its code (an sdist's backend at
download time) nor hand another project a wheel of its own; a lock's hashes bind what is
downloaded.  pip runs for real here, against a package index served on 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fluffy.errors import EnvironmentFailed, WheelHashMismatch
from fluffy.images.envdownload import check_hashes, own_wheels, pip_download, sha256_file
from fluffy.images.pyindex import Index, PipSettings, SourceFile, _parse_page, choose
from fluffy.images.sdists import LEGACY_BUILD, build_requires
from tests.project_support import local_index, make_wheel

ARCH = "x86_64"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("index")
    make_wheel(folder, "alpha", "1.0", {"alpha.py": "A = 1\n"}, ["beta"])
    make_wheel(folder, "beta", "1.0", {"beta.py": "B = 1\n"})
    source = folder / "onlysrc-1.0.tar.gz"
    with tarfile.open(source, "w:gz") as tar:
        data = b"[build-system]\nrequires = ['flit_core>=3']\n"
        info = tarfile.TarInfo("onlysrc-1.0/pyproject.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with local_index(folder) as url:
        yield url, folder


@pytest.fixture
def pip_index(index: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    import os

    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_INDEX_URL", index[0])
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return index[0]


def test_wheels_download_and_the_release_without_one_is_named(
    pip_index: str, tmp_path: Path
) -> None:
    dest = tmp_path / "wheels"
    assert pip_download(["alpha"], [], dest, [], ARCH, "requirement") is None
    assert sorted(p.name for p in dest.glob("*.whl")) == [
        "alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl"]  # fmt: skip
    missing = pip_download(["alpha", "onlysrc>=0.5"], [], dest, [], ARCH, "requirement")
    assert missing is not None and str(missing) == "onlysrc>=0.5"
    with pytest.raises(EnvironmentFailed, match="refusing"):  # the last guard before pip
        pip_download(["x @ http://127.0.0.1:9/x.tar.gz"], [], dest, [], ARCH, "requirement")


def test_a_file_the_lock_does_not_record_is_refused(pip_index: str, tmp_path: Path) -> None:
    dest = tmp_path / "wheels"
    assert pip_download(["beta==1.0"], [], dest, [], ARCH, "requirement") is None
    real = sha256_file(dest / "beta-1.0-py3-none-any.whl")
    check_hashes(dest, {"beta==1.0": {real, "0" * 64}}, set())  # one of them: fine
    with pytest.raises(WheelHashMismatch) as caught:
        check_hashes(dest, {"beta==1.0": {"0" * 64}}, set())
    assert real in caught.value.why and "beta-1.0" in caught.value.what
    check_hashes(dest, {"beta==1.0": {"0" * 64}}, {real})  # the repository's own: its choice


def test_a_repositorys_own_wheels_never_supply_the_evidence_tools(tmp_path: Path) -> None:
    project = tmp_path / "repo"
    wheels = project / ".fluffy" / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels, "pytest", "99", {"pytest.py": "TROJAN = 1\n"})
    make_wheel(wheels, "pluggy", "99", {"pluggy.py": "TROJAN = 1\n"})
    make_wheel(wheels, "mylib", "1.0", {"mylib.py": "X = 1\n"})
    make_wheel(wheels, "innocent", "1.0", {"_pytest/runner.py": "TROJAN = 1\n"})
    make_wheel(wheels, "startup", "1.0", {"zz.pth": "import os\n"})
    data = "datapth-1.0.data/data/lib/python3.11/site-packages/zz.pth"
    make_wheel(wheels, "datapth", "1.0", {data: "import os\n"})
    lib = "datalib-1.0.data/data/lib/python3.11/site-packages/_pytest/runner.py"
    make_wheel(wheels, "datalib", "1.0", {lib: "TROJAN = 1\n"})
    make_wheel(wheels, "shadow", "1.0", {"shadow-1.0.data/scripts/python3": "#!/bin/sh\n"})
    make_wheel(wheels, "binpy", "1.0", {"binpy-1.0.data/data/bin/pytest": "#!/bin/sh\n"})
    make_wheel(wheels, "venvcfg", "1.0", {"venvcfg-1.0.data/data/pyvenv.cfg": "home = /x\n"})
    entry = "[console_scripts]\nfine = ep:main\nPython3 = ep:main\n"
    make_wheel(wheels, "ep", "1.0", {"ep.py": "", "ep-1.0.dist-info/entry_points.txt": entry})
    make_wheel(wheels, "docs", "1.0", {"docs-1.0.data/data/share/man/man1/docs.1": "x\n",
                                       "docs.py": ""})  # fmt: skip
    make_wheel(wheels, "tool", "1.0", {"tool-1.0.data/scripts/mytool": "#!/bin/sh\n",
                                       "tool.py": "X = 1\n"})  # fmt: skip
    (wheels / "notes.txt").write_text("not a wheel")
    (wheels / "evil-1.0-py3-none-any.whl").symlink_to("/etc/passwd")
    notes: list[str] = []
    copied = own_wheels(project, tmp_path / "own", notes)
    kept = ["docs-1.0-py3-none-any.whl", "mylib-1.0-py3-none-any.whl", "tool-1.0-py3-none-any.whl"]
    assert sorted(copied.values()) == kept
    assert sorted(p.name for p in (tmp_path / "own").iterdir()) == kept
    assert any("pytest" in n and "package index" in n for n in notes)
    assert any("innocent" in n and "_pytest" in n for n in notes)
    assert any("startup" in n and "zz.pth" in n for n in notes)
    assert any("datapth" in n and "site-packages/zz.pth" in n for n in notes)
    assert any("datalib" in n and "interpreter's own folders" in n for n in notes)
    assert any("shadow" in n and "command python3" in n for n in notes)
    assert any("binpy" in n and "bin/pytest" in n for n in notes)
    assert any("venvcfg" in n and "pyvenv.cfg" in n for n in notes)
    assert any("ep-1.0" in n and "command Python3" in n for n in notes)


def test_index_pages_as_html_and_json_and_the_release_chosen() -> None:
    page = "http://127.0.0.1/simple/demo/"
    html = (
        '<a href="../../files/demo-1.0.tar.gz#sha256=' + "a" * 64 + '">demo-1.0.tar.gz</a>'
        '<a href="/files/demo-2.0.tar.gz" data-requires-python="&gt;=3.12">demo-2.0.tar.gz</a>'
        '<a href="/files/demo-1.5.zip" data-yanked="">demo-1.5.zip</a>'
        '<a href="/files/demo-1.4-py3-none-any.whl">wheel</a>'
        '<a href="/files/other-9.0.tar.gz">other-9.0.tar.gz</a>'
    )
    found = _parse_page(page, html.encode(), "text/html", "demo")
    assert [(f.filename, f.sha256) for f in found] == [
        ("demo-1.0.tar.gz", "a" * 64),
        ("demo-2.0.tar.gz", None),
        ("demo-1.5.zip", None),
    ]
    assert found[0].url == "http://127.0.0.1/files/demo-1.0.tar.gz"
    wanted = Requirement("demo>=1")
    assert choose(found, wanted, [], "3.11").filename == "demo-1.0.tar.gz"  # type: ignore[union-attr]
    assert choose(found, Requirement("demo==1.5"), [], "3.11").filename == "demo-1.5.zip"  # type: ignore[union-attr]
    assert choose(found, wanted, ["demo<1"], "3.11") is None  # a constraint applies
    # a lock's pins per Python range (tomlkit's poetry.lock): only this Python's applies
    pins = ['demo==1.5; python_version < "3.10"', 'demo==1.0; python_version >= "3.10"']
    assert choose(found, wanted, pins, "3.11").filename == "demo-1.0.tar.gz"  # type: ignore[union-attr]
    assert choose(found, wanted, pins, "3.9.18").filename == "demo-1.5.zip"  # type: ignore[union-attr]
    document = {"files": [{"filename": "demo-3.0.tar.gz", "url": "https://x/demo-3.0.tar.gz",
                           "hashes": {"sha256": "B" * 64}}]}  # fmt: skip
    parsed = _parse_page(page, json.dumps(document).encode(), "application/vnd.pypi.simple.v1+json",
                         "demo")  # fmt: skip
    assert parsed == [SourceFile("demo-3.0.tar.gz", "https://x/demo-3.0.tar.gz",
                                 parsed[0].version, "b" * 64)]  # fmt: skip


def test_an_sdist_is_fetched_as_bytes_and_its_hash_checked(
    index: tuple[str, Path], tmp_path: Path
) -> None:
    url, folder = index
    reader = Index(PipSettings((url,)))
    (source,) = reader.sources("OnlySrc")
    digest = reader.fetch(source, tmp_path / source.filename)
    assert digest == sha256_file(folder / "onlysrc-1.0.tar.gz")
    assert build_requires(tmp_path / source.filename) == ["flit_core>=3"]
    forged = SourceFile(source.filename, source.url, source.version, "f" * 64)
    with pytest.raises(EnvironmentFailed, match="does not match the index"):
        reader.fetch(forged, tmp_path / "forged.tar.gz")
    assert not (tmp_path / "forged.tar.gz").exists()


def test_an_sdist_whose_build_requires_name_a_url_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "bad-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"[build-system]\nrequires = ['x @ http://127.0.0.1:9/x.tar.gz']\n"
        info = tarfile.TarInfo("bad-1.0/pyproject.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(EnvironmentFailed, match="build requirement fluffy does not fetch"):
        build_requires(archive)
    plain = tmp_path / "plain-1.0.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("plain-1.0/setup.py"), io.BytesIO(b""))
    assert build_requires(plain) == LEGACY_BUILD


def test_a_link_in_the_project_is_copied_as_a_link_never_followed(tmp_path: Path) -> None:
    """`leak -> /proc/self/environ` copied the CLI's environment (API keys) into the
    environment's build context (issue 31's red team)."""
    from fluffy.images.envstage import Stager

    project = tmp_path / "repo"
    project.mkdir()
    (project / "mod.py").write_text("X = 1\n")
    (project / "leak-environ").symlink_to("/proc/self/environ")
    (project / "leak-home").symlink_to(Path.home())
    (project / "dangling").symlink_to(tmp_path / "nowhere")
    stager = Stager.__new__(Stager)  # copy_project needs nothing of the engine
    dest = tmp_path / "context" / "project"
    stager.copy_project(project, dest)
    assert (dest / "mod.py").read_text() == "X = 1\n"
    for name, target in (("leak-environ", "/proc/self/environ"), ("leak-home", str(Path.home())),
                         ("dangling", str(tmp_path / "nowhere"))):  # fmt: skip
        assert (dest / name).is_symlink() and str((dest / name).readlink()) == target


def test_the_persons_secret_files_never_reach_the_projects_own_install(tmp_path: Path) -> None:
    """The install runs the project's code (setup.py, a build backend): it could copy
    .env into a file the tests read.  Untracked secret files are left out of its copy."""
    from fluffy.images.envstage import Stager
    from fluffy.kernel.project.testsecrets import SecretFiles

    project = tmp_path / "repo"
    (project / "keys").mkdir(parents=True)
    (project / "setup.py").write_text("import shutil; shutil.copy('.env', 'pkg/_cfg.py')\n")
    (project / ".env").write_text("TOKEN=hunter2\n")  # no repository: nothing tracked
    (project / "keys" / "deploy.key").write_text("KEY\n")
    stager = Stager.__new__(Stager)  # copy_project needs nothing of the engine
    dest = tmp_path / "context" / "project"
    stager.copy_project(project, dest, SecretFiles(project, tmp_path / "state").hidden())
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == ["setup.py"]
