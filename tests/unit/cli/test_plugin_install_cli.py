"""`fluffy plugin install` with a kernel running: the kernel reviews, the CLI installs.

The kernel's methods are served in-process here (no container); tests/e2e/
test_plugin_kernel.py runs the same through the real bootstrap and L1 kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fluffy.cli import plugin as cli
from fluffy.errors import PluginNotConfirmed
from fluffy.kernel.plugins.store import read_tree
from tests.unit.kernel.plugins.test_plugin_install_review import kernel, sync
from tests.unit.plugin_support import make_plugin

pytestmark = pytest.mark.unit


def run_cli(monkeypatch: pytest.MonkeyPatch, sock: Path | None, argv: list[str]) -> tuple[int, Any]:
    """The installed `fluffy plugin` command, told that ``sock`` is the project's kernel."""
    monkeypatch.setattr(cli, "_kernel_socket", lambda project: sock)
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plugin", *argv])
    return args.func(args), args


@sync
async def test_yes_installs_the_reviewed_bytes_after_the_kernel_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        argv = ["install", str(folder), "--yes", "--json"]
        code, _ = await asyncio.to_thread(run_cli, monkeypatch, k.cli, argv)
        [entry] = k.entries("plugin_install_approved")
        assert k.entries("plugin_install_refused") == []
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["audited"] is True and out["installed"]["state"] == "REGISTERED"
    assert out["plan"]["digest"] == entry["metadata"]["digest"]
    installed = k.store.require("demo-tool")
    assert read_tree(installed.path) == read_tree(folder)
    assert k.store.verify("demo-tool").ok


@sync
async def test_no_terminal_and_no_yes_installs_nothing_and_the_kernel_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        with pytest.raises(PluginNotConfirmed) as caught:
            await asyncio.to_thread(cli._install_through_kernel, _args(folder), "p", k.cli)
        code, _ = await asyncio.to_thread(run_cli, monkeypatch, k.cli, ["install", str(folder)])
        refused = k.entries("plugin_install_refused")
        assert k.entries("plugin_install_approved") == []
    assert "there is no terminal to confirm on" in caught.value.what
    assert "the kernel recorded the refusal" in caught.value.why
    assert code == 1  # `fluffy plugin install` without --yes: refused, shown
    captured = capsys.readouterr()
    assert "demo.echo" in captured.out and "reviewed by  the kernel" in captured.out
    assert "ERROR: demo-tool 1.0.0 was not installed" in captured.err
    assert [e["metadata"]["error_code"] for e in refused] == ["plugin.not_confirmed"] * 2
    assert k.store.names() == []


@sync
async def test_without_a_kernel_the_terminal_reviews_and_says_it_is_not_audited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    folder = make_plugin(tmp_path / "demo-tool")
    code, _ = await asyncio.to_thread(run_cli, monkeypatch, None, ["install", str(folder), "--yes"])
    assert code == 0
    out = capsys.readouterr().out
    assert "installed demo-tool 1.0.0" in out and "not audited: no kernel runs for" in out


def _args(folder: Path) -> Any:
    return argparse.Namespace(path=str(folder), yes=False, json=False, project=None)


def test_a_kernel_is_found_by_its_status_and_an_unhealthy_one_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.cli import lifecycle
    from fluffy.errors import KernelNotRunning

    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    project = str(tmp_path)
    monkeypatch.setattr(lifecycle, "_status", lambda project: None)
    assert cli._kernel_socket(project) is None  # no kernel: the host review
    monkeypatch.setattr(lifecycle, "_status", lambda project: {"health": "healthy"})
    assert cli._kernel_socket(project) == paths(tmp_path / "home", project)["run"] / "kernel.sock"
    monkeypatch.setattr(lifecycle, "_status", lambda project: {"health": "starting"})
    with pytest.raises(KernelNotRunning, match="running but not healthy"):
        cli._kernel_socket(project)  # never a silent fall back to the host
