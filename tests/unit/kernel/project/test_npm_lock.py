"""Lock files read as data: what is fetched, from where, laid where; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.project.nodelock import read_node_lock
from fluffy.kernel.project.npmlock import NodePackage
from tests.node_support import TINYCORE, TINYFMT, npm_lock, pnpm_lock, yarn_lock

pytestmark = pytest.mark.unit
MANIFEST = {"devDependencies": {"tinyfmt": "^1.0.0"}}
SHA = TINYCORE.integrity


def read(root: Path, name: str, text: str, manifest: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    (root / name).write_text(text)
    lock = read_node_lock(root, manifest or MANIFEST, "x86_64")
    assert lock is not None
    return lock


def test_npm_lays_each_package_at_its_install_path(tmp_path: Path) -> None:
    lock = read(tmp_path, "package-lock.json", npm_lock())
    assert lock.layout == "tree"
    assert lock.placed == {"tinycore": "tinycore@2.0.0", "tinyfmt": "tinyfmt@1.0.0"}
    assert lock.packages["tinyfmt@1.0.0"].integrity == TINYFMT.integrity
    assert not lock.refused and not lock.skipped


@pytest.mark.parametrize(
    ("name", "render"), [("pnpm-lock.yaml", pnpm_lock), ("yarn.lock", yarn_lock)]
)
def test_pnpm_and_yarn_give_the_graph_laid_out_isolated(tmp_path: Path, name: str, render) -> None:  # type: ignore[no-untyped-def]
    lock = read(tmp_path, name, render())
    assert lock.layout == "isolated"
    assert lock.roots == {"tinyfmt": "tinyfmt@1.0.0"}
    assert lock.packages["tinyfmt@1.0.0"].deps == {"tinycore": "tinycore@2.0.0"}
    assert lock.packages["tinycore@2.0.0"].integrity == TINYCORE.integrity
    assert not lock.refused


def test_npm_nested_links_platforms_and_refusals(tmp_path: Path) -> None:
    packages = {
        "": {"name": "app"},
        "node_modules/a": {"version": "1.0.0", "integrity": SHA, "hasInstallScript": True},
        "node_modules/a/node_modules/b": {"version": "2.0.0", "integrity": SHA},
        "node_modules/@s/c": {"version": "3.0.0", "integrity": SHA},
        "node_modules/ws-pkg": {"link": True, "resolved": "packages/ws-pkg"},
        "node_modules/evil-link": {"link": True, "resolved": "../../etc"},
        "node_modules/fsevents": {
            "version": "2.3.3",
            "integrity": SHA,
            "optional": True,
            "os": ["darwin"],
        },
        "node_modules/@esbuild/linux-x64": {
            "version": "0.1.0",
            "integrity": SHA,
            "os": ["linux"],
            "cpu": ["x64"],
        },
        "node_modules/@esbuild/linux-arm64": {
            "version": "0.1.0",
            "integrity": SHA,
            "os": ["linux"],
            "cpu": ["arm64"],
        },
        "node_modules/from-git": {"version": "1.0.0", "resolved": "git+ssh://git@x/y.git#abc"},
        "node_modules/from-file": {"version": "file:../x", "integrity": SHA},
        "node_modules/no-integrity": {"version": "1.0.0"},
        "node_modules/../../escape": {"version": "1.0.0", "integrity": SHA},
        "packages/ws-pkg/node_modules/d": {"version": "1.0.0", "integrity": SHA},
    }
    lock = read(
        tmp_path, "package-lock.json", json.dumps({"lockfileVersion": 3, "packages": packages})
    )
    assert lock.placed == {
        "a": "a@1.0.0",
        "a/node_modules/b": "b@2.0.0",
        "@s/c": "@s/c@3.0.0",
        "@esbuild/linux-x64": "@esbuild/linux-x64@0.1.0",
    }
    assert lock.links == {"ws-pkg": "packages/ws-pkg"}
    refused = "\n".join(lock.refused)
    for name in ("evil-link", "from-git", "from-file", "no-integrity", "escape"):
        assert name in refused
    skipped = "\n".join(lock.skipped)
    assert "fsevents" in skipped and "linux-arm64" in skipped and "workspace" in skipped


def test_a_package_is_fetched_by_name_and_version_never_by_the_locks_url() -> None:
    package = NodePackage("@scope/tool@1.2.3", "@scope/tool", "1.2.3", SHA)
    assert package.tarball("https://r.example/") == "https://r.example/@scope/tool/-/tool-1.2.3.tgz"


def test_pnpm_v6_keys_peers_aliases_and_links(tmp_path: Path) -> None:
    text = f"""
