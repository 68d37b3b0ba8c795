"""A repository written to attack the machine it is cloned on, against `fluffy env build`.

Each sdist served here carries a build backend whose first act is to write a marker file
at a host path: if any of it ran on this host, the marker is there.  On Docker and Podman:

* the three routes a red-team pass used to run a backend at download time (a URL in
  ``[build-system] requires``, one in a ``-c`` constraints file, one as a uv.lock name):
  refused by file and line, never fetched, the marker never appears;
* a release that really has no wheel is built from its sdist, offline in a container: the
  environment imports it, the build says so, and still no marker on the host;
* one project's own wheels (a trojaned pytest with a build tag) never reach another
  project's environment, nor its own evidence tools;
* a build whose own install rewrites what the build reports (a link and a path that
  climbs out of its folder, named as a generated file) gets neither into the record;
* a build that fails leaves no image a kernel could take for a sandbox image, and the
  next environment is current for both `fluffy env` and the kernel's test run.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import EnvironmentFailed
from fluffy.images.environment import ensure_environment
from fluffy.images.hygiene import find_strays
from fluffy.images.spec import REQUIREMENTS_DIR
from fluffy.images.templates import template_images
from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
from fluffy.kernel.containers.images import ImageStore
from fluffy.kernel.project.envstate import choose
from fluffy.kernel.tools.sandbox.sandboxes import exact_tags, sandbox_images
from tests.conftest import connect_engine
from tests.project_support import fixture_wheels, local_index, make_wheel, pip_env

MARKER = Path("/tmp") / f"fluffy-hostile-marker-{os.getpid()}"  # a path on this host
#: A PEP 517 backend that first tries to leave a mark on the machine it runs on.
BACKEND = """\
import base64, hashlib, os, zipfile
try:
    open({marker!r}, "w").write("the backend ran here")
except OSError:
    pass
