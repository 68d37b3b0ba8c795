"""The plugin store: plain files copied with their hashes; hostile trees refused whole."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from fluffy.errors import PluginInstallRefused, PluginRejected, PluginTampered
from fluffy.kernel.plugins import store as store_module
from fluffy.kernel.plugins.store import MAX_FILE_BYTES, PluginStore, inspect_tree
from tests.unit.plugin_support import make_plugin

pytestmark = pytest.mark.unit


def tree(folder: Path) -> set[str]:
    return (
        {p.relative_to(folder).as_posix() for p in folder.rglob("*")} if folder.exists() else set()
    )


@pytest.fixture()
def store(tmp_path: Path) -> PluginStore:
    return PluginStore(tmp_path / "store")


def test_install_copies_plain_files_and_records_their_hashes(
    tmp_path: Path, store: PluginStore
) -> None:
    source = make_plugin(tmp_path / "src")
    (source / "pkg").mkdir()
    (source / "pkg" / "helper.py").write_text("X = 1\n")
    (source / "__pycache__").mkdir()
    (source / "__pycache__" / "plugin.cpython-311.pyc").write_bytes(b"junk")
    installed = store.install(source, "demo-tool", "1.0.0")
    assert installed.path == store.root / "demo-tool" / "1.0.0"
    assert set(installed.files) == {"manifest.yaml", "plugin.py", "pkg/helper.py"}
    for rel, digest in installed.files.items():
        assert digest == hashlib.sha256((source / rel).read_bytes()).hexdigest()
        assert (installed.path / rel).read_bytes() == (source / rel).read_bytes()
        assert (installed.path / rel).stat().st_mode & 0o777 == 0o644
    assert not (installed.path / "__pycache__").exists()
    record = json.loads((store.root / "demo-tool" / "install.json").read_text())
    assert record["files"] == installed.files and record["version"] == "1.0.0"
    assert store.get("demo-tool") == installed and store.names() == ["demo-tool"]
    assert store.verify("demo-tool").ok


def test_a_second_install_of_a_name_is_refused(tmp_path: Path, store: PluginStore) -> None:
    source = make_plugin(tmp_path / "src")
    store.install(source, "demo-tool", "1.0.0")
    before = tree(store.root)
    with pytest.raises(PluginRejected, match="already installed"):
        store.install(source, "demo-tool", "2.0.0")
    assert tree(store.root) == before


def hostile_link_out(source: Path) -> None:
    (source / "secrets").symlink_to("/etc/passwd")


def hostile_link_up(source: Path) -> None:
    (source / "up").symlink_to("../..")


def hostile_link_inside(source: Path) -> None:
    (source / "alias.py").symlink_to("plugin.py")


def hostile_huge_file(source: Path) -> None:
    (source / "blob.bin").write_bytes(b"\0" * (MAX_FILE_BYTES + 1))


def hostile_huge_total(source: Path) -> None:
    for i in range(11):
        (source / f"part{i}.bin").write_bytes(b"\0" * MAX_FILE_BYTES)


def hostile_fifo(source: Path) -> None:
    os.mkfifo(source / "pipe")


def hostile_many_files(source: Path) -> None:
    for i in range(store_module.MAX_FILES + 1):
        (source / f"f{i}.txt").write_text("x")


def hostile_deep(source: Path) -> None:
    deep = source.joinpath(*["d"] * (store_module.MAX_DEPTH + 2))
    deep.mkdir(parents=True)
    (deep / "x.py").write_text("")


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (hostile_link_out, "secrets is a symbolic link to '/etc/passwd', which leaves the plugin"),
        (hostile_link_up, "up is a symbolic link to '../..', which leaves the plugin"),
        (hostile_link_inside, "alias.py is a symbolic link to 'plugin.py'"),
        (hostile_huge_file, "blob.bin is 1048577 bytes; a plugin file may be at most 1024 KiB"),
        (hostile_huge_total, "at most 10 MiB may be installed"),
        (hostile_fifo, "pipe is a FIFO"),
        (hostile_many_files, f"more than {store_module.MAX_FILES} files"),
        (hostile_deep, "nested more than"),
    ],
)
def test_hostile_trees_are_refused_and_nothing_is_installed(
    tmp_path: Path, store: PluginStore, make: object, reason: str
) -> None:
    source = make_plugin(tmp_path / "src")
    make(source)  # type: ignore[operator]
    with pytest.raises(PluginInstallRefused) as caught:
        inspect_tree(source)
    assert reason in caught.value.what
    assert caught.value.code == "plugin.install_refused" and caught.value.why
    with pytest.raises(PluginInstallRefused):
        store.install(source, "demo-tool", "1.0.0")
    assert tree(store.root) == set()  # not even an empty folder of it


def test_the_plugin_folder_itself_may_not_be_a_link(tmp_path: Path, store: PluginStore) -> None:
    real = make_plugin(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(PluginInstallRefused, match="is not a plugin folder"):
        store.install(tmp_path / "link", "demo-tool", "1.0.0")


def test_verify_reports_changed_missing_and_added_files(tmp_path: Path, store: PluginStore) -> None:
    source = make_plugin(tmp_path / "src")
    (source / "extra.py").write_text("A = 1\n")
    installed = store.install(source, "demo-tool", "1.0.0")
    (installed.path / "plugin.py").write_text("import os\n")  # a writable copy: tampered
    (installed.path / "extra.py").unlink()
    (installed.path / "new.py").write_text("B = 2\n")
    report = store.verify("demo-tool")
    assert (report.changed, report.missing, report.added) == (
        ["plugin.py"],
        ["extra.py"],
        ["new.py"],
    )
    assert not report.ok
    assert report.describe() == "changed: plugin.py; missing: extra.py; added: new.py"


def test_a_file_replaced_by_a_link_counts_as_changed(tmp_path: Path, store: PluginStore) -> None:
    installed = store.install(make_plugin(tmp_path / "src"), "demo-tool", "1.0.0")
    content = (installed.path / "plugin.py").read_bytes()
    (tmp_path / "same.py").write_bytes(content)  # same bytes, but elsewhere
    (installed.path / "plugin.py").unlink()
    (installed.path / "plugin.py").symlink_to(tmp_path / "same.py")
    assert store.verify("demo-tool").changed == ["plugin.py"]


def test_read_verified_ships_recorded_files_only_and_refuses_changes(
    tmp_path: Path, store: PluginStore
) -> None:
    installed = store.install(make_plugin(tmp_path / "src"), "demo-tool", "1.0.0")
    (installed.path / "added.py").write_text("EVIL = 1\n")
    _, files = store.read_verified("demo-tool")
    assert set(files) == {"manifest.yaml", "plugin.py"}
    (installed.path / "plugin.py").write_text("EVIL = 2\n")
    with pytest.raises(PluginTampered, match=r"plugin\.py no longer matches its recorded hash"):
        store.read_verified("demo-tool")


def test_remove_deletes_the_copy_and_its_record(tmp_path: Path, store: PluginStore) -> None:
    store.install(make_plugin(tmp_path / "src"), "demo-tool", "1.0.0")
    store.remove("demo-tool")
    assert store.get("demo-tool") is None and not (store.root / "demo-tool").exists()
    from fluffy.errors import PluginNotFound

    with pytest.raises(PluginNotFound):
        store.remove("demo-tool")


def test_the_default_root_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLUFFY_PLUGIN_STORE", raising=False)
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    assert PluginStore.default().root == tmp_path / "home" / "plugins"
    monkeypatch.setenv("FLUFFY_PLUGIN_STORE", str(tmp_path / "mounted"))
    assert PluginStore.default().root == tmp_path / "mounted"