lockfileVersion: '6.0'
importers:
  .:
    dependencies:
      react-dom:
        specifier: ^18
        version: 18.0.0(react@18.0.0)
      alias:
        specifier: npm:real@1
        version: /real@1.0.0
      mine:
        specifier: workspace:*
        version: link:packages/mine
      up:
        specifier: link:../outside
        version: link:../outside
  packages/mine:
    dependencies:
      git-dep:
        specifier: github:x/y
        version: github.com/x/y/abc
packages:
  /react-dom@18.0.0(react@18.0.0):
    resolution: {{integrity: {SHA}}}
    dependencies:
      react: 18.0.0
  /react@18.0.0:
    resolution: {{integrity: {SHA}}}
  /real@1.0.0:
    resolution: {{integrity: {SHA}}}
  github.com/x/y/abc:
    resolution: {{tarball: https://codeload.github.com/x/y/tar.gz/abc}}
    name: y-lib
    version: 1.0.0
"""
    lock = read(tmp_path, "pnpm-lock.yaml", text)
    peered = "react-dom@18.0.0(react@18.0.0)"  # a variant per peer set, fetched once
    assert lock.roots == {"react-dom": peered, "alias": "real@1.0.0"}
    assert lock.packages[peered].deps == {"react": "react@18.0.0"}
    assert lock.packages[peered].name == "react-dom" and lock.packages[peered].version == "18.0.0"
    assert lock.links == {"mine": "packages/mine"}  # ../outside is not the project's
    # named by its package (the key of a git dependency names only where it came from)
    assert any(r.startswith("y-lib (github.com/x/y/abc): not from") for r in lock.refused)


def test_yarn_berry_and_npm_v1_are_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "yarn.lock").write_text('__metadata:\n  version: 8\n\n"a@npm:1":\n  version: 1\n')
    with pytest.raises(EnvironmentFailed) as berry:
        read_node_lock(tmp_path, {}, "x86_64")
    assert "Berry" in berry.value.what and "package-lock" in berry.value.fix
    (tmp_path / "yarn.lock").unlink()
    (tmp_path / "package-lock.json").write_text('{"lockfileVersion": 1, "dependencies": {}}')
    with pytest.raises(EnvironmentFailed) as old:
        read_node_lock(tmp_path, {}, "x86_64")
    assert "version 1" in old.value.what and "--package-lock-only" in old.value.fix
    (tmp_path / "package-lock.json").write_text("{not json")
    with pytest.raises(EnvironmentFailed) as broken:
        read_node_lock(tmp_path, {}, "x86_64")
    assert "cannot be read" in broken.value.what and "JSON" in broken.value.why


def test_no_lock_is_none(tmp_path: Path) -> None:
    assert read_node_lock(tmp_path, {}, "x86_64") is None


def test_yarn_entries_missing_from_the_lock_and_git_sources(tmp_path: Path) -> None:
    text = (
        'ok@^1.0.0:\n  version "1.0.0"\n  resolved "https://registry.yarnpkg.com/ok/-/ok-1.0.0.tgz"\n'
        f'  integrity {SHA}\n  dependencies:\n    gone "^3"\n\n'
        '"viagit@git+https://x/y.git":\n  version "0.1.0"\n  resolved "git+https://x/y.git#abc"\n'
    )
    manifest = {"dependencies": {"ok": "^1.0.0", "viagit": "git+https://x/y.git",
                                 "local": "file:../local"}}  # fmt: skip
    lock = read(tmp_path, "yarn.lock", text, manifest)
    assert lock.roots == {"ok": "ok@1.0.0"}
    refused = "\n".join(lock.refused)
    assert "gone@^3: not in yarn.lock" in refused and "git+https" in refused


def test_hostile_npm_entries_are_refused_by_name_never_laid_out(tmp_path: Path) -> None:
    packages = {
        "node_modules/../../etc/ld.so.preload": {"link": True, "resolved": "evil"},
        "node_modules/x/node_modules/../../../y": {"version": "1.0.0", "integrity": SHA},
        "node_modules/tarball": {
            "version": "1.0.0",
            "integrity": SHA,
            "resolved": "https://evil.example/any/thing.tgz",
        },
        "node_modules/mirror": {
            "version": "1.0.0",
            "integrity": SHA,
            "resolved": "https://mirror.example/r/mirror/-/mirror-1.0.0.tgz",
        },
        "node_modules/empty": {"version": "1.0.0", "integrity": ""},
        "node_modules/short": {"version": "1.0.0", "integrity": "sha512-AAAA"},
        "node_modules/md5": {"version": "1.0.0", "integrity": "md5-" + "A" * 22 + "=="},
        "node_modules/newline\n": {"version": "1.0.0", "integrity": SHA},
        "node_modules/bundled": {"version": "1.0.0", "inBundle": True},
    }
    lock = read(
        tmp_path, "package-lock.json", json.dumps({"lockfileVersion": 3, "packages": packages})
    )
    assert lock.placed == {"mirror": "mirror@1.0.0"}  # another registry's layout: by name
    assert lock.links == {}
    refused = "\n".join(lock.refused)
    for name in ("ld.so.preload", "../../../y", "evil.example", "empty", "short", "md5", "newline"):
        assert name in refused, name
    assert "bundled" not in refused  # it comes inside its parent's archive


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "pnpm-lock.yaml",
            "lockfileVersion: '9.0'\nimporters: [1]\n",
            "`importers` is not a mapping",
        ),
        ("package-lock.json", "[" * 100_000 + "]" * 100_000, "cannot be read"),
        ("pnpm-lock.yaml", "lockfileVersion: '5.4'\n", "version 5.4"),
    ],
)
def test_malformed_locks_are_refused_with_what_to_do(
    tmp_path: Path, name: str, text: str, said: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(EnvironmentFailed) as error:
        read_node_lock(tmp_path, {}, "x86_64")
    assert said in error.value.what and error.value.fix


def test_a_lock_that_is_a_link_is_refused_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text(npm_lock())
    (tmp_path / "package-lock.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(EnvironmentFailed, match="cannot be read"):
        read_node_lock(tmp_path, {}, "x86_64")


def test_the_lock_of_the_declared_package_manager_wins(tmp_path: Path) -> None:
    (tmp_path / "pnpm-lock.yaml").write_text(pnpm_lock())
    (tmp_path / "package-lock.json").write_text(npm_lock())
    assert read(tmp_path, "yarn.lock", yarn_lock(), {"packageManager": "npm@10"}).file == (
        "package-lock.json"
    )
    assert read(tmp_path, "yarn.lock", yarn_lock(), MANIFEST).file == "pnpm-lock.yaml"


def test_a_pnpm_lock_with_only_workspace_links_has_no_snapshots(tmp_path: Path) -> None:
    text = (
        "lockfileVersion: '9.0'\nimporters:\n  .:\n    dependencies:\n      mine:\n"
        "        specifier: workspace:*\n        version: link:packages/mine\n"
    )
    lock = read(tmp_path, "pnpm-lock.yaml", text)
    assert lock.links == {"mine": "packages/mine"} and not lock.packages


def test_yarn_aliases_fetch_the_real_package_and_workspaces_are_read(tmp_path: Path) -> None:
    (tmp_path / "packages/web").mkdir(parents=True)
    (tmp_path / "packages/web/package.json").write_text(
        json.dumps({"name": "@me/web", "dependencies": {"tinycore": "^2.0.0"}})
    )
    text = (
        'alias@npm:tinyfmt@^1.0.0:\n  version "1.0.0"\n'
        f'  resolved "https://registry.yarnpkg.com{TINYFMT.path}#x"\n'
        f"  integrity {TINYFMT.integrity}\n\n"
        'tinycore@^2.0.0:\n  version "2.0.0"\n'
        f'  resolved "https://registry.yarnpkg.com{TINYCORE.path}"\n'
        f"  integrity {TINYCORE.integrity}\n"
    )
    manifest = {"workspaces": ["packages/*"], "devDependencies": {"alias": "npm:tinyfmt@^1.0.0"}}
    lock = read(tmp_path, "yarn.lock", text, manifest)
    assert lock.roots == {"alias": "tinyfmt@1.0.0", "tinycore": "tinycore@2.0.0"}
    assert lock.packages["tinyfmt@1.0.0"].name == "tinyfmt"
    assert lock.links == {"@me/web": "packages/web"}


def test_dependency_names_that_are_not_npm_names_are_dropped(tmp_path: Path) -> None:
    text = pnpm_lock().replace(
        "      tinycore: 2.0.0\n", "      tinycore: 2.0.0\n      ../../x: 2.0.0\n"
    )
    lock = read(tmp_path, "pnpm-lock.yaml", text)
    assert lock.packages["tinyfmt@1.0.0"].deps == {"tinycore": "tinycore@2.0.0"}
