"""A third-party plugin's code from the store to the in-sandbox host (no container).

The runner copies the verified files into the call's socket folder; the real host
process loads the entry file from there, checks the code's tools against the manifest's,
and serves the kernel's job over a real socket.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import PluginTampered
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.plugins.store import PluginStore
from fluffy.kernel.tools.sandbox.pluginjob import Job, ThirdPartyCode
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.tools.sandbox.pluginsocket import stage_code
from tests.unit.plugin_support import make_plugin, manifest, plugin_code, tool

pytestmark = pytest.mark.unit
WAIT = 60.0  # only a hang reaches it


def no_engine() -> Any:
    raise AssertionError("no container in this test")


def code_of(store: PluginStore, name: str = "demo-tool") -> ThirdPartyCode:
    return ThirdPartyCode(store, name, "plugin.py", 1, [tool()], ("fs.read",))


async def serve_one(
    tmp_path: Path, store: PluginStore, args: dict[str, Any]
) -> tuple[Any, int, str]:
    """Run one job through the real host; (reply or None, exit code, stderr)."""
    runner = PluginRunner(no_engine, tmp_path, environment=dict)
    runner.third_party["demo-tool"] = code_of(store)
    folder = Path(tempfile.mkdtemp(prefix="fluffy-tp-", dir="/tmp"))  # short socket path
    command = await asyncio.to_thread(stage_code, runner.third_party["demo-tool"], folder)
    binding = "tool:demo-tool:c1"
    job = Job("c1", "demo.echo", args, "strict", 1, "demo-tool")
    job.sandbox = Sandbox("sb1", "code-executor", "n", output_dir=tmp_path / "received")
    job.sandbox.output_dir.mkdir(exist_ok=True)
    job.placed.set()
    runner.jobs[binding] = job
    server = KernelServer(runner.socket.methods("demo-tool"))
    await server.listen(folder / "kernel.sock", binding=binding)
    roots = {name: tmp_path / name for name in ("workspace", "staged", "output")}
    for root in roots.values():
        root.mkdir(exist_ok=True)
    inside = command.index("--plugin-dir")
    argv = [
        *command[4:inside],
        "--plugin-dir",
        str(folder / "plugin"),
        "--entry",
        command[inside + 3],
        "--declared",
        str(folder / "tools.json"),
        "--socket",
        str(folder / "kernel.sock"),
        *(f"--{name}={path}" for name, path in roots.items()),
    ]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fluffy.sandboxes.plugin_host",
        *argv,
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        done = asyncio.ensure_future(process.wait())
        await asyncio.wait({job.future, done}, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
        reply = job.future.result() if job.future.done() else None
        _, err = await asyncio.wait_for(process.communicate(), WAIT)
    finally:
        if process.returncode is None:
            process.kill()
        await server.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert process.returncode is not None
    return reply, process.returncode, err.decode()


def test_the_staged_code_is_the_verified_copy_and_the_command_loads_it(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "store")
    installed = store.install(make_plugin(tmp_path / "src"), "demo-tool", "1.0.0")
    folder = tmp_path / "call"
    folder.mkdir()
    command = stage_code(code_of(store), folder)
    assert command == [
        "python3",
        "-I",
        "-m",
        "fluffy.sandboxes.plugin_host",
        "--plugin-dir",
        "/run/fluffy/plugin",
        "--entry",
        "plugin.py",
        "--declared",
        "/run/fluffy/tools.json",
    ]
    for rel in ("manifest.yaml", "plugin.py"):
        assert (folder / "plugin" / rel).read_bytes() == (installed.path / rel).read_bytes()
        assert (folder / "plugin" / rel).stat().st_mode & 0o777 == 0o644
    (installed.path / "plugin.py").write_text("PLUGIN = 'tampered'\n")
    with pytest.raises(PluginTampered):
        stage_code(code_of(store), tmp_path)


def test_the_host_serves_a_plugin_loaded_from_its_entry_file(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "store")
    source = make_plugin(tmp_path / "src")
    (source / "helper.py").write_text("PREFIX = 'said: '\n")  # the plugin's own module
    said = '{"said": helper.PREFIX + args.get("text"), "tool": ctx.tool_name}'
    code = plugin_code([tool()]).replace(
        'return {"said": args.get("text"), "tool": ctx.tool_name}',
        f"import helper\n    return {said}",
    )
    (source / "plugin.py").write_text(code)
    store.install(source, "demo-tool", "1.0.0")
    reply, code_, err = asyncio.run(serve_one(tmp_path, store, {"text": "hi"}))
    assert reply is not None, err
    assert reply["ok"] is True, reply
    assert reply["result"] == {"said": "said: hi", "tool": "demo.echo"}
    assert code_ == 0, err


def test_the_host_refuses_code_whose_tools_the_manifest_does_not_declare(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "store")
    source = make_plugin(tmp_path / "src")
    (source / "plugin.py").write_text(plugin_code([tool(), tool("demo.hidden")]))
    store.install(source, "demo-tool", "1.0.0")
    reply, code, err = asyncio.run(serve_one(tmp_path, store, {"text": "hi"}))
    assert reply is None and code == 2
    assert "defines tools its manifest does not declare: ['demo.hidden']" in err


def test_the_host_refuses_code_whose_definition_differs(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "store")
    source = make_plugin(tmp_path / "src", data=manifest())
    writable = tool()
    writable["read_only"] = False  # the code claims more than the manifest shows
    (source / "plugin.py").write_text(plugin_code([writable]))
    store.install(source, "demo-tool", "1.0.0")
    reply, code, err = asyncio.run(serve_one(tmp_path, store, {"text": "hi"}))
    assert reply is None and code == 2
    assert "definition of ['demo.echo'] differs from its manifest" in err
