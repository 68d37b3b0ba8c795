"""The Node environment's build step: archives unpacked as data, packages laid out."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from fluffy.images.npmfetch import archive_name
from fluffy.kernel.project.nodelock import read_node_lock
from fluffy.sandboxes import nodebuild
from tests.node_support import PACKAGES, npm_lock, pnpm_lock, tarball

pytestmark = pytest.mark.unit


def _hostile() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:

        def add(name: str, data: bytes = b"x", mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
                link: str = "") -> None:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.type, info.linkname = len(data), mode, kind, link
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("package/index.js", b"ok")
        add("package/bin/cli.js", b"#!/usr/bin/env node", mode=0o755)
        add("package/../../escaped.js")
        add("/etc/absolute.js")
        add("package/link.js", kind=tarfile.SYMTYPE, link="/etc/passwd")
        add("package/hard.js", kind=tarfile.LNKTYPE, link="package/index.js")
        add("package/fifo", kind=tarfile.FIFOTYPE)
        add("other-top/readme.md", b"kept: the first folder is stripped whatever its name")
    return out.getvalue()


def test_an_archive_is_unpacked_as_files_and_folders_inside_its_package(tmp_path: Path) -> None:
    archive = tmp_path / "a.tgz"
    archive.write_bytes(_hostile())
    dest = tmp_path / "modules" / "pkg"
    nodebuild.unpack(archive, dest, [1 << 30])
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert found == [
        "a.tgz",
        "modules/pkg/bin/cli.js",
        "modules/pkg/index.js",
        "modules/pkg/readme.md",
    ]
    assert (dest / "bin/cli.js").stat().st_mode & 0o111
    assert not (dest / "index.js").stat().st_mode & 0o111
    assert not any(p.is_symlink() for p in tmp_path.rglob("*"))


def test_the_unpacked_size_is_capped(tmp_path: Path) -> None:
    archive = tmp_path / "a.tgz"
    archive.write_bytes(tarball({"big.js": "x" * 1000}))
    with pytest.raises(nodebuild.Refused):
        nodebuild.unpack(archive, tmp_path / "pkg", [999])


def _plan(tmp_path: Path, name: str, text: str) -> tuple[dict[str, object], Path]:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / name).write_text(text)
    lock = read_node_lock(tmp_path / "project", {"devDependencies": {"tinyfmt": "^1.0.0"}},
                          "x86_64")  # fmt: skip
    assert lock is not None
    archives = tmp_path / "archives"
    archives.mkdir()
    plan = lock.to_plan()
    by_key = {f"{p.name}@{p.version}": p for p in PACKAGES}
    for key, entry in plan["packages"].items():
        source = by_key[key]
        entry["archive"] = archive_name(source.integrity)
        (archives / entry["archive"]).write_bytes(source.data)
    return plan, archives


def test_npm_locks_are_laid_at_their_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodebuild, "MODULES", tmp_path / "node_modules")
    plan, archives = _plan(tmp_path, "package-lock.json", npm_lock())
    top = nodebuild.lay_out(plan, archives)
    assert top == {"tinycore": "2.0.0", "tinyfmt": "1.0.0"}
    assert "repeat" in (tmp_path / "node_modules/tinycore/index.js").read_text()


def test_pnpm_locks_are_laid_out_isolated_with_links_to_each_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = tmp_path / "node_modules"
    monkeypatch.setattr(nodebuild, "MODULES", modules)
    plan, archives = _plan(tmp_path, "pnpm-lock.yaml", pnpm_lock())
    assert nodebuild.lay_out(plan, archives) == {"tinyfmt": "1.0.0"}
    store = modules / ".store"
    assert (modules / "tinyfmt").resolve() == store / "tinyfmt@1.0.0/node_modules/tinyfmt"
    beside = store / "tinyfmt@1.0.0/node_modules/tinycore"
    assert beside.resolve() == store / "tinycore@2.0.0/node_modules/tinycore"
    assert not (modules / "tinycore").exists()  # not the project's own dependency
    assert (store / "node_modules/tinycore").is_symlink()  # hoisted, as pnpm does
    assert (modules / ".vite").readlink() == Path("/tmp/.vite")


def test_bins_of_top_level_packages_are_linked_inside_node_modules_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = tmp_path / "node_modules"
    monkeypatch.setattr(nodebuild, "MODULES", modules)
    tool = modules / "tool"
    tool.mkdir(parents=True)
    (tool / "cli.js").write_text("#!/usr/bin/env node\n")
    (modules / "other").mkdir()
    (modules / "other" / "secret.js").write_text("x")
    manifest = {
        "bin": {
            "tool": "cli.js",
            "../evil": "cli.js",
            "escape": "../../../etc/passwd",
            "node": "cli.js",  # shadowing Node or the system's tools
            "sh": "cli.js",
            "abs": str(modules / "other" / "secret.js"),  # another package's file
            "beside": "../other/secret.js",
        }
    }
    (tool / "package.json").write_text(json.dumps(manifest))
    nodebuild._bins({"tool": tool}, modules / ".bin")
    assert sorted(p.name for p in (modules / ".bin").iterdir()) == ["tool"]
    assert (modules / ".bin/tool").resolve() == (tool / "cli.js").resolve()
    assert (tool / "cli.js").stat().st_mode & 0o111


def test_a_link_outside_node_modules_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: the lock reader refuses such names; the build refuses them too."""
    monkeypatch.setattr(nodebuild, "MODULES", tmp_path / "node_modules")
    plan = {"layout": "tree", "packages": {}, "placed": {}, "roots": {},
            "links": {"../../etc/ld.so.preload": "evil"}}  # fmt: skip
    with pytest.raises(nodebuild.Refused, match="outside"):
        nodebuild.lay_out(plan, tmp_path)
    assert not (tmp_path / "etc").exists()