NAME, VERSION = {name!r}, "1.0"

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = f"{{NAME}}-{{VERSION}}"
    meta = f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n"
    tag = "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    files = {{f"{{NAME}}.py": "BUILT_IN = 'a container'\\n",
             f"{{dist}}.dist-info/METADATA": meta, f"{{dist}}.dist-info/WHEEL": tag}}
    record = []
    for rel, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{{rel}},sha256={{digest.decode()}},{{len(text.encode())}}")
    record.append(f"{{dist}}.dist-info/RECORD,,")
    name = f"{{dist}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as archive:
        for rel, text in files.items():
            archive.writestr(rel, text)
        archive.writestr(f"{{dist}}.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
"""


def hostile_sdist(dest: Path, name: str) -> Path:
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n',
        "backend.py": BACKEND.format(marker=str(MARKER), name=name),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
    }
    path = dest / f"{name}-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from fluffy.kernel.containers.engine import connect

    with connect() as engine:
        arch = linux_arch(engine.info.arch)
    folder = tmp_path_factory.mktemp("index")
    fixture_wheels(folder, ensure_wheelhouse(REQUIREMENTS_DIR / "code-executor.lock", arch))
    hostile_sdist(folder, "srconly")  # no wheel at all: built from source
    hostile_sdist(folder, "evilurl")  # what the URL routes point at
    with local_index(folder) as url:
        yield url


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


@pytest.fixture(autouse=True)
def no_marker() -> Iterator[None]:
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "a repository's build backend ran on the host"


def build(project: Path, state: Path, runtime: str, index: str, mp: pytest.MonkeyPatch) -> Any:
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        mp.delenv(key)
    for key, value in pip_env(index).items():
        mp.setenv(key, value)
    with connect_engine(runtime) as engine:
        return ensure_environment(engine, project, state, template_images(engine)["code-executor"])


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_repository_cannot_run_code_here_and_sdists_build_in_a_container(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = index.removesuffix("/simple/") + "/evilurl-1.0.tar.gz"
    project = write(tmp_path / "repo", {
        "pyproject.toml": f'[build-system]\nrequires = ["evilurl @ {url}", '
                          '"--extra-index-url=http://127.0.0.1:9/simple"]\n'
                          '[project]\nname = "calc"\nversion = "1"\n'
                          'dependencies = ["fixturelib", "srconly"]\n',
        "requirements.txt": "-c constraints.txt\nfixturedep\n",
        "constraints.txt": f"fixturedep @ {url}\n",
        "uv.lock": f'[[package]]\nname = "fixturedep @ {url}#"\nversion = "1.0"\n',
        "calc/__init__.py": "",
    })  # fmt: skip
    record, built = build(project, tmp_path / "state", runtime, index, monkeypatch)
    assert built and {"fixturelib", "srconly", "fixturedep"} <= set(record.packages)
    refused = "\n".join(record.refused)
    assert f"pyproject.toml:2: 'evilurl @ {url}'" in refused
    assert "--extra-index-url" in refused and "constraints.txt:1" in refused
    assert "uv.lock:2" in refused
    assert record.built_from_source and record.built_from_source[0].startswith("srconly 1.0")
    assert record.image.startswith("fluffy/env-")  # the project's own repository


def test_one_projects_wheels_never_reach_another_project_or_the_evidence(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = write(tmp_path / "a", {"requirements.txt": "fixturelib\npytest\nmylib\n"})
    (a / ".fluffy" / "wheels").mkdir(parents=True)
    make_wheel(a / ".fluffy" / "wheels", "pytest", "99.0", {"pytest.py": "TROJAN = 1\n"})
    make_wheel(a / ".fluffy" / "wheels", "mylib", "1.0", {"mylib.py": "MINE = 1\n"})
    b = write(tmp_path / "b", {"requirements.txt": "fixturelib\npytest\n"})
    record_a, _ = build(a, tmp_path / "state-a", runtime, index, monkeypatch)
    assert record_a.packages["mylib"] == "1.0"  # its own wheel, for itself
    assert record_a.packages["pytest"] != "99.0"  # never its own evidence tool
    assert any("pytest" in note and "package index" in note for note in record_a.warnings)
    record_b, _ = build(b, tmp_path / "state-b", runtime, index, monkeypatch)
    assert record_b.packages["pytest"] == record_a.packages["pytest"] != "99.0"
    assert "mylib" not in record_b.packages and record_a.image != record_b.image


def test_a_failed_build_leaves_nothing_a_kernel_could_take_for_its_image(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connect_engine(runtime) as engine:
        before = {s.image_id for s in find_strays(engine)}
    broken = write(tmp_path / "broken", {"requirements.txt": "badwheel\n"})
    wheels = broken / ".fluffy" / "wheels"
    wheels.mkdir(parents=True)
    # installs only inside the image build, where pip refuses a path out of site-packages
    make_wheel(wheels, "badwheel", "1.0", {"../../../../escape.py": "X = 1\n"})
    with pytest.raises(EnvironmentFailed, match="installing the requirements"):
        build(broken, tmp_path / "state-broken", runtime, index, monkeypatch)
    good = write(tmp_path / "good", {"requirements.txt": "fixturelib\n", "mod.py": ""})
    state = tmp_path / "state-good"
    record, _ = build(good, state, runtime, index, monkeypatch)
    with connect_engine(runtime) as engine:
        left = [s for s in find_strays(engine) if s.image_id not in before]
        chosen = sandbox_images(engine, {})["code-executor"]  # how a kernel in L1 chooses
        current = template_images(engine)["code-executor"]
        image = ImageStore(engine).inspect(chosen)
        strays = {s.image_id for s in find_strays(engine)}
    assert left == [], [s.as_dict() for s in left]
    # an image a fluffy build tagged with its own content hash (this checkout's, or a
    # newer one another checkout on this engine built), never a step of the failed build
    assert exact_tags({**image, "Labels": image["Config"]["Labels"]}, "code-executor")
    assert image["Id"] not in strays
    choice = choose(good, state, current)  # test.run's view, from this checkout's image
    assert choice.current and choice.record is not None and choice.record.key == record.key
    listed = subprocess.run([runtime, "images", "--filter", "dangling=true", "--filter",
                             "label=org.fluffy.image=code-executor", "-q"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert listed.stdout.strip() == ""


#: Installed from the project's own wheel: a .pth runs it in every process of the
#: environment's Python, also the build's own look at what was installed.  It plants a
#: link in the build's folders and makes that look name a file that climbs out of them.
HOOK = """\
import json, os
CLIMB = "l/" + "../" * 5 + "repo/calc.py"
for base in ("/opt/fluffy/env/generated", "/opt/fluffy/env/report/generated"):
    try:
        os.makedirs(base + "/a/b/c/d/e", exist_ok=True)
        os.makedirs(base + "/repo", exist_ok=True)
        open(base + "/repo/calc.py", "w").write("FORGED = 1\\n")
        if not os.path.lexists(base + "/l"):
            os.symlink("a/b/c/d/e", base + "/l")
    except OSError:
        pass
_dumps = json.dumps
def dumps(obj, *a, **k):
    if isinstance(obj, dict) and "packages" in obj:
        obj = {**obj, "generated": [CLIMB]}
    return _dumps(obj, *a, **k)
json.dumps = dumps
"""


#: The project's own in-tree build backend (run in the image build, as designed) puts
#: HOOK where the environment's Python runs it at every start.
PLANT = """
for site in glob.glob("/opt/fluffy/env/lib/python3*/site-packages"):
    try:
        open(site + "/zz_hook.py", "w").write(HOOK)
        open(site + "/zz_hook.pth", "w").write("import zz_hook\\n")
    except OSError:
        pass
"""


def test_a_build_cannot_name_generated_files_outside_its_folder(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team pass 2: the environment's record took the build's word for its generated
    files, and a test view's sync then wrote `l/../../../../../repo/calc.py`."""
    project = write(tmp_path / "repo", {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "hookbackend"\n'
                          'backend-path = ["."]\n[project]\nname = "calc"\nversion = "1"\n',
        "hookbackend.py": f"import glob\nHOOK = {HOOK!r}\n" + PLANT,
        "calc.py": "",
    })  # fmt: skip
    state = tmp_path / "state"
    record, _ = build(project, state, runtime, index, monkeypatch)
    generated = state / "envs" / record.key / "generated"
    assert (generated / "repo" / "calc.py").read_text() == "FORGED = 1\n"  # the hook ran
    assert record.generated == []  # and named nothing a view would lay in
    assert [p for p in generated.rglob("*") if p.is_symlink()] == []
