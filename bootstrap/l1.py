"""The L1 kernel container: hard-coded security flags, sibling-ready mounts, ping."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

from fluffy.bootstrap.engine import Engine
from fluffy.errors import EngineError
from fluffy.gate import wire

KERNEL_UID = 10000  # used when the host user is root: the kernel never runs as root
# A root-owned project: the kernel (uid 10000) holds these and nothing else, to read it,
# write it and keep its owner; setpriv drops to 10000 before python starts.  No CAP_FOWNER
# (ADR-053): it sets a file's mode while the file is its own, then gives it away, and a
# chown clears S_ISUID/S_ISGID, so it cannot make a setuid-root file.
FILE_CAPS = ("dac_override", "chown")
ROLE_LABEL, PROJECT_LABEL = "fluffy.role", "fluffy.project"

# Constant: never derived from configuration (design: hard-coded security flags).
SECURITY: dict[str, Any] = {
    "CapDrop": ["ALL"],
    "SecurityOpt": ["no-new-privileges:true"],
    "ReadonlyRootfs": True,
    "Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=64m"},  # noqa: S108 (a private tmpfs)
    "Memory": 1024 * 1024 * 1024, "MemorySwap": 1024 * 1024 * 1024, "PidsLimit": 256,
    # none (and NetworkDisabled in spec(): only lo, without the engine's network set-up,
    # ADR-009): the kernel's CONNECT proxy reaches allow-listed hosts only through the gate's
    # dialler on the host (fluffy.gate.net; ADR-036); sandboxes are --network none too
    "NetworkMode": "none", "Privileged": False,
    "NanoCpus": min(4, os.cpu_count() or 1) * 10**9,  # a runaway kernel leaves the host CPU
}  # fmt: skip
ENTRYPOINT = ["python3", "-I", "-m", "fluffy.kernel"]  # -I: only fluffy's own modules
INSIDE = "/fluffy"  # where L1 sees the project, its socket folder and its state
#: fluffy.seccomp's reviewed profile for L1 itself (ADR-053), its fchown owner -1:-1
PROFILE = Path(__file__).resolve().parents[1] / "seccomp" / "generated" / "l1" / "kernel.json"


def kernel_user(project: str) -> str:
    """The kernel's user, never root: the caller's; under root the project's owner."""
    # (the merge writes the project as its owner), or KERNEL_UID for a root-owned project
    if os.getuid() != 0:
        return f"{os.getuid()}:{os.getgid()}"
    owner = Path(project).stat()
    return f"{owner.st_uid}:{owner.st_gid}" if owner.st_uid else f"{KERNEL_UID}:{KERNEL_UID}"


# L1's SecurityOpt: no-new-privileges and its own seccomp profile (no setuid, setgid or
# sticky modes, devices, symlinks; fchown only to the project's owner, the one rule that
# depends on the project).  Podman's compatible API reads a profile from a file only: one
# beside the project's folder (``base``), which L1 does not mount.
def security_opt(project: str, base: Path, kind: str) -> list[str]:
    profile, owner = json.loads(PROFILE.read_text()), Path(project).stat()
    for arg in next(e for e in profile["syscalls"] if e["names"] == ["fchown"])["args"]:
        arg["valueTwo"] = (owner.st_uid, owner.st_gid)[arg["index"] - 1]
    text, path = json.dumps(profile), base.parent / f"{base.name}.seccomp.json"
    if kind == "podman":
        path.write_text(text)
    return [*SECURITY["SecurityOpt"], f"seccomp={path if kind == 'podman' else text}"]


