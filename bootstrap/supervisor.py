"""L1's supervisor: start, health-check, witness, restart with backoff (design: Error Recovery).

One per project (a lock file).  Layout under ``$FLUFFY_HOME/projects/``::

    <id>/run/       the kernel's socket folder   (mounted into L1)
    <id>/gate/      the engine gate's socket      (read-only in L1; fluffy.gate)
    <id>.gate.log   what the gate refused L1
    <id>/state/     the kernel's databases        (mounted into L1)
    <id>.json       status: pid, container, health (L1 cannot write it)
    <id>.witness    the newest audit head seen in a pong (L1 cannot write it)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import fluffy.errors as errors
from fluffy.bootstrap import l1
from fluffy.bootstrap.engine import Engine, as_dict

MAX_RESTARTS, WINDOW_S, BACKOFF_S = 3, 300.0, (0.05, 1.0, 3.0)  # the first restart at once
PING_EVERY_S, PING_FAILURES, HEALTHY_WITHIN_S = 0.1, 3, 60.0


def project_id(project: str) -> str:
    return hashlib.sha256(project.encode()).hexdigest()[:12]


def paths(home: Path, project: str) -> dict[str, Path]:
    base = home / "projects" / project_id(project)
    files = {"status": ".json", "witness": ".witness", "lock": ".lock", "log": ".log"}
    return {"base": base, "run": base / "run", "gate": base / "gate", "state": base / "state",
            **{key: base.with_suffix(suffix) for key, suffix in files.items()}}  # fmt: skip


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _rows(db: Path, sql: str, *args: Any) -> list[Any]:  # read-only; none if unreadable
    with contextlib.suppress(sqlite3.Error), contextlib.closing(
        sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=2)
    ) as conn:  # fmt: skip
        return conn.execute(sql, args).fetchall()
    return []


def stored_hashes(state: Path, seq: int) -> set[str]:
    """The hashes stored for entry ``seq`` in the audit log and its archives (read-only)."""
    dbs = [state / "fluffy.db", *sorted((state / "audit-archive").glob("audit-*.db"))]
    return {r[0] for db in dbs for r in _rows(db, "SELECT hash FROM audit_log WHERE seq=?", seq)}


def final_head(state: Path) -> dict[str, Any]:
    """The newest entry a stopped kernel left in its log, as a pong names it."""
    sql = "SELECT json_object('chain_id', value, 'seq', seq, 'hash', hash) FROM audit_meta, "
    sql += "audit_log WHERE key='chain_id' ORDER BY seq DESC LIMIT 1"
    rows = _rows(state / "fluffy.db", sql)
    return {"audit_head": json.loads(rows[0][0]) if rows else None}


class Supervisor:
    def __init__(self, engine: Engine, project: str, home: Path, image: str) -> None:
        self.engine, self.project, self.image = engine, project, image
        # the plugins: installed third-party plugins, read-only in L1
        self.p, self.plugins = paths(home, project), home / "plugins"
        self.name = f"fluffy-kernel-{project_id(project)}"
        self.restarts: list[float] = []
        self.stopping = False
        self.status: dict[str, Any] = {"pid": os.getpid(), "project": project,
                                       "runtime": engine.kind, "container": self.name,
                                       "health": "starting", "restarts": 0}  # fmt: skip

    def stop_requested(self) -> bool:
        return self.stopping

    def lock(self) -> int:
        self.p["base"].parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.p["lock"], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise errors.KernelAlreadyRunning(f"a kernel for {self.project} is already supervised",
                why="", fix="Use `fluffy status`, or `fluffy stop` first.") from None  # fmt: skip
        return fd

    def prepare(self) -> None:
        owner = int(l1.kernel_user(self.project).split(":")[0])
        for key in ("base", "run", "state", "gate"):
            self.p[key].mkdir(parents=True, exist_ok=True, mode=0o700)
            if os.getuid() == 0:
                os.chown(self.p[key], owner, owner)
        if os.getuid() == 0:
            for path in self.p["state"].rglob("*"):
                with contextlib.suppress(FileNotFoundError):  # (a file the CLI replaced)
                    os.lchown(path, owner, owner)

    def save(self, **changes: Any) -> None:
        self.status.update(changes, updated_at=time.time())
        write_json(self.p["status"], self.status)

    def witness(self, pong: dict[str, Any]) -> None:
        """Keep the newest audit head if it extends the witnessed one (same chain, the
        witnessed entry unchanged); anything else is reported and never adopted."""
        head, seen = pong.get("audit_head"), read_json(self.p["witness"]) or {}
        if not isinstance(head, dict) or head == seen:
            return None
        seq, problem = seen.get("seq", 0), ""
        if seen and seen.get("chain_id") != head.get("chain_id"):
            problem = f"a new chain {head.get('chain_id')} replaced {seen.get('chain_id')}"
        elif seen and head.get("seq", 0) < seq:
            problem = f"the head went back: {head.get('seq')} < witnessed {seq}"
        elif seen and seen.get("hash") not in stored_hashes(self.p["state"], seq):
            problem = f"entry {seq} changed (or vanished) after it was witnessed"
        if problem:
            return self.save(
                warning=f"the kernel's audit log does not extend the witness: {problem}"
            )
        return write_json(self.p["witness"], head)

    def launch(self) -> None:
        body = l1.spec(self.image, self.project, project_id(self.project), str(self.p["run"]),
                       str(self.p["state"]), self.engine, str(self.plugins))  # fmt: skip
        container = l1.start(self.engine, body, self.name)
        self.save(container_id=container, health="starting", started_at=time.time())
        # the socket is tried every 2 ms (a refused connect costs microseconds); the
        # engine is asked whether L1 still runs every PING_EVERY_S, not at every try
        deadline = (checked := time.monotonic()) + HEALTHY_WITHIN_S
        while (now := time.monotonic()) < deadline and not self.stopping:
            try:
                pong = l1.ping(str(self.p["run"] / "kernel.sock"))
            except (OSError, ValueError):
                if now - checked >= PING_EVERY_S:
                    if not l1.running(self.engine, self.name):
                        break
                    checked = now
                time.sleep(0.002)
                continue
            self.save(health="healthy")  # what `fluffy start` waits for; then the witness,
            with contextlib.suppress(OSError):  # which the next health check retries
                self.witness(pong)
            return
        if not self.stop_requested():
            output = l1.logs(self.engine, self.name)
            self.save(last_output=output[-3000:])
            why = "its last output: " + (output[-1500:] or "(none)")
            raise errors.KernelStartFailed("the kernel did not answer", why=why, fix="")

    def restart(self, why: str) -> None:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < WINDOW_S] + [now]
        if len(self.restarts) > MAX_RESTARTS:
            output = self.status.get("last_output") or l1.logs(self.engine, self.name)
            error = errors.KernelCrashLoop(
                f"the kernel failed {len(self.restarts)} times within 5 minutes",
                why=f"last failure: {why}\nthe kernel's last output:\n{output[-1500:]}",
                fix=f"Read the kernel's output above (also in {self.p['log']}) and fix its cause.",
            )
            self.save(health="failed", error=as_dict(error))
            l1.remove(self.engine, self.name)
            raise error
        delay = BACKOFF_S[min(len(self.restarts) - 1, len(BACKOFF_S) - 1)]
        self.save(health="restarting", last_failure=why, restarts=self.status["restarts"] + 1)
        time.sleep(delay)
        if self.stop_requested():  # `fluffy stop` during a restart is a stop, not a crash
            return
        try:
            self.launch()
        except errors.FluffyError as exc:
            if not self.stop_requested():
                self.restart(exc.what)

    def run(self) -> None:
        from fluffy.gate.server import start_for  # (the CLI's readers of paths never serve)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "stopping", True))
        wake, poke = os.pipe2(os.O_NONBLOCK)  # a signal ends the wait below at once
        signal.set_wakeup_fd(poke)
        lock = self.lock()
        stopped = False
        try:
            self.prepare()
            root = int(l1.kernel_user(self.project).split(":")[0]) if os.getuid() == 0 else None
            gate = start_for(self.p["gate"], self.project, project_id(self.project),
                             self.engine.kind, self.engine.socket_path,
                             (self.p["run"], self.p["state"]), root)  # fmt: skip
            try:
                self.launch()
            except errors.FluffyError as exc:
                self.restart(exc.what)
            failures = 0
            while not self.stopping:
                select.select([wake], [], [], PING_EVERY_S)
                try:
                    self.witness(l1.ping(str(self.p["run"] / "kernel.sock")))
                    failures = 0
                except (OSError, ValueError) as exc:
                    failures += 1
                    if self.stop_requested():
                        break
                    if not l1.running(self.engine, self.name) or failures >= PING_FAILURES:
                        self.restart(f"health check failed: {exc}")
                        failures = 0
            self.save(health="stopping")
            l1.stop(self.engine, self.name)  # SIGTERM: the kernel records kernel_shutdown
            stopped = True
            self.witness(final_head(self.p["state"]))  # the last entries too (ADR-054)
            self.p["status"].unlink(missing_ok=True)
        finally:
            if not stopped:  # an error ends the supervisor: never leave L1 unsupervised
                with contextlib.suppress(errors.EngineError):
                    l1.stop(self.engine, self.name)
            l1.remove(self.engine, self.name)
            gate.shutdown() if "gate" in locals() else None
            os.close(lock)
