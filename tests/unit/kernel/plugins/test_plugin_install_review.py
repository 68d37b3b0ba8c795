"""``plugin.install`` over a real kernel socket: plan, approve, refuse, and the audit log."""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import (
    ConnectionClosed,
    FluffyError,
    InvalidPayload,
    PluginInstallDenied,
    PluginInstallRefused,
    PluginManifestInvalid,
    PluginNotConfirmed,
    PluginRejected,
)
from fluffy.ipc.client import SyncClient
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.ipc.server import KernelServer
from fluffy.kernel.ipc.syscalls import SyscallTable
from fluffy.kernel.plugins.install import install, plan
from fluffy.kernel.plugins.store import PluginStore, read_tree
from fluffy.kernel.plugins.wire import encode_files, tree_digest
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import PolicyFile, parse_policy
from fluffy.kernel.syscalls.kernel import default_methods
from fluffy.kernel.syscalls.plugins import REVIEW_DIR, plugin_methods
from fluffy.kernel.tools.core.registry import Registry
from fluffy.kernel.tools.reading.fastpath import kernel_tools
from fluffy.kernel.tools.sandbox.plugin_activation import activate, open_home
from tests.unit.plugin_support import make_plugin, manifest

pytestmark = pytest.mark.unit

ALLOW_READ = """capabilities:
  - name: demo reads
    match: {syscall: [fs.read, demo.echo], caller_tag: [third_party]}
    action: allow
"""
DENY_INSTALL = """capabilities:
  - name: no plugins here
    match: {syscall: plugin.install}
    action: deny
"""


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run the async test on its own loop (no async plugin), within 20 s."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 20))

    return run


@dataclass
class Kernel:
    state: Path
    store: PluginStore
    front: AuditedPolicy
    cli: Path  # the CLI's socket (binding "cli")
    plugin: Path  # a plugin sandbox's socket (binding "tool:evil-tool:c1")
    root: Path

    def entries(self, event_type: str) -> list[dict[str, Any]]:
        return list(entries(self.state, Filters(event_type=event_type)))

    def swap(self, text: str) -> None:
        self.front.swap(self._engine(parse_policy(text)))

    def _engine(self, policy: PolicyFile) -> PolicyEngine:
        return PolicyEngine(policy, builtins=default_builtins(self.root), root=self.root)


@asynccontextmanager
async def kernel(tmp_path: Path, policy: str = ALLOW_READ) -> Any:
    state, project = tmp_path / "state", tmp_path / "project"
    project.mkdir()
    store = PluginStore(tmp_path / "home" / "plugins")
    audit = await AuditLog.open(state)
    await audit.record(Event("kernel_start", input_summary="test"))
    engine = PolicyEngine(parse_policy(policy), builtins=default_builtins(project), root=project)
    front = AuditedPolicy(engine, audit)
    activated = await activate(
        state, Registry.builtin(kernel_tools()), front.engine.evaluate, audit, store
    )
    server = KernelServer(
        SyscallTable(
            default_methods(), plugin_methods(front, audit, state, lambda: activated, store)
        )
    )
    cli, plugin = tmp_path / "run" / "kernel.sock", tmp_path / "sb" / "kernel.sock"
    await server.listen(cli)
    await server.listen(plugin, binding="tool:evil-tool:c1")
    try:
        yield Kernel(state, store, front, cli, plugin, project)
    finally:
        await server.close()
        await activated.close()
        await audit.close()


def request(folder: Path, **answer: Any) -> dict[str, Any]:
    return {"source": str(folder), "files": encode_files(read_tree(folder)), **answer}


def call(sock: Path, params: Any, name: str = "fluffy-cli") -> Any:
    with SyncClient(str(sock), timeout=10, plugin_name=name) as client:
        return client.call("plugin.install", params)


def refused(sock: Path, params: Any, name: str = "fluffy-cli") -> FluffyError:
    with pytest.raises(FluffyError) as caught:
        call(sock, params, name)
    return caught.value


