"""The warm pool of single-use sandboxes on real engines (kernel.tools.sandbox.pool, ADR-038).

Through a real kernel: each call runs in its own pooled sandbox, which is destroyed
after it (the audit names one sandbox per call); a policy reload leaves no earlier
sandbox to be handed out; a killed kernel's pool is removed by the next kernel.  On the
plugin runner with a real engine: a rebuilt image's pooled sandbox is never used, and
the pool empties under memory pressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.ipc.client import SyncClient
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.runtime import LABEL_SANDBOX
from fluffy.kernel.tools.sandbox.envfilter import sandbox_environment
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.tools.sandbox.pool import SandboxPool
from fluffy.kernel.tools.sandbox.poolslots import PoolLimits
from tests.conftest import connect_engine
from tests.integration.tool_support import FLUFFY, Kernel, call, demo_project

PROJECT_LABEL = "org.fluffy.project"


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def _containers(runtime: str, *labels: str, running: bool = False) -> dict[str, str]:
    """container id -> its sandbox id, of the containers carrying ``labels``."""
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    listed = subprocess.run(
        [runtime, "ps", "-q", "--no-trunc", *([] if running else ["-a"]), *filters],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    out = {}
    for container in listed:
        sandbox = subprocess.run(
            [runtime, "inspect", "--format", f'{{{{index .Config.Labels "{LABEL_SANDBOX}"}}}}',
             container],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        if sandbox:
            out[container] = sandbox
    return out


def _until(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def _pool(client: SyncClient) -> dict[str, Any]:
    pool: dict[str, Any] = client.call("kernel.ping")["memory"]["pool"]
    return pool


def _writing_session(kernel: Kernel) -> tuple[SyncClient, str]:
    client = kernel.client()
    sid = client.call("session.create")["session_id"]
    client.call("session.message", {"session_id": sid, "text": "add a test"})
    assert call(client, sid, "plan.complete", summary="tests first")["ok"]
    return client, sid


@contextlib.contextmanager
def writing(kernel: Kernel) -> Iterator[tuple[SyncClient, str]]:
    """A session in test_writing on the started ``kernel``, which is stopped after."""
    try:
        client, sid = _writing_session(kernel)
        with client:
            yield client, sid
    finally:
        kernel.stop()


def test_every_call_gets_its_own_pooled_sandbox_destroyed_after_it(
    tmp_path: Path, runtime: str
) -> None:
    project = demo_project(tmp_path)
    kernel = Kernel(tmp_path, project, runtime).start()
    with writing(kernel) as (client, sid):
        used = []
        for i in range(3):
            _until(lambda: _pool(client)["idle"] >= 1, "the pool has a sandbox ready")
            idle = set(_containers(runtime, f"{PROJECT_LABEL}={project}", running=True).values())
            answer = call(client, sid, "fs.write", path=f"tests/test_p{i}.py", content="x = 1\n")
            assert answer["ok"], answer
            assert answer["timings"]["warm"] == 1.0  # no wait for a container
            used.append(idle)
    results = [e for e in kernel.entries("tool_result") if e["syscall_type"] == "fs.write"]
    sandboxes = [e["sandbox_id"] for e in results]
    assert len(sandboxes) == 3 and len(set(sandboxes)) == 3  # one sandbox per call
    for sandbox, idle in zip(sandboxes, used, strict=True):
        assert sandbox in idle  # it was a pooled one, made before the call
    assert all(e["metadata"]["sandbox_warm"] == "true" for e in results)
    left = _containers(runtime, f"{PROJECT_LABEL}={project}")
    assert not set(sandboxes) & set(left.values())  # each destroyed after its call
    assert not left  # and the pool's idle ones when the kernel stopped


def test_a_policy_reload_leaves_no_earlier_sandbox_to_hand_out(
    tmp_path: Path, runtime: str
) -> None:
    project = demo_project(tmp_path)
    kernel = Kernel(tmp_path, project, runtime).start()
    with writing(kernel) as (client, sid):
        idle = _until(lambda: _pool(client)["idle"], "the pool has a sandbox ready")
        before = set(_containers(runtime, f"{PROJECT_LABEL}={project}", running=True).values())
        policy = yaml.safe_load(client.call("policy.get")["text"]) or {}
        policy.setdefault("tools", {})["max_result_tokens"] = 3000  # not part of a recipe
        new = tmp_path / "policy.yaml"
        new.write_text(yaml.safe_dump(policy))
        edit = subprocess.run(
            [FLUFFY, "config", "policy", "edit", "--socket", str(kernel.sock), "--file",
             str(new), "--yes", "--json"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert edit.returncode == 0, edit.stdout + edit.stderr
        answer = call(client, sid, "fs.write", path="tests/test_after.py", content="y = 2\n")
        assert answer["ok"], answer
        assert _pool(client)["stale"] >= idle  # every idle one was dropped
    result = [e for e in kernel.entries("tool_result") if e["syscall_type"] == "fs.write"][-1]
    assert before and result["sandbox_id"] not in before


def test_a_killed_kernel_leaves_no_pool_sandbox_after_restart(tmp_path: Path, runtime: str) -> None:
    project = demo_project(tmp_path)
    kernel = Kernel(tmp_path, project, runtime).start()
    client, _ = _writing_session(kernel)
    _until(lambda: _pool(client)["idle"] >= 1, "the pool has a sandbox ready")
    client.close()
    kernel.kill()  # no clean-up runs: its idle sandboxes stay behind
    left = _containers(runtime, f"{PROJECT_LABEL}={project}")
    assert left, "the killed kernel's pool sandboxes should still exist before the restart"
    again = Kernel(tmp_path, project, runtime).start()
    try:
        _until(
            lambda: not set(left) & set(_containers(runtime, f"{PROJECT_LABEL}={project}")),
            "the new kernel removed the old kernel's sandboxes",
        )
    finally:
        again.stop()


# -- the plugin runner with a real engine --------------------------------------------------
@pytest.fixture()
def manager(runtime: str) -> Iterator[ContainerManager]:
    from fluffy.images.templates import open_manager

    with connect_engine(runtime) as connected:
        opened = open_manager(connected)
        try:
            yield opened
        finally:
            opened.close()


def _runner(tmp_path: Path, manager: ContainerManager, free: list[float]) -> PluginRunner:
    root = tmp_path / "kernel"
    root.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    runner = PluginRunner(lambda: manager, root, environment=lambda: sandbox_environment().env)
    runner.pool = SandboxPool(runner, PoolLimits(), host_free=lambda: free[0])
    return runner


def _write_call(runner: PluginRunner, project: Path, image: str) -> Any:
    return runner.run(
        plugin="fs-tool",
        module="fluffy.plugins.fs_tool",
        template="code-executor",
        call_id=f"c{secrets.token_hex(4)}",
        tool="fs.write",
        args={"path": "notes.txt", "content": "hello\n"},
        session_mode="strict",
        project=project,
        staged_dir=None,
        timeout_s=60,
        image=image,
    )


def test_a_pooled_sandbox_of_a_rebuilt_image_is_never_handed_out(
    tmp_path: Path, runtime: str, manager: ContainerManager
) -> None:
    project = demo_project(tmp_path)
    base = manager.images["code-executor"]
    ref = f"fluffy/pool-test:{secrets.token_hex(6)}"
    subprocess.run([runtime, "tag", base, ref], check=True)
    runner = _runner(tmp_path, manager, [0.5])

    async def main() -> str:
        assert runner.pool is not None
        recipe = runner.recipe(
            plugin="fs-tool",
            module="fluffy.plugins.fs_tool",
            template="code-executor",
            project=project,
            staged_dir=None,
            timeout_s=60,
            image=ref,
        )
        runner.pool.expect(recipe)
        async with asyncio.timeout(90):
            while not any(s.ready for s in runner.pool.idle.get(recipe, [])):
                await asyncio.sleep(0.05)
        stale = runner.pool.idle[recipe][0].sandbox
        (tmp_path / "Dockerfile").write_text(f"FROM {base}\nLABEL org.fluffy.test=rebuilt\n")
        await asyncio.to_thread(
            subprocess.run, [runtime, "build", "-q", "-t", ref, str(tmp_path)], check=True,
            capture_output=True,
        )  # fmt: skip
        outcome = await _write_call(runner, project, ref)
        try:
            assert outcome.timings["warm"] == 0.0  # the pooled one was not used
            assert outcome.sandbox.sandbox_id != stale.sandbox_id
            container = outcome.sandbox.container_id or ""
            made_from = manager.runtime.inspect(container).image_id
            assert made_from == manager.runtime.image_id(ref)  # the rebuilt image
            assert outcome.result["changes"][0]["path"] == "notes.txt"
        finally:
            await runner.release(outcome)
        await runner.close()
        assert stale.state == "destroyed"
        return stale.sandbox_id

    try:
        stale_id = asyncio.run(main())
    finally:
        subprocess.run([runtime, "rmi", "-f", ref], capture_output=True, check=False)
    assert not _containers(runtime, f"{LABEL_SANDBOX}={stale_id}")  # destroyed, not kept


def test_the_pool_empties_under_memory_pressure(
    tmp_path: Path, runtime: str, manager: ContainerManager
) -> None:
    project = demo_project(tmp_path)
    free = [0.5]
    runner = _runner(tmp_path, manager, free)

    async def main() -> list[str]:
        assert runner.pool is not None
        image = manager.images["code-executor"]
        outcome = await _write_call(runner, project, image)  # demand: the pool fills
        await runner.release(outcome)
        async with asyncio.timeout(90):
            while runner.pool.size < 1:
                await asyncio.sleep(0.05)
        idle = [s.sandbox.sandbox_id for slots in runner.pool.idle.values() for s in slots]
        free[0] = 0.02  # the machine runs short of memory
        async with asyncio.timeout(10):
            while runner.pool.size:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)
        assert runner.pool.size == 0  # and nothing new is made meanwhile
        await runner.close()
        return idle

    idle = asyncio.run(main())
    assert idle
    for sandbox in idle:
        assert not _containers(runtime, f"{LABEL_SANDBOX}={sandbox}")
