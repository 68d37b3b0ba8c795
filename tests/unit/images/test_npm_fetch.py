"""npm archives fetched on the host: by name and version, checked, cached by integrity."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from fluffy.errors import EnvironmentFailed
from fluffy.images.npmfetch import REGISTRY_VARIABLE, WORKERS, fetch_archives, registry
from fluffy.kernel.project.npmlock import NodePackage
from tests.node_support import PACKAGES, TINYCORE, TINYFMT, npm_registry, package

pytestmark = pytest.mark.unit


def _package(source: object) -> NodePackage:
    name, version = source.name, source.version  # type: ignore[attr-defined]
    return NodePackage(f"{name}@{version}", name, version, source.integrity)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_archives_come_checked_and_the_second_time_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    with npm_registry() as (url, asked):
        monkeypatch.setenv(REGISTRY_VARIABLE, url)
        files = fetch_archives([_package(p) for p in PACKAGES], tmp_path / "a", said.append)
        assert sorted(asked) == sorted(p.path for p in PACKAGES)
        again = fetch_archives([_package(p) for p in PACKAGES], tmp_path / "b", said.append)
        assert len(asked) == 2  # nothing downloaded again
    assert files == again
    assert (tmp_path / "a" / files["tinyfmt@1.0.0"]).read_bytes() == TINYFMT.data
    assert "2 downloaded" in said[0] and "2 from the cache" in said[1]


def test_an_archive_that_does_not_match_the_lock_is_refused_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    forged = replace(_package(TINYFMT), integrity=TINYCORE.integrity)  # the lock says another
    with npm_registry() as (url, _asked):
        monkeypatch.setenv(REGISTRY_VARIABLE, url)
        with pytest.raises(EnvironmentFailed) as refused:
            fetch_archives([forged], tmp_path / "a", lambda _t: None)
    assert "does not match the integrity" in refused.value.what
    assert "regenerate the lock" in refused.value.fix
    assert not list((home / "cache" / "npm").glob("*.tgz"))


def test_a_version_the_registry_lacks_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = NodePackage("ghost@9.9.9", "ghost", "9.9.9", TINYCORE.integrity)
    with npm_registry() as (url, _asked):
        monkeypatch.setenv(REGISTRY_VARIABLE, url)
        with pytest.raises(EnvironmentFailed) as error:
            fetch_archives([missing], tmp_path / "a", lambda _t: None)
    assert "ghost@9.9.9" in error.value.what and "HTTP 404" in error.value.why


@pytest.mark.parametrize(
    "value",
    [
        "http://example.com",
        "file:///etc",
        "ftp://x",
        "http://127.0.0.1.attacker.example",
        "http://localhost.attacker.example",
        "http://localhost@attacker.example/",
        "https://user:pw@registry.example",
    ],
)
def test_the_registry_is_https_or_this_machine(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(REGISTRY_VARIABLE, value)
    with pytest.raises(EnvironmentFailed) as error:
        registry()
    assert REGISTRY_VARIABLE in error.value.fix


def test_the_default_registry_is_npms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGISTRY_VARIABLE, raising=False)
    assert registry() == "https://registry.npmjs.org"


def test_a_registry_answer_of_503_is_retried_and_connections_are_kept_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = tuple(package(f"p{n}", "1.0.0", f"export const n = {n};\n") for n in range(30))
    ports: list[int] = []
    with npm_registry(many, flaky=2, ports=ports) as (url, asked):
        monkeypatch.setenv(REGISTRY_VARIABLE, url)
        files = fetch_archives([_package(p) for p in many], tmp_path / "a", lambda _t: None)
    assert len(files) == 30 and len(asked) == 32  # two 503s, each asked again
    assert len(set(ports)) <= WORKERS < 30  # one connection per worker, not per archive


def test_the_first_failure_stops_the_downloads_still_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = tuple(package(f"q{n}", "1.0.0", f"export const n = {n};\n") for n in range(60))
    missing = NodePackage("ghost@9.9.9", "ghost", "9.9.9", TINYCORE.integrity)
    with npm_registry(many, slow_s=0.2) as (url, asked):
        monkeypatch.setenv(REGISTRY_VARIABLE, url)
        with pytest.raises(EnvironmentFailed, match=r"ghost@9\.9\.9"):
            fetch_archives([missing, *(_package(p) for p in many)], tmp_path / "a", lambda _t: None)
    assert len(asked) <= 1 + 2 * WORKERS  # the archives still queued were never asked for


def test_packages_sharing_an_archive_download_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _package(TINYFMT)
    variant = replace(one, key="tinyfmt@1.0.0(peer@1.0.0)")  # pnpm: a variant per peer set
    with npm_registry() as (url, asked):
        monkeypatch.setenv(REGISTRY_VARIABLE, url)
        files = fetch_archives([one, variant], tmp_path / "a", lambda _t: None)
    assert len(asked) == 1 and files[one.key] == files[variant.key]
