"""The ContainerRuntime operations on each real engine, and garbage collection."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.runtime import (
    LABEL_MANAGED,
    LABEL_SANDBOX,
    LABEL_SESSION,
    ContainerStatus,
)


def test_pause_resume_exec_logs_kill(sandbox_manager: ContainerManager) -> None:
    runtime = sandbox_manager.runtime
    config = template_config("code-executor", max_duration="60s")
    sandbox = sandbox_manager.create(config, ["sh", "-c", "echo started; exec sleep 60"])
    cid = sandbox.container_id or ""
    try:
        assert runtime.ping() is True
        assert runtime.inspect(cid).status is ContainerStatus.RUNNING
        runtime.pause(cid)
        assert runtime.inspect(cid).status is ContainerStatus.PAUSED
        runtime.resume(cid)
        assert runtime.inspect(cid).status is ContainerStatus.RUNNING
        result = runtime.run(cid, ["sh", "-c", "id -u; echo err >&2; exit 5"], timeout=30)
        assert (result.exit_code, result.stdout.strip(), result.stderr.strip()) == (
            5,
            "10001",
            "err",
        )
        deadline = time.monotonic() + 10
        while "started" not in "".join(runtime.logs(cid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "started" in "".join(runtime.logs(cid))
        runtime.kill(cid)
        assert runtime.inspect(cid).status is ContainerStatus.EXITED
    finally:
        sandbox_manager.destroy(sandbox)
    assert runtime.inspect(cid).status is ContainerStatus.MISSING


def test_volumes_carry_labels_and_are_removed(sandbox_manager: ContainerManager) -> None:
    runtime = sandbox_manager.runtime
    name = f"fluffy-{sandbox_manager.session_id}-testvol"
    runtime.create_volume(name, {LABEL_MANAGED: "1", LABEL_SESSION: sandbox_manager.session_id})
    assert name in runtime.list_volumes({LABEL_MANAGED: "1"})
    runtime.remove_volume(name)
    assert name not in runtime.list_volumes({LABEL_MANAGED: "1"})


def test_garbage_of_a_crashed_session_is_collected(
    sandbox_manager: ContainerManager, tmp_path: Path
) -> None:
    runtime = sandbox_manager.runtime
    crashed = ContainerManager(
        runtime, sandbox_manager.images, session_id="crashed", root=sandbox_manager.root
    )
    orphan = crashed.create(template_config("code-executor", max_duration="60s"), ["sleep", "60"])
    # A running kernel's sandbox, made under its own state folder (another worker's,
    # another project's): nothing here says it ended, so it stays.
    kernel = ContainerManager(runtime, sandbox_manager.images, root=tmp_path / "kernel")
    running = kernel.create(template_config("code-executor", max_duration="60s"), ["sleep", "60"])
    # The session dies without cleaning up: its pid is gone, its resources remain.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (sandbox_manager.root / "sessions" / "crashed").write_text(str(dead.pid))
    assert runtime.list_containers({LABEL_SANDBOX: orphan.sandbox_id})
    report = sandbox_manager.collect_garbage()
    assert orphan.container_id in report.containers
    assert runtime.list_containers({LABEL_SANDBOX: orphan.sandbox_id}) == []
    assert runtime.list_containers({LABEL_SANDBOX: running.sandbox_id})
    kernel.close()
    assert not orphan.output_dir.exists()
    assert (sandbox_manager.root / "sessions" / sandbox_manager.session_id).exists()


def test_in_sandbox_host_can_tighten_its_own_filter(sandbox_manager: ContainerManager) -> None:
    script = (
        "import subprocess, errno\n"
        "subprocess.run(['true'], check=True)\n"
        "from fluffy.sandboxes.tighten import tighten\n"
        "tighten('standard')\n"
        "try:\n"
        "    subprocess.run(['true'])\n"
        "    print('allowed')\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno])\n"
    )
    outcome = sandbox_manager.run(
        template_config("code-executor", max_duration="60s"), ["python3", "-c", script]
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout.strip() == "EPERM"
