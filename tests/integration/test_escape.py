"""The escape suite: attempts that must fail inside real sandboxes, on Docker and Podman.

Each template's sandbox runs the probe (``fluffy.sandboxes.probe``); every outcome is
compared with :mod:`fluffy.seccomp.cases`, which also lists what each template must
still allow, so a profile that denied everything could not pass.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fluffy.kernel.containers.config import TEMPLATES, template_config
from fluffy.kernel.containers.lifecycle import FailureReason
from fluffy.kernel.containers.manager import EXEC_TMP_TEMPLATES, ContainerManager, RunOutcome
from fluffy.kernel.containers.runtime import LABEL_SANDBOX
from fluffy.seccomp.cases import CONTAINER_CASES, FACTS, SECCOMP_CASES, expected

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "demo-project"


def _run(
    manager: ContainerManager, template: str, command: list[str], **overrides: object
) -> RunOutcome:
    config = template_config(template, project_dir=PROJECT, **{"max_duration": "60s", **overrides})
    return manager.run(config, command)


def _gone(manager: ContainerManager, outcome: RunOutcome) -> None:
    """Nothing of the sandbox is left: container, output folder."""
    sandbox = outcome.sandbox
    assert manager.runtime.list_containers({LABEL_SANDBOX: sandbox.sandbox_id}) == []
    assert not sandbox.output_dir.exists()
    assert [str(s) for s, _ in sandbox.history][-2:] == ["cleanup", "destroyed"]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_probe_outcomes_match_the_template(
    sandbox_manager: ContainerManager, template: str
) -> None:
    profile = TEMPLATES[template].seccomp_profile
    want: dict[str, object] = {
        **expected(SECCOMP_CASES, profile),
        **expected(CONTAINER_CASES, profile),
        **FACTS,
    }
    if template in EXEC_TMP_TEMPLATES:  # test code may run what it writes to /tmp (issue 33)
        want["exec_tmp"] = "ok"
    cases = [*SECCOMP_CASES, *CONTAINER_CASES, "facts"]
    outcome = _run(sandbox_manager, template, ["python3", "-m", "fluffy.sandboxes.probe", *cases])
    assert outcome.exit_code == 0, outcome.stderr
    got = json.loads(outcome.stdout.strip().splitlines()[-1])
    assert {k: got.get(k) for k in want} == want
    _gone(sandbox_manager, outcome)


def test_fork_bomb_is_held_by_the_pid_limit(sandbox_manager: ContainerManager) -> None:
    bomb = (
        "import errno, os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 10000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno], n)\n"
    )
    outcome = _run(sandbox_manager, "code-executor", ["python3", "-c", bomb], max_pids=32)
    code, forked = outcome.stdout.split()
    assert code == "EAGAIN" and int(forked) < 32
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks
    _gone(sandbox_manager, outcome)


def test_memory_bomb_is_oom_killed_failed_and_cleaned(sandbox_manager: ContainerManager) -> None:
    bomb = "x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))\n"
    outcome = _run(sandbox_manager, "code-executor", ["python3", "-c", bomb], memory_limit="64MiB")
    assert outcome.failure is FailureReason.OOM, (outcome.exit_code, outcome.stderr[-500:])
    _gone(sandbox_manager, outcome)


def test_command_outliving_max_duration_is_killed_and_cleaned(
    sandbox_manager: ContainerManager,
) -> None:
    outcome = _run(sandbox_manager, "code-executor", ["sleep", "60"], max_duration="2s")
    assert outcome.failure is FailureReason.TIMEOUT
    _gone(sandbox_manager, outcome)


def test_what_the_template_allows_still_works(sandbox_manager: ContainerManager) -> None:
    """Positive control beside the probe: real work in code-executor (git, tests, output)."""
    script = (
        "set -e; cp -r /workspace /tmp/p; cd /tmp/p; git init -q; "
        "python3 -m pytest -q -p no:cacheprovider > /output/report.txt; cat /output/report.txt"
    )
    config = template_config("code-executor", project_dir=PROJECT, max_duration="60s")
    outcome = sandbox_manager.run(config, ["sh", "-c", script], keep=True)
    try:
        assert outcome.exit_code == 0, outcome.stderr
        assert "3 passed" in outcome.stdout  # written to /output (its own tmpfs), read back
        assert not list(outcome.sandbox.output_dir.iterdir())  # nothing reached the kernel
    finally:
        sandbox_manager.destroy(outcome.sandbox)
    _gone(sandbox_manager, outcome)
