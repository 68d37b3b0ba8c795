"""`fluffy doctor`'s kernel checks: reachable, L1 flags as hard-coded, socket modes, witness."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from fluffy.bootstrap import l1
from fluffy.bootstrap.engine import detect
from fluffy.bootstrap.supervisor import paths, read_json
from fluffy.doctor_report import Check
from fluffy.errors import FluffyError
from fluffy.paths import fluffy_home
from fluffy.seccomp.compile import to_oci
from fluffy.seccomp.kernel_profile import KERNEL_PROFILE


def _own_profile(options: object, project: Path) -> bool:
    """L1 runs under its own seccomp profile, fchown set to the project's owner (ADR-053):
    inline for Docker, a file the bootstrap wrote for Podman."""
    seccomp = [str(o)[8:] for o in options or [] if str(o).startswith("seccomp=")]  # type: ignore[attr-defined]
    owner = project.stat()
    try:
        given = [json.loads(s if s.startswith("{") else Path(s).read_text()) for s in seccomp]
    except (OSError, ValueError):
        return False
    return given == [to_oci(KERNEL_PROFILE, (owner.st_uid, owner.st_gid))]


def _flags(container: str, runtime: str, project: Path) -> Check:
    try:
        info = detect({"FLUFFY_RUNTIME": runtime}).call("GET", f"/containers/{container}/json")
    except FluffyError as exc:
        return Check(
            "L1 flags", "fail", exc.what, "Restart the kernel: `fluffy stop && fluffy start`."
        )
    host: dict[str, object] = info.get("HostConfig", {})
    user = str(info.get("Config", {}).get("User", ""))
    dropped = _drops_to_kernel_user(info, host) if user in ("0", "0:0", "root") else None
    wrong: list[str] = []
    for key, value in l1.SECURITY.items():
        actual = host.get(key)
        if key == "CapDrop":  # docker keeps ["ALL"]; podman lists every dropped capability
            listed = isinstance(actual, list) and len(actual) >= (5 if dropped else 10)
            same = (actual == value or listed) and (not host.get("CapAdd") or dropped is True)
        elif key == "SecurityOpt":  # podman reports "no-new-privileges" without ":true"
            have = {str(opt).removesuffix(":true") for opt in actual or []}  # type: ignore[attr-defined]
            same = {opt.removesuffix(":true") for opt in value} <= have
        elif isinstance(value, dict | list):
            same = set(value) <= set(actual or [])  # type: ignore[call-overload]
        else:
            same = actual == value
        if not same:
            wrong.append(key)
    if not user or (user.split(":")[0] in ("", "0", "root") and not dropped):
        wrong.append("User")
    if not _own_profile(host.get("SecurityOpt"), project):
        wrong.append("seccomp")
    if wrong:
        return Check(
            "L1 flags",
            "fail",
            f"differ from the hard-coded flags: {', '.join(wrong)}",
            "Something changed the kernel container; stop it and start fluffy again.",
        )
    return Check("L1 flags", "ok", f"{len(l1.SECURITY) + 1} hard-coded flags as expected ({user})")


def _drops_to_kernel_user(info: dict[str, object], host: dict[str, object]) -> bool:
    """A root-owned project's L1: setpriv drops to uid 10000 keeping only the file
    capabilities, and the container adds exactly those (plus what setpriv needs)."""
    config = info.get("Config") or {}
    raw = config.get("Entrypoint") if isinstance(config, dict) else None
    entry = raw.split() if isinstance(raw, str) else list(raw or [])  # podman: one string
    caps = ",".join(["-all", *(f"+{c}" for c in l1.FILE_CAPS)])
    wanted = {f"--reuid={l1.KERNEL_UID}", f"--regid={l1.KERNEL_UID}", f"--inh-caps={caps}",
              f"--ambient-caps={caps}", f"--bounding-set={caps}"}  # fmt: skip
    added = {str(c).upper().removeprefix("CAP_") for c in host.get("CapAdd") or []}  # type: ignore[attr-defined]
    allowed = {c.upper() for c in (*l1.FILE_CAPS, "setuid", "setgid", "setpcap")}
    return bool(entry) and entry[0] == "setpriv" and wanted <= set(entry) and added <= allowed


def _socket(run_dir: Path) -> Check:
    sock = run_dir / "kernel.sock"
    try:
        folder, socket_mode = (
            stat.S_IMODE(run_dir.stat().st_mode),
            stat.S_IMODE(sock.stat().st_mode),
        )
    except OSError as exc:
        return Check("kernel socket", "fail", str(exc), "Restart the kernel.")
    if folder & 0o077 or socket_mode & 0o077:
        return Check(
            "kernel socket",
            "fail",
            f"folder {folder:o}, socket {socket_mode:o}",
            "Only the owner may reach the kernel: restart it (0700 folder, 0600 socket).",
        )
    return Check("kernel socket", "ok", f"folder {folder:o}, socket {socket_mode:o} at {sock}")


def _witness(state: Path, witness: Path) -> Check:
    from fluffy.host.audit import read_head, verify

    try:
        head = read_head(witness)
    except ValueError as exc:
        return Check("audit witness", "fail", str(exc))
    report = verify(state, witness=head)
    if report.ok:
        return Check(
            "audit witness",
            "ok",
            f"the audit log agrees with the witness (entry {head.seq if head else '-'})",
        )
    problem = report.problem
    assert problem is not None
    return Check(
        "audit witness",
        "fail",
        f"{problem.kind} at entry {problem.seq}: {problem.detail}",
        "Run `fluffy audit verify --witness` and investigate before trusting the log.",
    )


def _gate(p: dict[str, Path]) -> Check:
    """The engine gate: its socket, and what it refused L1 (each one worth a look)."""
    import json

    if not (p["gate"] / "engine.sock").exists():
        return Check("engine gate", "fail", "no gate socket", "`fluffy stop && fluffy start`")
    try:
        lines = p["base"].with_suffix(".gate.log").read_text().splitlines()
    except OSError:
        lines = []
    refused = [json.loads(line) for line in lines if line.strip()]
    if not refused:
        return Check("engine gate", "ok", "L1 reaches the engine only through it; 0 refused")
    newest = refused[-3:]
    shown = "; ".join(f"{r.get('method')} {r.get('path')}: {r.get('why')}" for r in newest)
    return Check(
        "engine gate",
        "warn",
        f"refused {len(refused)} request(s) from L1; newest: {shown}",
        "The kernel never asks these: treat them as an attack on the kernel (read the "
        f"session's audit log) or report a bug. All of them: {p['base'].with_suffix('.gate.log')}",
        data={"refused": len(refused), "newest": newest},
    )


def kernel_checks(project: Path) -> list[Check]:
    from fluffy.ipc.client import SyncClient

    p = paths(fluffy_home(), str(project.resolve()))
    status = read_json(p["status"])
    if status is None:
        return [
            Check("kernel", "warn", f"not running for {project}", "Start it with `fluffy start`.")
        ]
    checks = []
    try:
        with SyncClient(str(p["run"] / "kernel.sock"), timeout=5) as client:
            pong = client.call("kernel.ping")
        checks.append(Check("kernel", "ok", f"reachable, version {pong.get('kernel_version')}"))
    except Exception as exc:  # any failure to reach it is the finding
        checks.append(
            Check("kernel", "fail", f"not reachable: {exc}", "`fluffy stop && fluffy start`")
        )
    checks.append(
        _flags(
            str(status.get("container_id") or status.get("container")),
            str(status.get("runtime")),
            project.resolve(),
        )
    )
    checks.append(_socket(p["run"]))
    checks.append(_gate(p))
    checks.append(_witness(p["state"], p["witness"]))
    if status.get("warning"):  # the bootstrap saw the log not extend its witness
        fix = "Run `fluffy audit verify` and investigate before trusting the log."
        checks.append(Check("audit head", "warn", str(status["warning"]), fix))
    return checks
