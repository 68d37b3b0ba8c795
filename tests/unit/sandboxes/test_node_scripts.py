"""Packages' install scripts in the image build: in dependency order, as the sandbox user,
each failure reported (run here as the current user)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fluffy.sandboxes import nodescripts

pytestmark = pytest.mark.unit


def _package(folder: Path, scripts: dict[str, str], gyp: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": folder.name, "scripts": scripts}))
    if gyp:
        (folder / "binding.gyp").write_text("{}")
    return folder


def test_dependencies_run_first_and_each_outcome_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodescripts, "SANDBOX_USER", os.getuid())
    log = tmp_path / "order.log"
    plan = {
        "layout": "isolated",
        "packages": {
            "app@1.0.0": {"name": "app", "version": "1.0.0", "deps": {"lib": "lib@2.0.0"}},
            "lib@2.0.0": {"name": "lib", "version": "2.0.0", "deps": {}},
            "broken@1.0.0": {"name": "broken", "version": "1.0.0", "deps": {}},
            "addon@1.0.0": {"name": "addon", "version": "1.0.0", "deps": {}},
        },
    }
    folders = {
        "app@1.0.0": _package(tmp_path / "app", {"postinstall": f"echo app >> {log}"}),
        "lib@2.0.0": _package(tmp_path / "lib", {"install": f"echo $npm_package_name >> {log}"}),
        "broken@1.0.0": _package(tmp_path / "broken", {"postinstall": "echo nope >&2; exit 3"}),
        "addon@1.0.0": _package(tmp_path / "addon", {}, gyp=True),
    }
    order = nodescripts.script_order(plan, folders.__getitem__)
    assert [k for k, _ in order].index("lib@2.0.0") < [k for k, _ in order].index("app@1.0.0")
    said = nodescripts.run_scripts(order, tmp_path / "node_modules", tmp_path / "bin")
    assert log.read_text().split() == ["lib", "app"]
    assert "broken@1.0.0: postinstall failed (exit 3): nope" in said
    assert any(s.startswith("addon@1.0.0: builds a native addon") for s in said)


def test_a_tree_layout_runs_nested_packages_before_the_ones_above() -> None:
    plan = {"layout": "tree", "placed": {"a": "a@1", "a/node_modules/b": "b@1", "c": "c@1"}}
    order = nodescripts.script_order(plan, lambda rel: Path("/node_modules") / rel)
    assert [k for k, _ in order] == ["b@1", "a@1", "c@1"]


def test_a_script_finds_the_commands_of_every_node_modules_folder_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As npm runs them: a package's own ``node_modules/.bin`` first, then each one above
    it (a dependency's ``napi-postinstall`` called by its dependent's postinstall)."""
    monkeypatch.setattr(nodescripts, "SANDBOX_USER", os.getuid())
    modules = tmp_path / "node_modules"
    log = tmp_path / "calls.log"
    script = {"postinstall": "owncmd && besidecmd && topcmd"}
    package = _package(modules / "a/node_modules/b", script)
    for folder, command in [(package / "node_modules/.bin", "owncmd"),
                            (modules / "a/node_modules/.bin", "besidecmd"),
                            (modules / ".bin", "topcmd")]:  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / command).write_text(f"#!/bin/sh\necho {command} >> {log}\n")
        (folder / command).chmod(0o755)
    said = nodescripts.run_scripts([("b@1.0.0", package)], modules, tmp_path / "bin")
    assert said == ["b@1.0.0: postinstall ran"]
    assert log.read_text().split() == ["owncmd", "besidecmd", "topcmd"]
    assert nodescripts.bin_path(package, modules) == [
        package / "node_modules/.bin",
        modules / "a/node_modules/.bin",
        modules / ".bin",
    ]