def spec(
    image: str,
    project: str,
    project_id: str,
    run_dir: str,
    state_dir: str,
    engine: Engine,
    plugins: str | None = None,
) -> dict[str, Any]:
    """The create body of L1 for ``project``."""
    # Mounts sit at fixed paths inside L1 (a host path under /root would be unreachable for
    # the non-root kernel); the host paths are passed on for the sibling sandboxes' bind
    # mounts, which the engine resolves on the host.
    I = INSIDE  # noqa: E741
    # no engine socket: the engine only through the gate (fluffy.gate), read-only
    gate = str(Path(run_dir).parent / "gate")
    binds = [f"{project}:{I}/project:rw", f"{run_dir}:{I}/run:rw", f"{state_dir}:{I}/state:rw",
             f"{gate}:{I}/gate:ro"]  # fmt: skip
    # git on the host runs what .git/config and .git/hooks name: L1 may only read them
    git = Path(project, ".git")
    binds += [f"{git}/{n}:{I}/project/.git/{n}:ro" for n in ("config", "hooks")
              if git.is_dir() and not git.is_symlink() and (git / n).exists()
              and not (git / n).is_symlink()]  # fmt: skip
    # a developer's setting (the tests'): the kernel type-checks every syscall result
    env = ["FLUFFY_CHECK_RESULTS=1"] if os.environ.get("FLUFFY_CHECK_RESULTS") == "1" else []
    if plugins is not None:  # the plugin store, read-only: the kernel re-checks its hashes
        Path(plugins).mkdir(mode=0o755, parents=True, exist_ok=True)
        binds.append(f"{plugins}:{INSIDE}/plugins:ro")
        env.append(f"FLUFFY_PLUGIN_STORE={INSIDE}/plugins")
    host = dict(SECURITY, Binds=binds, **wire.userns(engine.socket_path))  # rootless: keep-id
    host["SecurityOpt"] = security_opt(project, Path(run_dir).parent, engine.kind)
    user, entry = kernel_user(project), ENTRYPOINT
    if user == f"{KERNEL_UID}:{KERNEL_UID}" and os.getuid() == 0:  # a root-owned project
        caps = ",".join(["-all", *(f"+{c}" for c in FILE_CAPS)])
        entry = ["setpriv", f"--reuid={KERNEL_UID}", f"--regid={KERNEL_UID}", "--clear-groups",
                 f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}", "--",
                 *ENTRYPOINT]  # fmt: skip
        host["CapAdd"] = [c.upper() for c in (*FILE_CAPS, "setuid", "setgid", "setpcap")]
        user = "0:0"  # only setpriv runs as 0, for the moment it takes to drop to 10000
    cmd = f"serve --socket {I}/run/kernel.sock --state-dir {I}/state --project {I}/project"
    env += ["HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1", f"FLUFFY_ENGINE={engine.kind}",
            f"FLUFFY_ENGINE_SOCKET={I}/gate/engine.sock", "FLUFFY_ENGINE_GATE=1",
            f"FLUFFY_HOST_PROJECT={project}", f"FLUFFY_HOST_RUN={run_dir}",
            f"FLUFFY_HOST_STATE={state_dir}", f"FLUFFY_PROJECT_ID={project_id}"]  # fmt: skip
    labels = {ROLE_LABEL: "l1-kernel", PROJECT_LABEL: project_id, "fluffy.project_path": project}
    return {"Image": image, "Entrypoint": entry, "Cmd": cmd.split(), "User": user, "Env": env,
            "Labels": labels, "HostConfig": host, "NetworkDisabled": True}  # fmt: skip


def start(engine: Engine, body: dict[str, Any], name: str) -> str:
    remove(engine, name)
    created = engine.call("POST", f"/containers/create?name={name}", body)
    engine.call("POST", f"/containers/{created['Id']}/start")
    return str(created["Id"])


# engine.call, where an error naming one of ``ok`` (e.g. "404") is no error
def _call(engine: Engine, method: str, path: str, timeout: int, ok: tuple[str, ...]) -> None:
    try:
        engine.call(method, path, timeout=timeout)
    except EngineError as exc:
        if not any(code in exc.what.lower() for code in ok):
            raise


def remove(engine: Engine, name: str) -> None:
    _call(engine, "DELETE", f"/containers/{name}?force=true", 30, ("404", "no such"))


def running(engine: Engine, name: str) -> bool:
    try:
        state = engine.call("GET", f"/containers/{name}/json", timeout=10)["State"]
    except EngineError:
        return False
    return bool(state.get("Running"))


def logs(engine: Engine, name: str, tail: int = 15) -> str:
    """The end of L1's output ("" if it cannot be read): frames demultiplexed."""
    try:
        data = engine.call("GET", f"/containers/{name}/logs?stdout=1&stderr=1&tail={tail}",
                           timeout=10, raw=True)  # fmt: skip
    except EngineError:
        return ""
    out, i = [], 0
    while i + 8 <= len(data) and data[i] in (0, 1, 2) and data[i + 1 : i + 4] == b"\0\0\0":
        size = int.from_bytes(data[i + 4 : i + 8], "big")
        out.append(data[i + 8 : i + 8 + size])
        i += 8 + size
    return (b"".join(out) if out else data).decode(errors="replace").strip()


def stop(engine: Engine, name: str, timeout: int = 15) -> None:
    _call(engine, "POST", f"/containers/{name}/stop?t={timeout}", timeout + 15, ("304", "404"))


def _frame(sock: socket.socket, data: dict[str, Any]) -> None:
    payload = json.dumps(data).encode()
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def _read(sock: socket.socket) -> Any:
    def exactly(n: int, chunks: bytes = b"") -> bytes:
        while len(chunks) < n:
            if not (chunk := sock.recv(n - len(chunks))):
                raise OSError("the kernel closed the connection")
            chunks += chunk
        return chunks

    return json.loads(exactly(struct.unpack(">I", exactly(4))[0]))


def ping(socket_path: str, timeout: float = 2.0) -> dict[str, Any]:
    """Handshake + kernel.ping; the pong (raises OSError / ValueError when unhealthy)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        _frame(sock, {"type": "handshake", "plugin_name": "bootstrap", "plugin_version": "1",
                      "syscall_api_version": 1})  # fmt: skip
        if _read(sock).get("type") != "handshake_ack":
            raise ValueError("the kernel refused the handshake")
        for params in ({"figures": False}, None):  # None: a kernel image from before `figures`
            _frame(sock, {"id": "ping", "type": "request", "method": "kernel.ping",
                          "params": params})  # fmt: skip
            reply = _read(sock)
            if not (isinstance(reply, dict) and "figures" in str(reply.get("error"))):
                break
    result = reply.get("result") if isinstance(reply, dict) else None
    if not isinstance(result, dict):
        raise ValueError(f"unexpected ping answer: {reply!r}"[:200])
    return result