@sync
async def test_a_plan_shows_the_plugin_and_records_nothing(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        answer = await asyncio.to_thread(call, k.cli, request(folder))
        shown = answer["plan"]
        assert answer["approved"] is False
        assert (shown["name"], shown["version"], shown["source"]) == (
            "demo-tool",
            "1.0.0",
            str(folder),
        )
        assert [t["name"] for t in shown["tools"]] == ["demo.echo"]
        assert shown["required_capabilities"] == ["fs.read"]
        assert shown["tags"] == ["demo", "third_party"]
        assert shown["warnings"] == []  # the policy allows what it needs
        assert shown["digest"] == tree_digest(read_tree(folder))
        assert k.entries("plugin_install_approved") == k.entries("plugin_install_refused") == []
        assert not any((k.state / REVIEW_DIR).iterdir())  # the unpacked copy is gone
        assert k.store.names() == []  # the kernel never writes the store


@sync
async def test_the_pre_check_uses_the_kernels_current_policy(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        k.swap("capabilities: []\n")  # as policy.update does
        shown = (await asyncio.to_thread(call, k.cli, request(folder)))["plan"]
    assert any(
        w.startswith("capability fs.read: the current policy denies it") for w in shown["warnings"]
    )
    assert any(w.startswith("tool demo.echo: no policy rule allows") for w in shown["warnings"])


@sync
async def test_an_approval_is_recorded_before_the_answer(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        digest = (await asyncio.to_thread(call, k.cli, request(folder)))["plan"]["digest"]
        answer = await asyncio.to_thread(call, k.cli, request(folder, approve=True, digest=digest))
        assert answer["approved"] is True and answer["plan"]["digest"] == digest
        recorded = k.entries("plugin_install_approved")  # durable when the answer came
    [entry] = recorded
    assert entry["caller"] == "user" and entry["syscall_type"] == "plugin.install"
    assert entry["policy_decision"] == "review_required"
    assert entry["policy_rule_name"] == "builtin:plugin-install"
    assert entry["metadata"]["plugin"] == "demo-tool" and entry["metadata"]["digest"] == digest
    assert entry["metadata"]["tools"] == "demo.echo"
    assert entry["metadata"]["capabilities"] == "fs.read"


@sync
async def test_a_no_from_the_user_is_refused_and_recorded(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        digest = tree_digest(read_tree(folder))
        error = await asyncio.to_thread(
            refused, k.cli, request(folder, approve=False, digest=digest)
        )
        assert isinstance(error, PluginNotConfirmed) and error.code == "plugin.not_confirmed"
        assert "demo-tool 1.0.0 was not installed: the user did not approve it" in error.what
        [entry] = k.entries("plugin_install_refused")
        assert k.entries("plugin_install_approved") == []
    assert (entry["policy_decision"], entry["policy_rule_name"]) == ("denied", "user")
    assert entry["metadata"]["error_code"] == "plugin.not_confirmed"


@sync
async def test_an_answer_for_other_files_than_were_reviewed_is_refused(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        digest = tree_digest(read_tree(folder))
        (folder / "plugin.py").write_text((folder / "plugin.py").read_text() + "\n# changed\n")
        error = await asyncio.to_thread(
            refused, k.cli, request(folder, approve=True, digest=digest)
        )
        assert isinstance(error, PluginInstallRefused)
        assert "differs from the plan that was reviewed" in error.what
        assert k.entries("plugin_install_approved") == []
        assert len(k.entries("plugin_install_refused")) == 1


@sync
async def test_a_bad_manifest_is_refused_naming_the_users_folder(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "bad-tool", data=manifest("bad-tool", runtime="deno"))
    async with kernel(tmp_path) as k:
        error = await asyncio.to_thread(refused, k.cli, request(folder))
        [entry] = k.entries("plugin_install_refused")
    assert isinstance(error, PluginManifestInvalid)
    assert str(folder / "manifest.yaml") in error.what and str(k.state) not in error.what
    assert "runtime" in error.what and error.fix
    assert entry["metadata"]["error_code"] == "plugin.manifest_invalid"
    assert entry["deny_reason"].startswith(str(folder))


@sync
async def test_a_built_in_name_is_rejected(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "fs-tool", "fs-tool")
    async with kernel(tmp_path) as k:
        error = await asyncio.to_thread(refused, k.cli, request(folder))
        assert isinstance(error, PluginRejected) and "belongs to a built-in plugin" in error.what
        assert len(k.entries("plugin_install_refused")) == 1


@sync
async def test_a_name_installed_on_the_host_is_rejected(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        registry = await open_home(k.store, k.front.engine.evaluate)
        try:
            await install(registry, k.store, await plan(registry, folder))
        finally:
            await registry.close()
        error = await asyncio.to_thread(refused, k.cli, request(folder))
    assert isinstance(error, PluginRejected)
    assert "a plugin named 'demo-tool' is already installed" in error.what


@sync
async def test_only_the_users_cli_socket_may_install(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        digest = tree_digest(read_tree(folder))
        params = request(folder, approve=True, digest=digest)
        error = await asyncio.to_thread(refused, k.plugin, params, "evil-tool")
        assert isinstance(error, PluginInstallDenied) and error.code == "plugin.install_denied"
        assert "tool:evil-tool:c1" in error.why
        [entry] = k.entries("plugin_install_refused")
        assert k.entries("plugin_install_approved") == []
    assert entry["caller"] == "plugin:evil-tool@tool:evil-tool:c1"
    assert entry["policy_rule_name"] == "kernel.plugin_install.cli_only"
    assert "plugin" not in entry["metadata"]  # its files were not even read


@sync
async def test_a_policy_that_denies_plugin_install_wins(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path, DENY_INSTALL) as k:
        digest = tree_digest(read_tree(folder))
        error = await asyncio.to_thread(
            refused, k.cli, request(folder, approve=True, digest=digest)
        )
        [entry] = k.entries("plugin_install_refused")
    assert isinstance(error, PluginInstallDenied) and "no plugins here" in error.why
    assert entry["policy_rule_name"] == "no plugins here"


def test_installing_a_plugin_always_needs_review_whatever_the_rules_say(tmp_path: Path) -> None:
    allow_all = DENY_INSTALL.replace("no plugins here", "all plugins").replace("deny", "allow")
    engine = PolicyEngine(
        parse_policy(allow_all), builtins=default_builtins(tmp_path), root=tmp_path
    )
    decision = engine.evaluate(Request("plugin.install", Caller("user")))
    assert decision.result == "require_review"
    assert "builtin:plugin-install" in [verdict.rule for verdict in decision.matched]


def _malformed(folder: Path) -> Iterator[tuple[Any, type[FluffyError]]]:
    good = request(folder)
    yield None, InvalidPayload
    yield {"source": str(folder)}, InvalidPayload
    yield {**good, "extra": 1}, InvalidPayload
    yield {**good, "approve": True}, InvalidPayload  # an answer without the digest
    yield {**good, "digest": "xyz", "approve": True}, InvalidPayload
    yield {**good, "files": [{"path": "plugin.py", "data": "%%%"}]}, InvalidPayload
    yield {**good, "files": [*good["files"], good["files"][0]]}, InvalidPayload
    for path in ("../escape.py", "/etc/passwd", "a//b.py", "x/./y.py", "__pycache__/m.pyc"):
        evil = {"path": path, "data": base64.b64encode(b"x").decode()}
        yield {**good, "files": [*good["files"], evil]}, PluginInstallRefused
    clash = [{"path": p, "data": base64.b64encode(b"x").decode()} for p in ("a", "a/b.py")]
    yield {**good, "files": [*good["files"], *clash]}, PluginInstallRefused  # file and folder
    big = {"path": "big.bin", "data": base64.b64encode(b"0" * (1024 * 1024 + 1)).decode()}
    yield {**good, "files": [*good["files"], big]}, PluginInstallRefused  # over 1 MiB
    parts = [
        {"path": f"part{i}.bin", "data": base64.b64encode(b"0" * (900 * 1024)).decode()}
        for i in range(3)
    ]
    yield {**good, "files": [*good["files"], *parts]}, PluginInstallRefused  # over 2 MiB
    frame = {"path": "huge.bin", "data": base64.b64encode(b"0" * (3 * 1024 * 1024)).decode()}
    yield {**good, "files": [frame]}, ConnectionClosed  # over the 4 MiB frame: cut off


@sync
async def test_malformed_requests_get_a_stable_code_and_the_kernel_keeps_serving(
    tmp_path: Path,
) -> None:
    folder = make_plugin(tmp_path / "demo-tool")
    async with kernel(tmp_path) as k:
        for params, kind in _malformed(folder):
            error = await asyncio.to_thread(refused, k.cli, params)
            assert type(error) is kind, (params if params is None else params.keys(), error)
        assert not (tmp_path / "escape.py").exists() and not (k.state.parent / "escape.py").exists()
        answer = await asyncio.to_thread(call, k.cli, request(folder))  # still serving
        assert answer["plan"]["name"] == "demo-tool"
