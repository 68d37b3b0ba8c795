"""`fluffy demo`: the bundled demo project's tests, run inside a real L2 sandbox.

It shows the path every later feature takes: the container manager starts a
``code-executor`` sandbox (seccomp profile ``standard``, no network, read-only root and
project, no capabilities, uid 10001), the test run happens there, and the escape probe in
the same kind of sandbox proves those restrictions by trying to break them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.errors import ConfigError, SandboxRunFailed
from fluffy.host.engine import TEMPLATES, Engine, RunOutcome, sandbox_identity, template_config
from fluffy.images.templates import open_manager
from fluffy.paths import package_root
from fluffy.seccomp.cases import CONTAINER_CASES, FACTS, SECCOMP_CASES

#: The probe cases the demo shows (each an attempt that must fail, plus facts).
PROBE_CASES = ("write_project", "write_rootfs", "engine_socket", "ptrace_traceme", "facts")


def expected_probes() -> dict[str, Any]:
    profile = TEMPLATES["code-executor"].seccomp_profile
    want: dict[str, Any] = dict(FACTS)
    # a sandbox runs as the kernel's user: 10001 under root, else the caller's own uid
    want["uid"], want["gid"] = sandbox_identity()
    for case in PROBE_CASES[:-1]:
        want[case] = {**SECCOMP_CASES, **CONTAINER_CASES}[case][profile]
    return want


@dataclass
class DemoResult:
    image: str
    tests: RunOutcome
    probes: dict[str, Any]

    @property
    def probe_failures(self) -> dict[str, tuple[Any, Any]]:
        return {
            key: (want, self.probes.get(key))
            for key, want in expected_probes().items()
            if self.probes.get(key) != want
        }

    @property
    def ok(self) -> bool:
        return self.tests.exit_code == 0 and not self.probe_failures

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "image": self.image,
            "tests": {
                "exit_code": self.tests.exit_code,
                "output": self.tests.stdout[-4000:],
            },
            "probes": self.probes,
            "probe_failures": {
                k: {"want": w, "got": g} for k, (w, g) in self.probe_failures.items()
            },
        }


def demo_project() -> Path:
    """The bundled demo project (examples/demo-project in the source tree)."""
    path = package_root().parent / "examples" / "demo-project"
    if not (path / "pyproject.toml").is_file():
        raise ConfigError(
            f"the demo project is not at {path}",
            why="it ships with fluffy's source tree, not with an installed wheel",
            fix="Run the demo from a clone of fluffy (`scripts/run`).",
        )
    return path


def run_demo(engine: Engine, project: Path | None = None) -> DemoResult:
    project = (project or demo_project()).resolve()
    manager = open_manager(engine)
    try:
        config = template_config("code-executor", project_dir=project, max_duration="120s")
        tests = manager.run(
            config, ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no"]
        )
        probe = manager.run(config, ["python3", "-m", "fluffy.sandboxes.probe", *PROBE_CASES])
    finally:
        manager.close()
    try:
        probes = json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise SandboxRunFailed(
            "the isolation probe printed no result",
            why=(probe.stderr or probe.stdout).strip()[-1500:],
            fix="Run `fluffy doctor`; rebuild the images with `fluffy images build`.",
        ) from exc
    return DemoResult(image=manager.images["code-executor"], tests=tests, probes=probes)
