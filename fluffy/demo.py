"""`fluffy demo`: the bundled demo project's tests, run inside a real L2 sandbox.

It shows the path every later feature takes: the project is mounted read-only into a
``code-executor`` container with no network, a read-only root filesystem, no
capabilities and an unprivileged user; the test run happens there, and a probe in the
same kind of sandbox proves each of those restrictions by trying to break it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.errors import ConfigError, SandboxRunFailed
from fluffy.images.builder import plan_images
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.oneshot import OneShot, RunResult, run_oneshot
from fluffy.paths import package_root

#: Runs inside the sandbox: every line is one attempt that must fail (or a fact).
PROBE = r"""
import errno, json, os
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("write_project", lambda: open("/workspace/fluffy-probe.txt", "w"))
attempt("write_rootfs", lambda: open("/etc/fluffy-probe.txt", "w"))
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
out["interfaces"] = sorted(os.listdir("/sys/class/net"))
out["uid"] = os.getuid()
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["no_new_privs"] = status["NoNewPrivs"].strip()
out["seccomp"] = status["Seccomp"].strip()
out["cap_eff"] = status["CapEff"].strip()
print(json.dumps(out))
"""

#: What each probe must show; the demo fails if any differs.
EXPECTED: dict[str, Any] = {
    "write_project": "EROFS",
    "write_rootfs": "EROFS",
    "routes": [],
    "interfaces": ["lo"],
    "uid": 10001,
    "no_new_privs": "1",
    "seccomp": "2",
    "cap_eff": "0000000000000000",
}


@dataclass
class DemoResult:
    image: str
    tests: RunResult
    probes: dict[str, Any]

    @property
    def probe_failures(self) -> dict[str, tuple[Any, Any]]:
        return {
            key: (want, self.probes.get(key))
            for key, want in EXPECTED.items()
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
                "seconds": round(self.tests.seconds, 3),
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


def _image_ref(engine: Engine) -> str:
    for status in plan_images(engine, ["code-executor"]):
        if status.name == "code-executor":
            if status.state != "current":
                raise SandboxRunFailed(
                    f"image {status.ref} is not built",
                    why="the demo runs in the code-executor sandbox image",
                    fix="Run `fluffy images build`.",
                )
            return status.ref
    raise AssertionError("code-executor is always planned")


def run_demo(engine: Engine, project: Path | None = None) -> DemoResult:
    project = (project or demo_project()).resolve()
    image = _image_ref(engine)
    mounts = {project: "/workspace"}
    tests = run_oneshot(
        engine,
        OneShot(
            image=image,
            command=["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no"],
            purpose="demo-tests",
            readonly_mounts=mounts,
            workdir="/workspace",
        ),
    )
    probe = run_oneshot(
        engine,
        OneShot(
            image=image,
            command=["python3", "-c", PROBE],
            purpose="demo-probe",
            readonly_mounts=mounts,
            workdir="/workspace",
        ),
    )
    try:
        probes = json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise SandboxRunFailed(
            "the isolation probe printed no result",
            why=(probe.stderr or probe.stdout).strip()[-1500:],
            fix="Run `fluffy doctor`; rebuild the images with `fluffy images build`.",
        ) from exc
    return DemoResult(image=image, tests=tests, probes=probes)
