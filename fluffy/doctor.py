"""``fluffy doctor``: is this machine ready to run fluffy, and if not, what to do.

Each check returns ok / warn / fail with a detail and, unless ok, a fix.  Any fail
makes the command exit non-zero.  Later subsystems add checks by appending to
:data:`CHECKS`.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluffy.doctor_kernel import kernel_checks
from fluffy.doctor_report import Check, Report
from fluffy.errors import FluffyError
from fluffy.paths import state_dir


def check_python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    # pyproject requires 3.11, so an older interpreter never gets this far.
    return Check("python", "ok", f"Python {version} at {sys.executable}")


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.\-]+", requirement)
    return match[0] if match else requirement


def check_dependencies() -> Check:
    try:
        requires = importlib.metadata.requires("fluffy") or []
    except importlib.metadata.PackageNotFoundError:
        return Check(
            "dependencies",
            "fail",
            "fluffy is not installed as a package",
            "Run `scripts/setup` (or `pip install -e .`).",
        )
    versions: dict[str, str] = {}
    missing: list[str] = []
    for requirement in requires:
        if "extra ==" in requirement:
            continue
        name = _requirement_name(requirement)
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Check(
            "dependencies",
            "fail",
            "missing: " + ", ".join(missing),
            "Run `scripts/setup` (or `pip install -e .`) to install them.",
            {"versions": versions},
        )
    summary = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    return Check("dependencies", "ok", summary, data={"versions": versions})


def check_state_dir() -> Check:
    path = state_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check(
            "state_dir",
            "fail",
            f"{path} is not writable: {exc.strerror or exc}",
            "Set FLUFFY_HOME to a writable folder, or fix the folder's owner/permissions.",
        )
    return Check("state_dir", "ok", f"{path} is writable", data={"path": str(path)})


def _limits_check(engine: Any) -> Check | None:
    """Rootless Podman on cgroups v1 drops every resource limit without a word on its API
    (its CLI says "Resource limits are not supported and ignored on cgroups V1 rootless
    systems"): sandboxes and the kernel then have no memory, pids or CPU cap."""
    if engine.name != "podman":
        return None
    api = engine.client.api
    try:
        host = api.get(api.base_url + "/v4.0.0/libpod/info", timeout=30).json()["host"]
        rootless, cgroups = bool(host["security"]["rootless"]), str(host.get("cgroupVersion"))
    except Exception:  # only a diagnosis: the engine check above already passed
        return None
    if not rootless or cgroups != "v1":
        where = "rootless Podman" if rootless else "Podman"
        return Check("limits", "ok", f"{where} on cgroups {cgroups} enforces the limits")
    return Check(
        "limits",
        "warn",
        "rootless Podman on cgroups v1 ignores memory, pids and CPU limits: a sandbox can "
        "use all of your memory and processes (seccomp, no network, a read-only root, no "
        "capabilities and a non-root user still hold)",
        "Boot with cgroups v2 (systemd.unified_cgroup_hierarchy=1) and delegate the memory, "
        "pids and cpu controllers to users, or use rootful Docker or Podman.",
    )


def engine_checks() -> tuple[list[Check], dict[str, Any] | None]:
    """The engine, its CLI, the base image and fluffy's images."""
    from fluffy.host.engine import connect

    try:
        engine = connect()
    except FluffyError as exc:
        return [Check("engine", "fail", f"{exc.what}. {exc.why}", exc.fix)], None
    checks: list[Check] = []
    info = engine.info
    with engine:
        checks.append(
            Check(
                "engine",
                "ok",
                f"{info.engine} {info.version} (API {info.api_version}) at {info.url}",
                data=info.as_dict(),
            )
        )
        if info.cli:
            checks.append(Check("engine_cli", "ok", f"{info.engine} command at {info.cli}"))
        else:
            checks.append(
                Check(
                    "engine_cli",
                    "warn",
                    f"the `{info.engine}` command is not on PATH",
                    f"Install the {info.engine} client; bootstrap starts the kernel with it.",
                )
            )
        limits = _limits_check(engine)
        if limits is not None:
            checks.append(limits)
        image_checks = _image_checks(engine)
        checks.extend(image_checks)
        # stray images are never used (only exact tags are): the sandboxes can still run
        if all(c.status == "ok" for c in image_checks if c.name != "stray_images"):
            checks.extend(sandbox_checks(engine))
    return checks, info.as_dict()


def sandbox_checks(engine: Any) -> list[Check]:
    """Per template: a probe in a real sandbox shows its seccomp profile applies."""
    import json

    from fluffy.host.engine import TEMPLATES, template_config
    from fluffy.images.templates import open_manager
    from fluffy.seccomp.cases import SECCOMP_CASES, SELF_TEST

    checks: list[Check] = []
    manager = open_manager(engine)
    try:
        for name, template in TEMPLATES.items():
            want = {case: SECCOMP_CASES[case][template.seccomp_profile] for case in SELF_TEST}
            label = f"sandbox:{name}"
            try:
                outcome = manager.run(
                    template_config(name, max_duration="30s"),
                    ["python3", "-m", "fluffy.sandboxes.probe", *SELF_TEST],
                )
                got = json.loads(outcome.stdout.strip().splitlines()[-1])
            except (FluffyError, ValueError, IndexError) as exc:
                checks.append(
                    Check(
                        label,
                        "fail",
                        f"the probe did not run: {exc}",
                        "Run `fluffy images build`, then `fluffy doctor` again.",
                    )
                )
                continue
            if got == want:
                checks.append(
                    Check(
                        label,
                        "ok",
                        f"seccomp {template.seccomp_profile} applies: "
                        + ", ".join(f"{k}={v}" for k, v in got.items()),
                    )
                )
            else:
                checks.append(
                    Check(
                        label,
                        "fail",
                        f"profile {template.seccomp_profile} does not apply: "
                        f"expected {want}, got {got}",
                        "The engine may ignore seccomp profiles (check `docker info` for "
                        "seccomp under Security Options); fluffy cannot run safely there.",
                    )
                )
    finally:
        manager.close()
    return checks


def _image_checks(engine: Any) -> list[Check]:
    from fluffy.errors import ImageNotFound
    from fluffy.images.base import base_image_ref
    from fluffy.images.builder import plan_images

    try:
        plan = plan_images(engine)
    except ImageNotFound as exc:
        has_debootstrap = shutil.which("debootstrap") is not None
        return [
            Check(
                "base_image",
                "fail",
                exc.what,
                "Run `fluffy images build` (it pulls the base, or makes it with debootstrap"
                + ("" if has_debootstrap else ", which must be installed: apt install debootstrap")
                + ").",
            )
        ]
    except FluffyError as exc:
        return [Check("images", "fail", exc.what, exc.fix)]
    checks = [Check("base_image", "ok", f"{base_image_ref()} is present")]
    for status in plan:
        if status.state == "current":
            checks.append(
                Check(
                    f"image:{status.name}", "ok", f"{status.ref} is current", data=status.as_dict()
                )
            )
        else:
            detail = (
                f"{status.ref} is missing; an older build exists (sources or locks changed)"
                if status.state == "stale"
                else f"{status.ref} is missing"
            )
            checks.append(
                Check(
                    f"image:{status.name}",
                    "fail",
                    detail,
                    "Run `fluffy images build` (unchanged images are not rebuilt).",
                    status.as_dict(),
                )
            )
    checks.append(_stray_check(engine))
    return checks


def _stray_check(engine: Any) -> Check:
    from fluffy.images.hygiene import find_orphans, find_strays

    strays = [*find_strays(engine), *find_orphans(engine)]
    if not strays:
        return Check("stray_images", "ok", "no stray fluffy images")
    shown = "; ".join(f"{s.image_id[:19]} ({s.why})" for s in strays[:5])
    more = f" and {len(strays) - 5} more" if len(strays) > 5 else ""
    return Check(
        "stray_images",
        "warn",
        f"{len(strays)} stray or orphaned fluffy image(s): {shown}{more}",
        "Run `fluffy images prune` (a stray is never used as a sandbox image: fluffy takes "
        "images only by their exact content-hash tag; an orphan's project folder is gone).",
        {"strays": [s.as_dict() for s in strays]},
    )


CHECKS: list[Callable[[], Check]] = [check_python, check_dependencies, check_state_dir]


def run_doctor() -> Report:
    checks = [check() for check in CHECKS]
    more, engine = engine_checks()
    checks.extend(more)
    checks.extend(kernel_checks(Path.cwd()))
    if os.environ.get("FLUFFY_RUNTIME") and engine is None:
        checks[-1].detail += f" (FLUFFY_RUNTIME={os.environ['FLUFFY_RUNTIME']})"
    return Report(checks, engine)