def test_a_name_given_as_a_file_then_a_folder_keeps_the_first(tmp_path: Path) -> None:
    archive = tmp_path / "a.tgz"
    archive.write_bytes(tarball({"dup": "first", "dup/inner": "second", "ok.js": "fine"}))
    nodebuild.unpack(archive, tmp_path / "pkg", [1 << 30])
    assert (tmp_path / "pkg/dup").read_text() == "first" and (tmp_path / "pkg/ok.js").is_file()


def test_a_peer_variant_gets_its_own_folder_named_by_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodebuild, "MODULES", tmp_path / "node_modules")
    plain = nodebuild._store("a@1.0.0", {"name": "a", "version": "1.0.0"})
    variant = nodebuild._store(
        "a@1.0.0(x\x00y" + "z" * 300 + ")", {"name": "a", "version": "1.0.0"}
    )
    assert plain.parent.parent.name == "a@1.0.0"
    assert (
        variant.parent.parent.name.startswith("a@1.0.0+") and len(variant.parent.parent.name) < 40
    )


def _archive(folder: Path, name: str, version: str, bin_: dict[str, str] | None = None) -> str:
    manifest: dict[str, object] = {"name": name, "version": version}
    files = {"index.js": f"module.exports = '{name}@{version}';\n"}
    if bin_:
        manifest["bin"] = bin_
        files.update({rel: "#!/usr/bin/env node\n" for rel in bin_.values()})
    file = f"{name.replace('/', '+')}-{version}.tgz"
    (folder / file).write_bytes(tarball({"package.json": json.dumps(manifest), **files}))
    return file


def test_a_scoped_packages_dependencies_sit_beside_it_where_node_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pnpm's layout: ``@scope/pkg``'s dependencies are links in the ``node_modules``
    folder that holds ``@scope`` (where Node's lookup goes from the package's files), not
    inside ``@scope``; otherwise Node falls back to the hoisted copy of another version.
    Its dependencies' commands are in its own ``node_modules/.bin``, for its scripts."""
    modules = tmp_path / "node_modules"
    monkeypatch.setattr(nodebuild, "MODULES", modules)
    archives = tmp_path / "archives"
    archives.mkdir()
    packages = {
        "@s/core@1.0.0": {"name": "@s/core", "version": "1.0.0", "deps": {"util": "util@2.0.0"},
                          "archive": _archive(archives, "@s/core", "1.0.0")},
        "util@1.0.0": {"name": "util", "version": "1.0.0", "deps": {},
                       "archive": _archive(archives, "util", "1.0.0")},
        "util@2.0.0": {"name": "util", "version": "2.0.0", "deps": {},
                       "archive": _archive(archives, "util", "2.0.0", {"utilcmd": "cli.js"})},
    }  # fmt: skip
    plan = {"layout": "isolated", "packages": packages, "links": {},
            "roots": {"@s/core": "@s/core@1.0.0", "util": "util@1.0.0"}}  # fmt: skip
    nodebuild.lay_out(plan, archives)
    core = nodebuild._store("@s/core@1.0.0", packages["@s/core@1.0.0"])
    beside = core.parent.parent / "util"  # .store/@s+core@1.0.0/node_modules/util
    assert (beside / "index.js").read_text() == "module.exports = 'util@2.0.0';\n"
    assert not (core.parent / "util").exists()  # never inside the scope's folder
    command = core / "node_modules" / ".bin" / "utilcmd"
    util2 = nodebuild._store("util@2.0.0", packages["util@2.0.0"])
    assert command.resolve() == (util2 / "cli.js").resolve()
    assert not (modules / ".bin" / "utilcmd").exists()  # util@1.0.0 is the project's


def test_a_nested_packages_commands_are_in_its_parents_bin_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """npm's tree: ``a/node_modules/b``'s commands go to ``a/node_modules/.bin`` (what
    ``a``'s install scripts find on their PATH), not to the top level's."""
    modules = tmp_path / "node_modules"
    monkeypatch.setattr(nodebuild, "MODULES", modules)
    archives = tmp_path / "archives"
    archives.mkdir()
    packages = {
        "a@1.0.0": {"name": "a", "version": "1.0.0", "archive": _archive(archives, "a", "1.0.0")},
        "b@1.0.0": {"name": "b", "version": "1.0.0",
                    "archive": _archive(archives, "b", "1.0.0", {"bcmd": "bin/b.js"})},
    }  # fmt: skip
    plan = {"layout": "tree", "packages": packages, "roots": {}, "links": {},
            "placed": {"a": "a@1.0.0", "a/node_modules/b": "b@1.0.0"}}  # fmt: skip
    assert nodebuild.lay_out(plan, archives) == {"a": "1.0.0"}
    command = modules / "a" / "node_modules" / ".bin" / "bcmd"
    assert command.resolve() == (modules / "a/node_modules/b/bin/b.js").resolve()
    assert not (modules / ".bin" / "bcmd").exists()
