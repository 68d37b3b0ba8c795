"""`fluffy plugin install` while the project's kernel runs: reviewed and audited by the
real L1 kernel (started by `fluffy start` through the bootstrap), on Docker and Podman.

The CLI sends the plugin's bytes to ``plugin.install``; the kernel answers with its plan
and records the user's answer in the project's audit log; only an approval installs,
and the installed plugin's tools are the kernel's after its next start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fluffy.ipc.client import SyncClient
from tests.conftest import connect_engine

pytestmark = pytest.mark.e2e

FLUFFY = str(Path(sys.executable).parent / "fluffy")
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-project"
EXAMPLE = ROOT / "examples" / "plugins" / "lint-tool"


@pytest.fixture(scope="module", params=["docker", "podman"])
def kernel_image(request: pytest.FixtureRequest) -> tuple[str, str]:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        refs = {status.name: status.ref for status in build_images(connected)}
    return str(request.param), refs["kernel"]


def run(env: dict[str, str], *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *args], env=env, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def audit_of(env: dict[str, str], state: Path, event_type: str) -> list[dict[str, Any]]:
    proc = run(env, "audit", "log", "--state-dir", str(state), "--type", event_type, "--json")
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout)["entries"])


def test_install_is_reviewed_and_audited_by_the_running_kernel(
    tmp_path: Path, kernel_image: tuple[str, str]
) -> None:
    from fluffy.bootstrap.supervisor import paths

    runtime, image = kernel_image
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    if os.getuid() == 0:  # a user's project: the kernel runs as its owner
        for path in [project, *project.rglob("*")]:
            os.lchown(path, 1000, 1000)
    home = tmp_path / "home"
    env = {**os.environ, "FLUFFY_HOME": str(home), "FLUFFY_KERNEL_IMAGE": image,
           "FLUFFY_RUNTIME": runtime}  # fmt: skip
    env.pop("FLUFFY_PLUGIN_STORE", None)
    where = paths(home, str(project.resolve()))
    started = run(env, "start", "--project", str(project), "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        # no terminal, no --yes: the kernel shows its plan, records the refusal
        refused = run(env, "plugin", "install", str(EXAMPLE), "--project", str(project))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "lint.check" in refused.stdout and "reviewed by  the kernel" in refused.stdout
        assert "ERROR: lint-tool 1.0.0 was not installed" in refused.stderr
        assert "the kernel recorded the refusal" in refused.stderr
        assert not (home / "plugins" / "lint-tool").exists()
        [no] = audit_of(env, where["state"], "plugin_install_refused")
        assert (no["caller"], no["policy_rule_name"]) == ("user", "user")
        assert no["metadata"]["error_code"] == "plugin.not_confirmed"
        assert no["metadata"]["plugin"] == "lint-tool"

        # --yes: approved, recorded before the CLI installs the reviewed bytes
        done = run(env, "plugin", "install", str(EXAMPLE), "--yes", "--json",
                   "--project", str(project))  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        assert answer["audited"] is True and answer["installed"]["state"] == "REGISTERED"
        [yes] = audit_of(env, where["state"], "plugin_install_approved")
        assert yes["caller"] == "user" and yes["policy_decision"] == "review_required"
        assert yes["policy_rule_name"] == "builtin:plugin-install"
        assert yes["metadata"]["digest"] == answer["plan"]["digest"]
        assert yes["metadata"]["tools"] == "lint.check"
        copy = home / "plugins" / "lint-tool" / "1.0.0"
        assert (copy / "plugin.py").read_bytes() == (EXAMPLE / "plugin.py").read_bytes()
        verified = run(env, "audit", "verify", "--state-dir", str(where["state"]), "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr

        # the next kernel activates it: its tool is the kernel's
        stopped = run(env, "stop", "--project", str(project))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        again = run(env, "start", "--project", str(project), "--json")
        assert again.returncode == 0, again.stdout + again.stderr
        with SyncClient(str(where["run"] / "kernel.sock"), timeout=30) as client:
            tools = {tool["name"] for tool in client.call("tool.list")["tools"]}
        assert "lint.check" in tools
    finally:
        run(env, "stop", "--project", str(project), timeout=120)
